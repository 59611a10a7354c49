"""One exec preparation for every backend: argv, environment, user, cwd, timeout, secrets.

Each backend turns a :meth:`SandboxHandle.exec` call into a :class:`PreparedExec` here,
then only transports it (agent socket, runsc, virtio-serial). So an exec sees the same
environment on every backend, pinned by the ``exec-environment`` conformance check:

- ``PATH`` (:data:`DEFAULT_PATH`), ``HOME`` (the user's home from the sandbox's
  ``/etc/passwd``; ``/root`` for root, ``/`` for a uid without an entry) and ``HOSTNAME``
  (the sandbox's hostname) are defaults;
- the image's ``ENV``, then the sandbox's ``env``, then the exec's ``env``, then its
  ``secrets`` override them, in that order;
- the user is the exec's, else the sandbox's, else the image's ``USER``, else root;
- the cwd is the exec's, else the sandbox's ``workdir``, else the image's ``WORKDIR``,
  else ``/``; relative paths are taken from ``/``, and it is normalised lexically;
- a ``timeout`` must be > 0 (``None``: no timeout).

:func:`map_exec_error` turns the stage at which a command could not start (as the agents
report it) into the one rollbox exception every backend raises for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollbox.backends.base import command_argv
from rollbox.backends.common.paths import normalize
from rollbox.errors import BackendError, InvalidInputError, RollboxError
from rollbox.models import SandboxInfo

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROOT_NAMES = ("", "root", "0", "0:0")


@dataclass(frozen=True)
class ResolvedUser:
    """Who a command runs as, resolved against the sandbox's ``/etc/passwd``."""

    spec: str
    """The user as asked (``name``, ``uid``, ``name:gid``, ...; ``""`` for root)."""
    uid: int | None
    """The uid, or ``None`` for root as the sandbox runs it."""
    gid: int
    """The primary gid."""
    home: str
    """The home directory (``HOME``)."""


@dataclass(frozen=True)
class PreparedExec:
    """An exec request, checked and resolved; the backend only transports it."""

    argv: list[str]
    """The command (a string command becomes ``/bin/sh -c``)."""
    env: dict[str, str]
    """The full environment the command sees."""
    cwd: str
    """Its absolute working directory."""
    user: ResolvedUser
    """Who it runs as."""
    timeout: float | None
    """Seconds before its tree is killed (> 0), or ``None``."""
    stdin: bytes | None
    """Bytes for its stdin, or ``None`` for an empty stdin."""
    secret_values: list[str] = field(default_factory=list)
    """Values to mask in its captured output."""


def effective_user(info: SandboxInfo, user: str | None) -> str:
    """The user an exec runs as: the exec's, else the sandbox's, else the image's."""
    if user is not None:
        return user
    if info.spec.user is not None:
        return info.spec.user
    return str(info.extra.get("image_user") or "")


def is_root(user: str) -> bool:
    """Whether ``user`` means root (no ``/etc/passwd`` lookup needed)."""
    return user in ROOT_NAMES


def user_files(info: SandboxInfo, user: str | None) -> tuple[str, ...]:
    """The sandbox files :func:`prepare_exec` needs to resolve ``user``: none for root,
    ``/etc/passwd``, and ``/etc/group`` for a group given by name."""
    who = effective_user(info, user)
    if is_root(who):
        return ()
    grp = who.partition(":")[2]
    return ("/etc/passwd", "/etc/group") if grp and not grp.isdigit() else ("/etc/passwd",)


def resolve_user(user: str, passwd: str | None, group: str | None = None) -> ResolvedUser:
    """Resolve ``user`` (``name``/``uid`` with an optional ``:group``) like ``docker exec -u``.

    Args:
        user: the user as asked; ``""``/``root``/``0`` is root.
        passwd: the text of the sandbox's ``/etc/passwd`` (``None``: unreadable).
        group: the text of its ``/etc/group``, needed only for a group given by name.

    Raises:
        InvalidInputError: a user name or group name the sandbox does not know.
    """
    if is_root(user):
        return ResolvedUser(user, None, 0, "/root")
    name, _, grp = user.partition(":")
    uid: int | None = None
    gid = -1
    home = "/"
    for line in (passwd or "").splitlines():
        entry = line.split(":")
        if len(entry) < 7:
            continue
        named = entry[0] == name or (name.isdigit() and entry[2] == name)
        if named and entry[2].isdigit() and entry[3].isdigit():
            uid, gid, home = int(entry[2]), int(entry[3]), entry[5] or "/"
            break
    if uid is None:
        if not name.isdigit():
            raise InvalidInputError(
                f"no user {name!r} in the sandbox's /etc/passwd", hint="use a numeric uid"
            )
        uid = gid = int(name)
    if grp:
        gid = _group_id(grp, group, user)
    return ResolvedUser(user, uid, gid, home)


