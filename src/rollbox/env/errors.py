"""Errors of the step-driven environment API (each a :class:`~rollbox.errors.RollboxError`).

::

    RollboxError
    ├── InvalidInputError (ValueError)
    │   └── InvalidActionError        a malformed action (not a string or a tool-call dict)
    │       └── UnknownToolError      a tool-call dict naming a tool the env does not have
    └── EnvStateError (RuntimeError)
        ├── NoEpisodeError            step/verify/fork before reset()
        ├── EpisodeDoneError          step after the episode ended (submit or verify)
        └── EnvClosedError            any use after close()

Each is raised before anything reaches the sandbox, so the episode is left as it was.
"""

from rollbox.errors import InvalidInputError, RollboxError


class InvalidActionError(InvalidInputError):
    """An action that is neither a shell command string nor a well-formed tool-call dict."""


class UnknownToolError(InvalidActionError):
    """A tool-call dict whose ``tool`` is not one of ``bash``, ``write_file``, ``read_file``,
    ``submit``."""


class EnvStateError(RollboxError, RuntimeError):
    """The env cannot do this in its current state."""


class NoEpisodeError(EnvStateError):
    """No episode is running: call ``reset()`` first."""


class EpisodeDoneError(EnvStateError):
    """The episode has ended (``submit`` or ``verify()``): call ``reset()`` for a new one."""


class EnvClosedError(EnvStateError):
    """The env was closed."""
