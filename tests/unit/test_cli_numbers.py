"""Every numeric option of the CLI refuses a bad value (nan, inf, negative, zero where it
means nothing, huge, not a number) with exit 2 and one line on stderr, never a traceback.

The commands run in-process through ``rollbox.cli.main.main`` (what the ``rollbox`` script
calls); the checks fire while the command line is parsed, so nothing starts.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollbox.cli import validate
from rollbox.cli.main import main
from rollbox.models import LIMIT_CAPS, MAX_CPUS, MAX_SECONDS, MAX_TTL_S


@dataclass(frozen=True)
class NumOpt:
    """One numeric option: where it goes on a command line and what it accepts."""

    argv: tuple[str, ...]
    """The command line, with ``{}`` where the value goes."""
    kind: type
    """``int`` or ``float``."""
    lo: float
    """Smallest accepted value."""
    hi: float
    """Largest accepted value."""
    lo_open: bool = False
    """``lo`` itself is refused (``> 0`` rather than ``>= 0``)."""


OPTIONS = [
    NumOpt(("sandbox", "create", "--ttl", "{}"), float, 0, MAX_TTL_S, lo_open=True),
    NumOpt(("sandbox", "create", "--cpus", "{}"), float, 0, MAX_CPUS, lo_open=True),
    NumOpt(("sandbox", "create", "--memory-mb", "{}"), int, 1, LIMIT_CAPS["memory_mb"]),
    NumOpt(("sandbox", "create", "--disk-mb", "{}"), int, 1, LIMIT_CAPS["disk_mb"]),
    NumOpt(("sandbox", "create", "--pids", "{}"), int, 1, LIMIT_CAPS["pids"]),
    NumOpt(
        ("sandbox", "exec", "sbx-x", "--timeout", "{}", "--", "true"),
        float,
        0,
        MAX_SECONDS,
        lo_open=True,
    ),
    NumOpt(("sandbox", "fork", "sbx-x", "-n", "{}"), int, 1, validate.MAX_FORKS),
    NumOpt(("run", "--attempts", "{}", "nowhere"), int, 1, validate.MAX_COUNT),
    NumOpt(("run", "--concurrency", "{}", "nowhere"), int, 1, validate.MAX_CONCURRENCY),
    NumOpt(("run", "--retries", "{}", "nowhere"), int, 0, 10),
    NumOpt(("run", "--seed", "{}", "nowhere"), int, -(2**63), 2**63 - 1),
    NumOpt(("run", "--max-rollouts", "{}", "nowhere"), int, 1, validate.MAX_COUNT * 1000),
    NumOpt(("repro", "run-x", "--concurrency", "{}"), int, 1, validate.MAX_CONCURRENCY),
    NumOpt(("runs", "ls", "--limit", "{}"), int, 1, math.inf),
    NumOpt(("pilot", "--rollouts", "{}"), int, 1, 100_000),
    NumOpt(("pilot", "--retries", "{}"), int, 0, 10),
    NumOpt(("pilot", "--raw-samples", "{}"), int, 0, 100_000),
    NumOpt(("audit", "--cycles", "{}"), int, 0, validate.MAX_COUNT),
    NumOpt(("audit", "--k", "{}"), int, 1, 1000),
]


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """Run the CLI in-process; return (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["rollbox", *argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = old
    return code, out.getvalue(), err.getvalue()


def _float_text(x: float) -> str:
    return repr(x) if math.isfinite(x) else str(x)


def bad_values(opt: NumOpt) -> st.SearchStrategy[str]:
    """Text a user could type that ``opt`` must refuse."""
    garbage = st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "abc", "", "1e", "0x"])
    strategies: list[st.SearchStrategy[str]] = [garbage]
    if opt.kind is float:
        below = st.floats(max_value=opt.lo, allow_nan=False, allow_infinity=True)
        if not opt.lo_open:
            below = below.filter(lambda x: x < opt.lo)
        above = st.floats(min_value=opt.hi, allow_nan=False).filter(lambda x: x > opt.hi)
        strategies += [below.map(_float_text), above.map(_float_text)]
    else:
        strategies.append(st.integers(max_value=int(opt.lo) - 1).map(str))
        if math.isfinite(opt.hi):
            strategies.append(st.integers(min_value=int(opt.hi) + 1).map(str))
        # a fraction or an exponent is not an integer
        strategies.append(
            st.floats(allow_nan=False, allow_infinity=False)
            .filter(lambda x: not x.is_integer())
            .map(repr)
        )
        strategies.append(st.sampled_from(["1e308", "1.5", "10**9"]))
    return st.one_of(strategies)


