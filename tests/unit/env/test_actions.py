"""Action parsing: every malformed action is one clear error, before the sandbox sees it."""

from __future__ import annotations

from typing import Any

import pytest

from rollbox.env import Action, InvalidActionError, UnknownToolError, parse_action
from rollbox.errors import InvalidInputError, RollboxError


def test_string_is_a_bash_command() -> None:
    assert parse_action("ls /app") == Action("bash", {"command": "ls /app"})


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ({"tool": "bash", "command": "true"}, Action("bash", {"command": "true"})),
        (
            {"tool": "write_file", "path": "/a", "content": "x"},
            Action("write_file", {"path": "/a", "content": "x"}),
        ),
        ({"tool": "read_file", "path": "/a"}, Action("read_file", {"path": "/a"})),
        ({"tool": "submit"}, Action("submit", {})),
    ],
)
def test_tool_calls(action: dict[str, Any], expected: Action) -> None:
    assert parse_action(action) == expected


def test_unknown_tool() -> None:
    with pytest.raises(UnknownToolError, match=r"unknown tool 'rm_rf'.*use one of bash") as ei:
        parse_action({"tool": "rm_rf"})
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, RollboxError)
    assert ei.value.exit_code == 2


@pytest.mark.parametrize(
    ("action", "match"),
    [
        (42, "got int"),
        (["ls"], "got list"),
        ({"command": "ls"}, "needs a 'tool' key"),
        ({"tool": 3}, "needs a 'tool' key"),
        ({"tool": "bash"}, "needs a string 'command' \\(got missing\\)"),
        ({"tool": "bash", "command": ["ls"]}, "got list"),
        ({"tool": "bash", "command": "  "}, "empty shell command"),
        ({"tool": "write_file", "path": "/a"}, "'content'"),
        ({"tool": "read_file", "path": "rel/x"}, "not absolute"),
        ({"tool": "submit", "reward": 1}, "takes no argument 'reward'"),
    ],
)
def test_malformed(action: object, match: str) -> None:
    with pytest.raises(InvalidActionError, match=match) as ei:
        parse_action(action)
    assert not isinstance(ei.value, UnknownToolError)
    assert isinstance(ei.value, InvalidInputError)
    assert "\n" not in ei.value.one_line()
