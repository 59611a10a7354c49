"""The foundation: ids, error tree, models, CLI conventions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from rollbox import errors
from rollbox.config import Home
from rollbox.ids import is_id, new_id, ulid
from rollbox.models import HostPort, Limits, NetworkPolicy, SandboxSpec


def test_ulid_is_sortable_and_unique() -> None:
    ids = [ulid() for _ in range(200)]
    assert len(set(ids)) == 200
    assert all(len(i) == 26 for i in ids)
    assert is_id(new_id("sbx"), "sbx")
    assert not is_id("sbx-UPPER", "sbx")
    assert not is_id(new_id("ro"), "sbx")


def test_error_exit_codes_and_builtins() -> None:
    assert errors.InvalidDigestError("x").exit_code == 2
    assert errors.BuildError("x").exit_code == 1
    assert isinstance(errors.ExecTimeoutError("t"), TimeoutError)
    assert isinstance(errors.PathEscapeError("p"), PermissionError)
    assert isinstance(errors.BaselineNotFoundError("b"), LookupError)
    assert errors.RollboxError("a", hint="do b").one_line() == "a (do b)"


def test_models_forbid_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        SandboxSpec(baseline="x", bogus=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        Limits(memory_mb=0)
    assert HostPort.parse("127.0.0.1:8080").port == 8080
    with pytest.raises(ValueError):
        HostPort.parse("nope")
    assert NetworkPolicy().mode == "none"


def test_home_tag_differs_per_home(tmp_path: object) -> None:
    assert Home.from_env().tag != Home(Home.from_env().root / "x").tag


def test_cli_version_json() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rollbox.cli.main", "version", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout)["version"]


def test_cli_unknown_command_exits_2() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rollbox.cli.main", "no-such-command"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
