"""Probe verdicts on scripted sandbox answers (no root, no sandbox): a probe whose
precondition fails reports an error, never a pass; the breach conditions can trigger."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollbox.audit import probes_isolation as iso
from rollbox.audit import probes_kernel as kern
from rollbox.audit import scripts
from rollbox.audit.context import MARK, AuditContext, ProbeError
from rollbox.audit.registry import Outcome
from rollbox.config import Home
from rollbox.models import ExecResult

Answer = Callable[[list[str], str], ExecResult]


def res(code: int = 0, out: str = "", err: str = "", oom: bool = False) -> ExecResult:
    return ExecResult(exit_code=code, stdout=out, stderr=err, duration_s=0.01, oom_killed=oom)


def printed(obj: dict[str, Any], code: int = 0) -> ExecResult:
    return res(code, MARK + json.dumps(obj) + "\n")


class FakeSandbox:
    """Answers each exec with ``answer(argv, stdin)``."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.id = "sbx-fake"

    async def exec(self, cmd: list[str], stdin: str | None = None, **_kw: Any) -> ExecResult:
        return self.answer(cmd, stdin or "")


def by_script(table: dict[str, Callable[[dict[str, Any]], ExecResult]], other: Answer) -> Answer:
    """Route ``python3 -c SCRIPT`` to ``table[SCRIPT](args)``; anything else to ``other``."""

    def answer(cmd: list[str], stdin: str) -> ExecResult:
        if cmd[:2] == ["python3", "-c"]:
            for script, fn in table.items():
                if cmd[2] == script:
                    return fn(json.loads(stdin or "{}"))
            raise AssertionError("unexpected probe program")
        return other(cmd, stdin)

    return answer


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[AuditContext]:
    c = AuditContext(
        home=Home(tmp_path / "home"), backend="fake", baseline="sha256:x", layer_dirs=[]
    )
    c.canary_proc = subprocess.Popen(["sleep", "60"])
    c.canary_dir = tmp_path / "canary"
    c.canary_file = c.canary_dir / "host-secret.txt"
    c.canary_token = "rbxaudit-hostfile-0"
    try:
        yield c
    finally:
        c.canary_proc.kill()
        c.canary_proc.wait()


def use(ctx: AuditContext, a: Answer, b: Answer | None = None, new: Answer | None = None) -> None:
    sa, sb = FakeSandbox(a), FakeSandbox(b or a)

    async def shared() -> tuple[Any, Any]:
        return sa, sb

    async def sandbox(**_kw: Any) -> Any:
        return FakeSandbox(new or a)

    ctx.shared = shared  # type: ignore[method-assign]
    ctx.sandbox = sandbox  # type: ignore[method-assign]


def run(fn: Callable[[AuditContext], Any], ctx: AuditContext) -> Outcome:
    out: Outcome = asyncio.run(fn(ctx))
    return out


# ---------------------------------------------------------------- memory-limit


@pytest.mark.parametrize(
    ("hog", "want"),
    [
        (res(0, "536870912\n"), "breach"),
        (res(137, oom=True), "pass"),
        (res(137), "pass"),  # SIGKILL by the kernel's OOM killer, not reported as oom
    ],
)
def test_memory_limit_verdicts(ctx: AuditContext, hog: ExecResult, want: str) -> None:
    use(ctx, lambda cmd, _s: res(0), new=lambda cmd, _s: hog if cmd[0] == "python3" else res(0))
    assert run(iso.memory_limit, ctx).status == want


@pytest.mark.parametrize(
    "hog", [res(127, err="sh: python3: not found"), res(1, err="MemoryError"), res(139)]
)
def test_memory_limit_errors_unless_the_hog_was_killed(ctx: AuditContext, hog: ExecResult) -> None:
    use(ctx, lambda cmd, _s: res(0), new=lambda cmd, _s: hog if cmd[0] == "python3" else res(0))
    with pytest.raises(ProbeError, match=f"exited {hog.exit_code} without being killed"):
        run(iso.memory_limit, ctx)


# ---------------------------------------------------------------- kill-all


