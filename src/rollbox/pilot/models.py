"""Records of a pilot: per rollout, per concurrency level, per backend."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

from rollbox.config import Home
from rollbox.models import ExecResult, Limits, Model
from rollbox.pilot.stats import Summary
from rollbox.pilot.workloads import Workload


class RolloutSample(Model):
    """Timing and outcome of one pilot rollout."""

    index: int
    """Position in the level (0-based)."""
    status: Literal["completed", "failed", "infra_error"]
    """``completed``: workload exited 0; ``failed``: it did not; ``infra_error``: no sandbox."""
    attempts: int
    """Sandbox creations tried (1 + retries used)."""
    queue_s: float
    """Time from submission until a concurrency slot was free."""
    provision_s: float | None = None
    """create() + first exec of ``true`` of the successful attempt."""
    workload_s: float | None = None
    """The workload's exec time."""
    destroy_s: float | None = None
    """destroy() time."""
    total_s: float
    """Submission to teardown done."""
    errors: list[str] = []
    """Infrastructure errors met, one line each (``Type: message``)."""


class RawTiming(Model):
    """The raw tool's bare start of ``true`` in the same run."""

    tool: str
    """``bwrap``, ``runsc``, ``runc``, ``qemu-system-x86_64``."""
    available: bool
    """False when the tool could not run here (see ``reason``)."""
    reason: str | None = None
    """Why it was not timed."""
    start: Summary = Summary(n=0)
    """Durations of the bare starts."""
    command: str = ""
    """The command line timed (the run id shown as ``ID``)."""


class Cleanup(Model):
    """Host state before and after a level."""

    clean: bool
    """No resource of this home was left behind."""
    leaked: dict[str, list[str]] = {}
    """Resources of this home present after but not before, by kind."""
    host_wide_new: dict[str, int] = {}
    """Counts of any new sandbox-like host resources (may include other users' sandboxes)."""
    before: dict[str, int] = {}
    """Resource counts before."""
    after: dict[str, int] = {}
    """Resource counts after."""


class LevelResult(Model):
    """One concurrency level of one backend."""

    concurrency: int
    """Rollouts in flight at once."""
    rollouts: int
    """Rollouts submitted."""
    successful_starts: int
    """Rollouts whose sandbox came up (after retries)."""
    completed: int
    """Rollouts whose workload exited 0."""
    completion_rate: float
    """completed / rollouts."""
    infra_errors: int
    """Failed sandbox creations (every attempt counted)."""
    retries: int
    """Retries made after an infrastructure error."""
    retry_successes: int
    """Rollouts that started only thanks to a retry."""
    gave_up: int
    """Rollouts that never got a sandbox."""
    wall_s: float
    """Wall time of the level."""
    throughput_per_s: float
    """Completed rollouts per second of wall time."""
    provisioning: Summary
    """create() + first ``true``."""
    queue: Summary
    """Time waiting for a concurrency slot."""
    workload: Summary
    """The workload's exec time."""
    destroy: Summary
    """destroy() time."""
    total: Summary
    """Whole rollout, submission to teardown."""
    raw: RawTiming
    """The raw tool at the same concurrency."""
    ratio_p50: float | None = None
    """provisioning p50 / raw p50."""
    ratio_p99: float | None = None
    """provisioning p99 / raw p99."""
    cleanup: Cleanup
    """Host state before/after."""
    error_samples: list[str] = []
    """Up to 5 distinct infrastructure error lines."""


class BackendResult(Model):
    """All levels of one backend."""

    backend: str
    """Backend name."""
    version: str = ""
    """The backend's tool version."""
    levels: list[LevelResult] = []
    """One per concurrency level."""
    error: str | None = None
    """Set when the backend could not be piloted at all."""


class PilotReport(Model):
    """The whole pilot (what ``--json`` prints)."""

    kind: Literal["rollbox-pilot"] = "rollbox-pilot"
    """Document type."""
    started_at: datetime
    """Start (UTC)."""
    finished_at: datetime
    """End (UTC)."""
    host: str
    """Host name."""
    cpus: int
    """CPUs of the host."""
    rollbox_version: str
    """rollbox version."""
    baseline: str
    """Baseline digest."""
    workload: str
    """Workload label."""
    rollouts: int
    """Rollouts per level."""
    concurrency: list[int]
    """Levels."""
    retries: int
    """Retries allowed per rollout."""
    backends: list[BackendResult]
    """Per backend."""

    @property
    def ok(self) -> bool:
        """Every backend ran, every level cleaned up, and no rollout gave up."""
        return all(
            b.error is None and all(lv.cleanup.clean and lv.gave_up == 0 for lv in b.levels)
            for b in self.backends
        )


# Moved from pilot/measure.py (pilot/tasks.py needs PilotConfig; measure imports tasks).
class SandboxLike(Protocol):
    """What the pilot needs of a sandbox (``rollbox.AsyncSandbox`` has it)."""

    async def exec(self, cmd: list[str] | str, *, timeout: float | None = None) -> ExecResult:
        """Run a command."""
        ...

    async def destroy(self) -> None:
        """Remove the sandbox."""
        ...


SandboxFactory = Callable[[str, str, Limits, Home], Awaitable[SandboxLike]]
"""``(baseline digest, backend, limits, home) -> started sandbox``."""


async def _default_factory(baseline: str, backend: str, limits: Limits, home: Home) -> SandboxLike:
    from rollbox.sandbox import AsyncSandbox

    return await AsyncSandbox.create(baseline, backend=backend, limits=limits, home=home)


def _default_prepare(backend: str, home: Home) -> None:
    from rollbox.backends.registry import get_backend

    get_backend(backend, home).prepare()


@dataclass
class PilotConfig:
    """What to pilot."""

    backends: list[str]
    workload: Workload
    rollouts: int
    concurrency: list[int]
    home: Home
    baseline: str
    """Resolved baseline digest."""
    layer_dirs: list[os.PathLike[str]] = field(default_factory=list)
    """The baseline's layer dirs, bottom first (for the raw tools)."""
    retries: int = 1
    raw_samples: int = 30
    limits: Limits = field(default_factory=lambda: Limits(memory_mb=256, disk_mb=256))
    factory: SandboxFactory = _default_factory
    prepare: Callable[[str, Home], None] = _default_prepare
    """Checks a backend's tools before its levels (raises BackendUnavailableError)."""