def assert_one_line_exit_2(argv: list[str]) -> None:
    code, out, err = run_main(argv)
    assert code == 2, (argv, code, out, err)
    assert "Traceback" not in err + out, (argv, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLBOX_HOME", str(tmp_path / "home"))


@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: " ".join(o.argv[:2]) + " " + o.argv[2])
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_bad_numbers_are_one_line_and_exit_2(opt: NumOpt, data: st.DataObject) -> None:
    value = data.draw(bad_values(opt), label="value")
    argv = [value if a == "{}" else a for a in opt.argv]
    # "--opt=VALUE" so that a value starting with "-" is not read as another option
    i = argv.index(value)
    argv[i - 1 : i + 1] = (
        [f"{argv[i - 1]}={value}"]
        if argv[i - 1].startswith("--")
        else [
            argv[i - 1],
            value,
        ]
    )
    assert_one_line_exit_2(argv)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["sandbox", "create", "--ttl", "nan"], "--ttl must be a number > 0"),
        (["sandbox", "create", "--ttl", "inf"], "--ttl must be a number > 0"),
        (["sandbox", "create", "--cpus", "nan"], "--cpus must be a number > 0"),
        (["sandbox", "exec", "sbx-x", "--timeout", "1e308", "--", "true"], "--timeout must"),
        (["run", "--attempts", "0", "nowhere"], "--attempts must be at least 1, got 0"),
        (["run", "--retries", "11", "nowhere"], "--retries must be at most 10, got 11"),
        (["sandbox", "create", "--pids", "many"], "Invalid value for '--pids'"),
        (["no-such-command"], "No such command"),
    ],
)
def test_the_line_names_the_option(argv: list[str], needle: str) -> None:
    code, _out, err = run_main(argv)
    assert code == 2
    assert err.count("\n") == 1 and needle in err, err


def test_json_mode_error_is_one_document() -> None:
    code, out, err = run_main(["sandbox", "create", "--ttl", "inf", "--json"])
    assert code == 2 and err == ""
    doc = json.loads(out)
    assert doc["exit_code"] == 2 and "--ttl" in doc["error"]


def test_good_values_pass_the_callbacks() -> None:
    # the checks must not refuse what is valid (the bounds themselves included)
    assert validate.ttl()(MAX_TTL_S) == MAX_TTL_S
    assert validate.seconds("--timeout")(0.001) == 0.001
    assert validate.cpus()(0.5) == 0.5
    assert validate.limit("--pids", "pids")(LIMIT_CAPS["pids"]) == LIMIT_CAPS["pids"]
    assert validate.int_range("--retries", 0, 10)(0) == 0
    assert validate.seed()(-(2**63)) == -(2**63)
    assert validate.cpus()(None) is None


def test_help_and_version_still_exit_0() -> None:
    assert run_main(["version"])[0] == 0
    code, out, _ = run_main(["--help"])
    assert code == 0 and "Usage" in out


# numbers inside string options: pilot workloads and levels, network allow-list ports
EMBEDDED = [
    (("pilot", "--workload", "sleep:{}"), 0, 3600),
    (("pilot", "--workload", "cpu:{}"), 0, 3600),
    (("pilot", "--workload", "disk:{}"), 0, 3600),
    (("pilot", "--concurrency", "1,{}"), 1, 1024),
    (("sandbox", "create", "--network", "allow=127.0.0.1:{}"), 1, 65535),
]


@pytest.mark.parametrize(("argv", "lo", "hi"), EMBEDDED, ids=lambda x: str(x))
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_bad_numbers_inside_options_are_one_line(
    argv: tuple[str, ...], lo: int, hi: int, data: st.DataObject
) -> None:
    value = data.draw(
        st.one_of(
            st.sampled_from(["nan", "inf", "-inf", "-1", "1e308", "", "x"]),
            st.integers(max_value=lo - 1).map(str),
            st.integers(min_value=hi + 1).map(str),
            st.floats(min_value=hi, allow_nan=False).filter(lambda x: x > hi).map(_float_text),
        ),
        label="value",
    )
    assert_one_line_exit_2([a.replace("{}", value) for a in argv])