def _kill_all_answers(marker_pids: list[int], b_alive: bool) -> tuple[Answer, Answer]:
    b = by_script(
        {
            scripts.START_MARKER: lambda a: printed({"marker_pids": marker_pids}),
            scripts.SCAN_PROCS: lambda a: printed({"cmdline_hits": marker_pids if b_alive else []}),
        },
        lambda cmd, _s: res(0),
    )
    k = by_script({scripts.KILL_ALL: lambda a: printed({"kill_-1": "OK"})}, lambda c, s: res(0))
    return b, k


def test_kill_all_errors_when_b_marker_never_started(ctx: AuditContext) -> None:
    b, k = _kill_all_answers([], b_alive=False)
    use(ctx, lambda cmd, _s: res(0), b=b, new=k)
    with pytest.raises(ProbeError, match="marker process in B"):
        run(kern.kill_all, ctx)


@pytest.mark.parametrize(("alive", "want"), [(True, "pass"), (False, "breach")])
def test_kill_all_verdicts(ctx: AuditContext, alive: bool, want: str) -> None:
    b, k = _kill_all_answers([7], b_alive=alive)
    use(ctx, lambda cmd, _s: res(0), b=b, new=k)
    assert run(kern.kill_all, ctx).status == want


# ---------------------------------------------------------------- host-files-invisible


def _host_files_answer(grep: ExecResult) -> Answer:
    return by_script(
        {scripts.EXISTS: lambda a: printed({"exists": {p: False for p in a["paths"]},
                                            "found_by_name": []})},
        lambda cmd, _s: grep,
    )  # fmt: skip


@pytest.mark.parametrize(
    "grep", [res(2, err="grep: /var/x: Input/output error"), res(127, err="grep: not found")]
)
def test_host_files_errors_when_grep_fails(ctx: AuditContext, grep: ExecResult) -> None:
    use(ctx, _host_files_answer(grep))
    with pytest.raises(ProbeError, match="grep for the host canary failed"):
        run(iso.host_files, ctx)


@pytest.mark.parametrize(
    ("grep", "want"), [(res(1), "pass"), (res(0, "/var/tmp/host-secret.txt\n"), "breach")]
)
def test_host_files_verdicts(ctx: AuditContext, grep: ExecResult, want: str) -> None:
    use(ctx, _host_files_answer(grep))
    assert run(iso.host_files, ctx).status == want


# ---------------------------------------------------------------- ptrace, disk-limit


def test_ptrace_errors_without_a_live_canary(ctx: AuditContext) -> None:
    assert ctx.canary_proc is not None
    ctx.canary_proc.kill()
    ctx.canary_proc.wait()
    use(ctx, lambda cmd, _s: res(0))
    with pytest.raises(ProbeError, match="canary"):
        run(kern.ptrace, ctx)


def test_ptrace_watches_while_the_program_holds(ctx: AuditContext) -> None:
    """The host reads TracerPid while the probe program runs (here: for ~0.3 s)."""

    def slow(_args: dict[str, Any]) -> ExecResult:
        import time

        time.sleep(0.3)
        return printed({"attach": {"5": "EPERM"}, "child": 5, "held": []})

    class Slow(FakeSandbox):
        async def exec(self, cmd: list[str], stdin: str | None = None, **_kw: Any) -> ExecResult:
            return await asyncio.to_thread(slow, {})

    sa = Slow(lambda c, s: res(0))

    async def shared() -> tuple[Any, Any]:
        return sa, sa

    ctx.shared = shared  # type: ignore[method-assign]
    out = run(kern.ptrace, ctx)
    assert out.status == "pass"
    assert out.evidence["tracer_pid_reads"] >= 5


@pytest.mark.parametrize(("error", "want"), [("ENOSPC", "pass"), ("EDQUOT", "pass")])
def test_disk_limit_needs_a_full_disk(ctx: AuditContext, error: str, want: str) -> None:
    fill = by_script(
        {scripts.DISK_FILL: lambda a: printed({"written_mb_attempted": 31, "error": error})},
        lambda cmd, _s: res(0),
    )
    use(ctx, fill)
    assert run(iso.disk_limit, ctx).status == want


def test_disk_limit_errors_on_another_failure(ctx: AuditContext) -> None:
    fill = by_script(
        {scripts.DISK_FILL: lambda a: printed({"written_mb_attempted": 0, "error": "EROFS"})},
        lambda cmd, _s: res(0),
    )
    use(ctx, fill)
    with pytest.raises(ProbeError, match="EROFS"):
        run(iso.disk_limit, ctx)
