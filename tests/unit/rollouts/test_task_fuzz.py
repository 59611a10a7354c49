"""Fuzz the task loader: whatever task.toml / instruction.md hold, only TaskError escapes."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollbox.errors import TaskError
from rollbox.rollouts.tasks import load_task

KEYS = [
    "timeout_sec", "env", "environment_mode", "cpus", "memory_mb", "memory", "storage_mb",
    "storage", "network_mode", "allowed_hosts", "workdir", "backend", "attempts", "group_mode",
    "pass_threshold", "name", "docker_image", "baseline",
]  # fmt: skip
TABLES = ["task", "metadata", "agent", "verifier", "environment", "rollbox"]

scalars = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.booleans(),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)
    ),
    max_leaves=6,
)


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(str(v), repr(v))
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"


structured = st.builds(
    lambda top, tables: "\n".join(
        [f"{k} = {_toml_value(v)}" for k, v in top.items()]
        + [
            f"[{t}]\n" + "\n".join(f"{k} = {_toml_value(v)}" for k, v in body.items())
            for t, body in tables.items()
        ]
    ),
    st.dictionaries(st.sampled_from(["artifacts", "version", *TABLES]), values, max_size=3),
    st.dictionaries(
        st.sampled_from(TABLES), st.dictionaries(st.sampled_from(KEYS), values, max_size=4)
    ),
)


def _check(toml: str | bytes, instruction: bytes) -> None:
    d = Path(tempfile.mkdtemp(prefix="fuzz-task-"))
    try:
        (d / "instruction.md").write_bytes(instruction)
        if isinstance(toml, str):
            (d / "task.toml").write_text(toml, encoding="utf-8", errors="surrogatepass")
        else:
            (d / "task.toml").write_bytes(toml)
        try:
            task = load_task(d)
        except TaskError as exc:
            assert exc.one_line()
        else:
            assert task.digest.startswith("sha256:")
            task.limits()
            task.network()
    finally:
        shutil.rmtree(d)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(structured, st.binary(max_size=40))
def test_structured_task_toml_only_raises_task_error(toml: str, instruction: bytes) -> None:
    _check(toml, instruction)


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_arbitrary_bytes_only_raise_task_error(toml: str | bytes) -> None:
    _check(toml, b"x")
