"""task.toml numbers: whatever number (nan, inf, negative, zero, huge, fractional) a numeric
field holds, the task either loads with usable values or fails with a TaskError naming the
field, never another exception (``1e308`` once became "internal error: OverflowError")."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollbox.errors import TaskError
from rollbox.models import LIMIT_CAPS, MAX_SECONDS, SandboxSpec
from rollbox.rollouts.runner import TTL_MARGIN_S
from rollbox.rollouts.tasks import load_task

# (table, key) of every numeric task.toml field
FIELDS = [
    ("agent", "timeout_sec"),
    ("verifier", "timeout_sec"),
    ("environment", "cpus"),
    ("environment", "memory_mb"),
    ("environment", "storage_mb"),
    ("environment", "memory"),
    ("environment", "storage"),
    ("rollbox", "attempts"),
    ("rollbox", "pass_threshold"),
]

numbers = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 0, 0.0, -1, 1e308, -1e308, 2**63 - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**63), 2**63 - 1),
)


def _toml(v: float) -> str:
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(v)


def _task(root: Path, table: str, key: str, value: float) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "instruction.md").write_text("do it\n")
    (root / "task.toml").write_text(f"[{table}]\n{key} = {_toml(value)}\n")
    return root


def _usable(task_dir: Path) -> None:
    """The loaded task's numbers work where the runner uses them."""
    task = load_task(task_dir)
    limits = task.limits()
    for t in (task.agent.timeout_sec, task.verifier.timeout_sec):
        assert math.isfinite(t) and 0 < t <= MAX_SECONDS
    # the runner's sandbox TTL and a timer of the agent's timeout must both be valid
    ttl = task.agent.timeout_sec + task.verifier.timeout_sec + TTL_MARGIN_S
    SandboxSpec(baseline="sha256:" + "0" * 64, limits=limits, ttl_s=ttl)
    loop = asyncio.new_event_loop()
    try:
        loop.call_later(task.agent.timeout_sec, lambda: None).cancel()
    finally:
        loop.close()
    if limits.cpus is not None:
        assert math.isfinite(limits.cpus)
    for name in ("memory_mb", "disk_mb"):
        v = getattr(limits, name)
        assert v is None or 0 < v <= LIMIT_CAPS[name]
    pt = task.rollbox.pass_threshold
    assert pt is None or math.isfinite(pt)


@pytest.mark.parametrize(("table", "key"), FIELDS, ids=lambda x: str(x))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=numbers)
def test_numbers_load_or_name_the_field(tmp_path: Path, table: str, key: str, value: float) -> None:
    d = _task(tmp_path / "t", table, key, value)
    try:
        _usable(d)
    except TaskError as exc:
        msg = exc.one_line()
        assert f"[{table}]" in msg and key in msg, msg
        assert "\n" not in msg


@pytest.mark.parametrize("value", ["1e308", "inf", "nan", "-1", "0", "1e12"])
@pytest.mark.parametrize("table", ["agent", "verifier"])
def test_bad_timeouts_are_task_errors(tmp_path: Path, table: str, value: str) -> None:
    d = tmp_path / "t"
    d.mkdir()
    (d / "instruction.md").write_text("do it\n")
    (d / "task.toml").write_text(f"[{table}]\ntimeout_sec = {value}\n")
    with pytest.raises(TaskError, match=rf"\[{table}\] timeout_sec"):
        load_task(d)


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("memory = inf", "memory"),
        ('memory = "99999999999T"', "memory must be 1 MiB to"),
        ("storage = nan", "storage"),
        ("storage_mb = -5", "storage_mb"),
        ("cpus = inf", "cpus"),
        ("memory_mb = 1e308", "memory_mb"),
    ],
)
def test_bad_sizes_are_task_errors(tmp_path: Path, line: str, field: str) -> None:
    d = tmp_path / "t"
    d.mkdir()
    (d / "instruction.md").write_text("do it\n")
    (d / "task.toml").write_text(f"[environment]\n{line}\n")
    with pytest.raises(TaskError, match=rf"\[environment\] {field}"):
        load_task(d)
