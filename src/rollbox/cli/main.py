"""Entry point of the ``rollbox`` command.

Command groups live in their own modules (``rollbox.cli.<group>``) and each exposes either
``app`` (a ``typer.Typer`` mounted as a sub-command group) or ``register(app)`` (adds
top-level commands). Every group listed in ``_GROUPS`` is part of rollbox: one that cannot be
imported is a broken installation and an error naming the module, never a command that quietly
disappears.
"""

from __future__ import annotations

import importlib
import json
import sys

import typer

from rollbox import __version__
from rollbox.errors import RollboxError

app = typer.Typer(
    name="rollbox",
    help="Fresh, isolated, restorable environments for parallel agent rollouts.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Fresh, isolated, restorable environments for parallel agent rollouts."""


# (module, sub-command name or None for top-level commands)
_GROUPS: list[tuple[str, str | None]] = [
    ("rollbox.cli.baseline", "baseline"),
    ("rollbox.cli.sandbox", "sandbox"),
    ("rollbox.cli.cleanup", None),
    ("rollbox.cli.run", None),
    ("rollbox.cli.runs", None),
    ("rollbox.cli.pilot", None),
    ("rollbox.cli.audit", None),
    ("rollbox.cli.doctor", None),
]


@app.command("version")
def version_cmd(json_: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Print rollbox's version."""
    if json_:
        print(json.dumps({"version": __version__}))
    else:
        print(f"rollbox {__version__}")


class CliGroupMissingError(ImportError):
    """A command group module listed in ``_GROUPS`` is not in this installation."""


def _mount_groups(target: typer.Typer, groups: list[tuple[str, str | None]]) -> None:
    """Mount every group on ``target``.

    Raises:
        CliGroupMissingError: a group's module is missing (a broken or partial install).
    """
    for module_name, sub in groups:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise  # a dependency of the group is missing: its own message says which
            raise CliGroupMissingError(
                f"rollbox's command module {module_name} is missing from this installation "
                f"({__file__}); reinstall rollbox (pip install --force-reinstall rollbox)",
                name=module_name,
            ) from exc
        if sub is not None:
            target.add_typer(module.app, name=sub)
        else:
            module.register(target)


_mount_groups(app, _GROUPS)


def main() -> None:
    """Run the CLI: a ``RollboxError`` becomes one line and its exit code, no traceback."""
    json_mode = "--json" in sys.argv
    try:
        # not standalone: click's usage errors come back here and are printed as one line
        code = app(standalone_mode=False)
    except typer.TyperException as exc:  # click's usage errors: bad option value, unknown command
        message = exc.format_message() if hasattr(exc, "format_message") else exc.message
        _one_line(str(message), "UsageError", exc.exit_code, json_mode)
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    except RollboxError as exc:
        if json_mode:
            doc = {"error": exc.one_line(), "type": type(exc).__name__, "exit_code": exc.exit_code}
            sys.stdout.write(json.dumps(doc) + "\n")
        else:
            sys.stderr.write(f"error: {exc.one_line()}\n")
            output = getattr(exc, "output", "")
            if output:
                sys.stderr.write(output.rstrip("\n")[-8000:] + "\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    # a typer.Exit(N) (or ctx.exit) raised by a command comes back as its code
    if isinstance(code, int) and not isinstance(code, bool) and code != 0:
        sys.exit(code)


def _one_line(message: str, kind: str, exit_code: int, json_mode: bool) -> None:
    line = " ".join(message.split())  # click may wrap a long message
    if json_mode:
        sys.stdout.write(json.dumps({"error": line, "type": kind, "exit_code": exit_code}) + "\n")
    else:
        sys.stderr.write(f"error: {line}\n")


if __name__ == "__main__":
    main()
