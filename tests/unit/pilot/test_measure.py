"""The pilot driver's accounting, with an in-memory sandbox double.

The double lets these tests force infrastructure errors, slow starts and failing workloads
deterministically; the real backends are exercised in tests/integration/pilot.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest

from rollbox.config import Home
from rollbox.errors import BackendError, BackendUnavailableError, BaselineNotFoundError
from rollbox.models import ExecResult, Limits
from rollbox.pilot.html import render_html
from rollbox.pilot.measure import PilotConfig, SandboxLike, run_pilot
from rollbox.pilot.plot import render_png
from rollbox.pilot.workloads import parse_workload


class FakeSandbox:
    def __init__(self, live: set[int], key: int, fail_workload: bool) -> None:
        self.live = live
        self.key = key
        self.fail_workload = fail_workload
        live.add(key)

    async def exec(self, cmd: list[str] | str, *, timeout: float | None = None) -> ExecResult:
        await asyncio.sleep(0.001)
        code = 1 if (self.fail_workload and cmd != ["true"]) else 0
        return ExecResult(exit_code=code, stdout="", stderr="", duration_s=0.001)

    async def destroy(self) -> None:
        self.live.discard(self.key)


class FakeFactory:
    """Fails the creations whose sequence number is in ``fail_at``; tracks peak concurrency."""

    def __init__(self, fail_at: set[int] | None = None, fail_workload: bool = False) -> None:
        self.fail_at = set(fail_at or ())
        self.fail_workload = fail_workload
        self.calls = 0
        self.live: set[int] = set()
        self.peak = 0

    async def __call__(
        self, baseline: str, backend: str, limits: Limits, home: Home
    ) -> SandboxLike:
        n = self.calls
        self.calls += 1
        await asyncio.sleep(0.002)
        if n in self.fail_at:
            raise BackendError(f"boom {n}")
        sbx = FakeSandbox(self.live, n, self.fail_workload)
        self.peak = max(self.peak, len(self.live))
        return sbx


def _cfg(home: Home, factory: FakeFactory, **kw: object) -> PilotConfig:
    base: dict[str, object] = {
        "backends": ["namespace"],
        "workload": parse_workload("sleep:0"),
        "rollouts": 20,
        "concurrency": [1, 4],
        "home": home,
        "baseline": "sha256:" + "a" * 64,
        "raw_samples": 0,
        "factory": factory,
        "prepare": lambda backend, home: None,
    }
    base.update(kw)
    return PilotConfig(**base)  # type: ignore[arg-type]


def test_counts_and_concurrency_bound(home: Home) -> None:
    fac = FakeFactory()
    rep = asyncio.run(run_pilot(_cfg(home, fac)))
    levels = rep.backends[0].levels
    assert [lv.concurrency for lv in levels] == [1, 4]
    for lv in levels:
        assert lv.rollouts == 20 and lv.successful_starts == 20 and lv.completed == 20
        assert lv.completion_rate == 1.0 and lv.infra_errors == 0 and lv.gave_up == 0
        assert lv.provisioning.n == 20 and lv.provisioning.p50_ms is not None
        assert lv.throughput_per_s > 0
        assert lv.cleanup.clean
    assert fac.peak == 4  # never more sandboxes alive than the level allows
    assert not fac.live  # every sandbox destroyed
    assert rep.ok


def test_retry_outcomes_and_give_up(home: Home) -> None:
    # concurrency 1 makes creation order deterministic: rollout 0 fails (call 0) then
    # succeeds on retry (call 1); rollout 1 fails twice (calls 2, 3) and gives up with
    # retries=1; the rest succeed first time.
    fac = FakeFactory(fail_at={0, 2, 3})
    rep = asyncio.run(run_pilot(_cfg(home, fac, rollouts=5, concurrency=[1], retries=1)))
    lv = rep.backends[0].levels[0]
    assert lv.infra_errors == 3
    assert lv.retries == 2  # one retry each for rollouts 0 and 1
    assert lv.retry_successes == 1
    assert lv.gave_up == 1
    assert lv.successful_starts == 4 and lv.completed == 4
    assert "BackendError: boom 0" in lv.error_samples
    assert not rep.ok  # a rollout never got a sandbox


def test_failed_workload_is_not_an_infra_error(home: Home) -> None:
    fac = FakeFactory(fail_workload=True)
    rep = asyncio.run(run_pilot(_cfg(home, fac, rollouts=3, concurrency=[2])))
    lv = rep.backends[0].levels[0]
    assert lv.successful_starts == 3 and lv.completed == 0 and lv.infra_errors == 0
    assert lv.completion_rate == 0.0 and lv.throughput_per_s == 0.0


def test_invalid_input_aborts(home: Home) -> None:
    class Bad(FakeFactory):
        async def __call__(self, *a: object) -> SandboxLike:  # type: ignore[override]
            raise BaselineNotFoundError("no baseline 'x'")

    with pytest.raises(BaselineNotFoundError):
        asyncio.run(run_pilot(_cfg(home, Bad(), rollouts=2, concurrency=[1])))


def test_leaked_sandbox_dir_is_reported(home: Home) -> None:
    class Leaky(FakeFactory):
        async def __call__(self, *a: object) -> SandboxLike:  # type: ignore[override]
            sbx = await super().__call__(*a)  # type: ignore[arg-type]
            sbx.id = f"sbx-leak{self.calls}"  # type: ignore[attr-defined]
            (home.sandboxes / sbx.id).mkdir(parents=True, exist_ok=True)  # type: ignore[attr-defined]
            # a sandbox of someone else using the same home: not ours, not a leak of ours
            (home.sandboxes / f"sbx-other{self.calls}").mkdir(parents=True, exist_ok=True)
            return sbx

    rep = asyncio.run(run_pilot(_cfg(home, Leaky(), rollouts=2, concurrency=[1])))
    lv = rep.backends[0].levels[0]
    assert not lv.cleanup.clean
    assert lv.cleanup.leaked["sandbox_dirs"] == ["sbx-leak1", "sbx-leak2"]
    assert not rep.ok


def test_png_and_html(home: Home, tmp_path: Path) -> None:
    rep = asyncio.run(
        run_pilot(_cfg(home, FakeFactory(), backends=["namespace", "gvisor"], rollouts=4))
    )
    png = render_png(rep, tmp_path / "p.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    page = render_html(rep, data, tmp_path / "p.html").read_text()
    assert base64.b64encode(data).decode() in page  # embedded, self-contained
    assert "gvisor" in page and "namespace" in page
    assert 'src="http' not in page and "<script" not in page


def test_unavailable_backend(home: Home) -> None:
    def prepare(backend: str, home: Home) -> None:
        if backend == "gvisor":
            raise BackendUnavailableError("runsc is not installed", hint="apt-get install runsc")

    cfg = _cfg(home, FakeFactory(), backends=["namespace", "gvisor"], rollouts=2, prepare=prepare)
    rep = asyncio.run(run_pilot(cfg))
    ns, gv = rep.backends
    assert ns.error is None and len(ns.levels) == 2
    assert gv.levels == [] and gv.error is not None and "runsc is not installed" in gv.error
    assert not rep.ok
    with pytest.raises(BackendUnavailableError):  # the only backend asked for: an error
        asyncio.run(run_pilot(_cfg(home, FakeFactory(), backends=["gvisor"], prepare=prepare)))
