"""Every command group is mounted; a missing group module is an error, not a silent skip."""

from __future__ import annotations

import pytest
import typer

from rollbox.cli.main import _GROUPS, CliGroupMissingError, _mount_groups, app


def test_every_listed_group_is_offered() -> None:
    names = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    assert {"baseline", "sandbox", "run", "runs", "repro", "cleanup", "pilot", "audit"} <= names
    assert {"doctor", "version"} <= names
    assert len(_GROUPS) == 8


def test_missing_group_module_is_a_clear_error() -> None:
    target = typer.Typer()
    with pytest.raises(CliGroupMissingError, match=r"rollbox\.cli\.nosuchgroup is missing .*"):
        _mount_groups(target, [("rollbox.cli.doctor", None), ("rollbox.cli.nosuchgroup", None)])


def test_missing_dependency_of_a_group_keeps_its_own_error() -> None:
    # The group's module exists only if its package does; an absent import *inside* a group is
    # reported by its own name (rollbox_test_no_such_pkg), not as a missing group.
    with pytest.raises(ModuleNotFoundError) as info:
        _mount_groups(typer.Typer(), [("rollbox_test_no_such_pkg.group", None)])
    assert not isinstance(info.value, CliGroupMissingError)
    assert info.value.name == "rollbox_test_no_such_pkg"