def _group_id(grp: str, group_text: str | None, user: str) -> int:
    if grp.isdigit():
        return int(grp)
    for line in (group_text or "").splitlines():
        entry = line.split(":")
        if len(entry) >= 3 and entry[0] == grp and entry[2].isdigit():
            return int(entry[2])
    raise InvalidInputError(
        f"no group {grp!r} in the sandbox's /etc/group (user {user!r})",
        hint="use a numeric gid",
    )


def base_env(info: SandboxInfo, home: str) -> dict[str, str]:
    """The defaults, then the image's ``ENV``, then the sandbox's ``env``."""
    env = {"PATH": DEFAULT_PATH, "HOME": home, "HOSTNAME": info.spec.hostname}
    image_env = info.extra.get("image_env")
    if isinstance(image_env, list):
        for item in image_env:
            k, sep, v = str(item).partition("=")
            if sep:
                env[k] = v
    env.update(info.spec.env)
    return env


def check_timeout(timeout: float | None) -> float | None:
    """``timeout`` if it is ``None`` or > 0.

    Raises:
        InvalidInputError: ``timeout <= 0`` (or NaN).
    """
    if timeout is not None and not timeout > 0:
        raise InvalidInputError(f"timeout must be > 0 (got {timeout!r})")
    return timeout


def exec_cwd(info: SandboxInfo, cwd: str | None) -> str:
    """The exec's working directory, absolute and normalised."""
    raw = cwd or info.spec.workdir or str(info.extra.get("image_workdir") or "/")
    return "/" + normalize(raw)


def prepare_exec(
    info: SandboxInfo,
    cmd: list[str] | str,
    *,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    secrets: dict[str, str] | None = None,
    stdin: bytes | str | None = None,
    timeout: float | None = None,
    user: str | None = None,
    passwd: str | None = None,
    group: str | None = None,
) -> PreparedExec:
    """Check and resolve one exec; see :meth:`SandboxHandle.exec` for the arguments.

    Args:
        info: the sandbox's record (spec, image ``ENV``/``USER``/``WORKDIR``).
        cmd: the command.
        cwd: its working directory.
        env: its extra environment.
        secrets: environment values masked in its output.
        stdin: its stdin.
        timeout: its timeout.
        user: who it runs as.
        passwd: the sandbox's ``/etc/passwd`` text; read it only when
            ``not is_root(effective_user(info, user))``.
        group: the sandbox's ``/etc/group`` text, for a group given by name.

    Raises:
        InvalidInputError: an empty command, ``timeout <= 0``, an unknown user or a bad cwd.
        PathEscapeError: the cwd climbs above ``/``.
    """
    argv = command_argv(cmd)
    check_timeout(timeout)
    who = resolve_user(effective_user(info, user), passwd, group)
    full_env = base_env(info, who.home)
    full_env.update(env or {})
    full_env.update(secrets or {})
    return PreparedExec(
        argv=argv,
        env=full_env,
        cwd=exec_cwd(info, cwd),
        user=who,
        timeout=timeout,
        stdin=stdin.encode() if isinstance(stdin, str) else stdin,
        secret_values=[v for v in (secrets or {}).values() if v],
    )


def map_exec_error(
    stage: str | None, message: str, *, sandbox_id: str, prepared: PreparedExec
) -> RollboxError | None:
    """The rollbox exception for a command that could not start at ``stage``.

    Stages (the agents' names): ``chdir``, ``user`` (also ``setid``) and ``cgroup``,
    ``private mounts``, ``restrict``, ``agent`` (the guest agent refused the request).
    ``None``, ``exec`` (the program could not be run: a result with exit code 126/127
    and the reason on stderr, as a shell gives) and unknown stages return ``None``.

    Args:
        stage: the failed stage, or ``None`` when the command started.
        message: the agent's reason.
        sandbox_id: for the message.
        prepared: the exec that failed.
    """
    if stage == "chdir":
        return InvalidInputError(f"working directory {prepared.cwd!r} in the sandbox: {message}")
    if stage in ("user", "setid"):
        return InvalidInputError(f"cannot switch to user {prepared.user.spec!r}: {message}")
    if stage == "cgroup":
        return BackendError(
            f"sandbox {sandbox_id}: the command could not join its cgroup: {message}"
        )
    if stage in ("private mounts", "restrict", "agent"):
        return BackendError(f"sandbox {sandbox_id}: {stage}: {message}")
    return None


__all__ = [
    "DEFAULT_PATH",
    "PreparedExec",
    "ResolvedUser",
    "base_env",
    "check_timeout",
    "effective_user",
    "exec_cwd",
    "is_root",
    "map_exec_error",
    "prepare_exec",
    "resolve_user",
    "user_files",
]
