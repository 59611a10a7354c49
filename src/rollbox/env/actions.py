"""Actions an env accepts, parsed and checked before anything reaches the sandbox."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollbox.env.errors import InvalidActionError, UnknownToolError

TOOLS: dict[str, tuple[str, ...]] = {
    "bash": ("command",),
    "write_file": ("path", "content"),
    "read_file": ("path",),
    "submit": (),
}
"""Every tool and its required string arguments."""


@dataclass(frozen=True)
class Action:
    """One parsed action."""

    tool: str
    """``bash``, ``write_file``, ``read_file`` or ``submit``."""
    args: dict[str, str]
    """The tool's arguments (all strings)."""

    def describe(self) -> str:
        """A short text of the action, as stored in the trajectory."""
        if self.tool == "bash":
            return self.args["command"]
        if self.tool == "submit":
            return "submit"
        return f"{self.tool} {self.args['path']}"


def parse_action(action: Any) -> Action:
    """Parse a shell command string or a tool-call dict.

    Args:
        action: ``"ls /app"`` or ``{"tool": "bash", "command": ...}``,
            ``{"tool": "write_file", "path": ..., "content": ...}``,
            ``{"tool": "read_file", "path": ...}``, ``{"tool": "submit"}``.

    Returns:
        The parsed action.

    Raises:
        UnknownToolError: the dict names a tool that does not exist.
        InvalidActionError: anything else malformed (wrong type, a missing, extra or
            non-string argument, an empty command).
    """
    if isinstance(action, str):
        action = {"tool": "bash", "command": action}
    if not isinstance(action, dict):
        raise InvalidActionError(
            f"an action must be a shell command string or a tool-call dict, "
            f"got {type(action).__name__}",
            hint='e.g. "ls /app" or {"tool": "bash", "command": "ls /app"}',
        )
    tool = action.get("tool")
    if not isinstance(tool, str):
        raise InvalidActionError(
            "a tool-call dict needs a 'tool' key with a string value",
            hint=f"one of {', '.join(TOOLS)}",
        )
    if tool not in TOOLS:
        raise UnknownToolError(f"unknown tool {tool!r}", hint=f"use one of {', '.join(TOOLS)}")
    need = TOOLS[tool]
    extra = sorted(set(action) - {"tool", *need})
    if extra:
        raise InvalidActionError(
            f"tool {tool!r} takes no argument {', '.join(map(repr, extra))}",
            hint=f"its arguments: {', '.join(need) or 'none'}",
        )
    args: dict[str, str] = {}
    for key in need:
        value = action.get(key)
        if not isinstance(value, str):
            got = "missing" if key not in action else type(value).__name__
            raise InvalidActionError(
                f"tool {tool!r} needs a string {key!r} (got {got})",
                hint=f"its arguments: {', '.join(need)}",
            )
        args[key] = value
    if tool == "bash" and not args["command"].strip():
        raise InvalidActionError("empty shell command", hint="give a command to run")
    if "path" in args and not args["path"].startswith("/"):
        raise InvalidActionError(
            f"path {args['path']!r} is not absolute", hint="give a path starting with /"
        )
    return Action(tool, args)
