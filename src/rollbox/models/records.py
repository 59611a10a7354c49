"""Records of runs and rollouts (kept by ``rollbox.store``, sealed by ``rollbox.store.provenance``)
and the run summary computed from them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator

from rollbox.models.base import DIGEST_RE, SCHEMA_VERSION, Model, utcnow
from rollbox.models.sandboxes import LimitReason, Limits, NetworkPolicy

Phase = Literal[
    "queued",
    "provisioning",
    "setup",
    "agent",
    "verify",
    "collect",
    "teardown",
    "done",
    "failed",
    "infra_error",
    "interrupted",
]
"""A rollout's phases in order; the last three are terminal alternatives to ``done``."""

RolloutStatus = Literal["queued", "running", "done", "failed", "infra_error", "interrupted"]
"""``done``: the verifier gave an outcome (pass or not); ``failed``: task, agent or verifier
error; ``infra_error``: the sandbox/backend failed (retryable); ``interrupted``: cancelled."""

ErrorKind = Literal["task", "agent", "verifier", "infra"]
"""Who is to blame for a rollout's error."""

RunStatus = Literal["running", "done", "interrupted", "failed"]
"""Lifecycle of a run."""


FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
"""A float that is neither NaN nor infinite (JSON cannot carry those)."""


class RecordModel(Model):
    """Base of the run/rollout records: field docstrings also become JSON-schema
    descriptions (the export schema in docs/store-export.schema.json)."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, use_attribute_docstrings=True
    )


class PhaseStamp(RecordModel):
    """The moment a rollout entered a phase."""

    phase: Phase
    """The phase entered."""
    at: datetime
    """When (UTC)."""


class BlobRef(RecordModel):
    """A reference to a content-addressed blob in ``ROLLBOX_HOME/blobs``."""

    name: str
    """What it is: ``stdout``, ``trajectory.json``, an artifact path, ``task.tar``..."""
    digest: str
    """``sha256:<64 hex>`` of the content (its address)."""
    size: int = Field(ge=0)
    """Size in bytes."""
    truncated: bool = False
    """The content was cut at a cap (captured output)."""

    @field_validator("digest")
    @classmethod
    def _digest_ok(cls, v: str) -> str:
        if not DIGEST_RE.match(v):
            raise ValueError(f"not a sha256 digest: {v!r}")
        return v


class VerifierOutcome(RecordModel):
    """What the verifier said about one rollout."""

    reward: FiniteFloat | None = None
    """The scalar reward (``reward.txt``, or ``reward.json``'s ``reward`` key when present)."""
    rewards: dict[str, FiniteFloat] | None = None
    """The whole ``reward.json`` dict when one was written."""
    passed: bool | None = None
    """True when the reward counts as a pass (reward > 0 by default)."""
    error: str | None = None
    """Why no reward could be read (missing, empty, unparseable...), else None."""
    exit_code: int | None = None
    """Exit code of the verifier command (``tests/test.sh``)."""
    stdout: BlobRef | None = None
    """The verifier's captured stdout."""
    stderr: BlobRef | None = None
    """The verifier's captured stderr."""
    mode: Literal["shared", "separate"] = "shared"
    """Ran in the agent's sandbox or in a fresh one made from its final filesystem."""
    duration_s: float | None = None
    """Wall-clock time of the verifier command."""


class FsChange(RecordModel):
    """One path that differs between the baseline and the sandbox's final filesystem."""

    path: str
    """Absolute path inside the sandbox."""
    kind: Literal["added", "modified", "deleted"]
    """What happened to it."""
    size: int | None = None
    """Size in bytes after the change (None when deleted or not a regular file)."""
    sha256: str | None = None
    """``sha256:<hex>`` of a regular file's new content, else None."""
    type: Literal["file", "dir", "symlink", "other"] = "file"
    """Kind of filesystem object (after the change; before it when deleted)."""


class TrajectoryStep(RecordModel):
    """One step of a policy's trajectory (action taken, observation received)."""

    action: Any
    """What the policy did (a command string or a JSON-able structure)."""
    observation: Any = None
    """What it got back (e.g. an ExecResult dump)."""
    started_at: datetime
    """When the step began (UTC)."""
    ended_at: datetime | None = None
    """When it ended (UTC)."""
    reward: FiniteFloat | None = None
    """Per-step reward, if the policy reports one."""
    info: dict[str, Any] = {}
    """Free-form extra data of the step."""


class RolloutRecord(RecordModel):
    """The durable provenance record of one rollout (one attempt of one task)."""

    schema_version: int = SCHEMA_VERSION
    """Record schema version."""
    id: str
    """``ro-<ulid>``."""
    run_id: str
    """The run it belongs to, ``run-<ulid>``."""
    task_name: str
    """The task's name (``[task] name`` or its directory name)."""
    task_digest: str
    """sha256 of the task directory (its identity)."""
    task_blob: BlobRef | None = None
    """Stored copy of the task directory (a tar blob)."""
    task_path: str = ""
    """Where the task was loaded from (informational)."""
    attempt: int = Field(default=0, ge=0)
    """Attempt number within the run (0-based)."""
    agent: str
    """Agent identity, e.g. ``oracle``, ``nop``, ``cmd:…``, ``python:mod:fn``."""
    agent_config: dict[str, Any] = {}
    """Agent configuration (timeouts, options; never secret values)."""
    seed: int | None = None
    """Seed handed to the agent."""
    backend: str = ""
    """Backend that isolated it (``namespace``, ``gvisor``, ``microvm``)."""
    backend_version: str = ""
    """Version of the backend's tool."""
    accelerator: str | None = None
    """microVM accelerator (``kvm``/``tcg``), else None."""
    host: str = ""
    """Hostname of the machine that ran it."""
    rollbox_version: str = ""
    """rollbox version that ran it."""
    baseline_digest: str | None = None
    """Digest of the baseline the sandbox started from."""
    baseline_lineage: list[str] = []
    """Digests from that baseline up through its parents (self first)."""
    limits: Limits | None = None
    """Resource limits of the sandbox."""
    network: NetworkPolicy | None = None
    """Network policy of the sandbox."""
    env_names: list[str] = []
    """Names of environment variables set (values are never stored)."""
    phases: list[PhaseStamp] = []
    """Phases entered, in order, with timestamps."""
    status: RolloutStatus = "queued"
    """Outcome class (see ``RolloutStatus``)."""
    error: str | None = None
    """One-line reason when status is failed/infra_error/interrupted."""
    error_kind: ErrorKind | None = None
    """Who is to blame for the error."""
    reasons: list[LimitReason] = []
    """Sandbox limits reached during the rollout (``oom_killed``, ``pids_exhausted``,
    ``disk_full``, ``ttl_expired``), each once, first seen first; reached in the agent phase
    they make a later failure the agent's (never retried)."""
    reason_phases: dict[str, str] = {}
    """For each entry of ``reasons``: the phase it was reached in (``agent``, ``verify``...)."""
    exit_codes: dict[str, int] = {}
    """Exit codes by step (``setup``, ``agent``, ``verifier``...)."""
    agent_timed_out: bool = False
    """The agent ran past its timeout and was killed."""
    stdout: BlobRef | None = None
    """The agent's captured (capped) stdout."""
    stderr: BlobRef | None = None
    """The agent's captured (capped) stderr."""
    trajectory: BlobRef | None = None
    """JSON list of ``TrajectoryStep`` (python policies)."""
    artifacts: list[BlobRef] = []
    """Collected artifacts and logs (name = path inside the sandbox)."""
    fs_diff: list[FsChange] = []
    """Filesystem changes against the baseline."""
    suspicious_changes: list[str] = []
    """Paths of ``fs_diff`` under system directories (``/usr``, ``/bin``, ``/lib*``, ``/etc``,
    ``/opt``, ``/sbin``): a shared-mode verifier runs the programs found there."""
    verifier: VerifierOutcome | None = None
    """The verifier's outcome."""
    retry_of: str | None = None
    """Id of the failed rollout this one retries."""
    retried_by: str | None = None
    """Id of the rollout that retried this one."""
    group_id: str | None = None
    """Attempts forked from one post-setup snapshot share this id."""
    sandbox_ids: list[str] = []
    """Sandboxes the rollout used (agent, and separate verifier)."""
    created_at: datetime = Field(default_factory=utcnow)
    """When the record was made (UTC)."""
    finished_at: datetime | None = None
    """When it reached a terminal status (UTC)."""
    extra: dict[str, Any] = {}
    """Further facts (free-form, JSON-able); covered by the provenance digest."""
    provenance_digest: str | None = None
    """``sha256:…`` over the canonical record and every referenced blob (see provenance.py)."""

    def blob_refs(self) -> list[BlobRef]:
        """Every blob this record references (task copy, logs, trajectory, artifacts)."""
        refs = [self.task_blob, self.stdout, self.stderr, self.trajectory, *self.artifacts]
        if self.verifier is not None:
            refs += [self.verifier.stdout, self.verifier.stderr]
        return [r for r in refs if r is not None]

    def stamp(self, phase: Phase) -> None:
        """Append ``phase`` with the current time."""
        self.phases = [*self.phases, PhaseStamp(phase=phase, at=utcnow())]

    def phase_time(self, phase: Phase) -> datetime | None:
        """When the rollout first entered ``phase``, or None."""
        for p in self.phases:
            if p.phase == phase:
                return p.at
        return None


class RunRecord(RecordModel):
    """One run: a batch of rollouts (tasks x attempts) with concurrency and retry policy."""

    schema_version: int = SCHEMA_VERSION
    """Record schema version."""
    id: str
    """``run-<ulid>``."""
    created_at: datetime = Field(default_factory=utcnow)
    """When the run started (UTC)."""
    finished_at: datetime | None = None
    """When it ended (UTC)."""
    status: RunStatus = "running"
    """Lifecycle state."""
    args: dict[str, Any] = {}
    """The command-line arguments / configuration it was started with."""
    task_dirs: list[str] = []
    """Task directories, as given."""
    agent: str = ""
    """Agent spec."""
    backend: str = ""
    """Backend actually used."""
    backend_reason: str = ""
    """Why that backend was chosen (``auto``)."""
    concurrency: int = Field(default=1, ge=1)
    """Maximum rollouts at once."""
    attempts: int = Field(default=1, ge=1)
    """Attempts per task."""
    retries: int = Field(default=0, ge=0)
    """Retries allowed per rollout for infrastructure errors."""
    group_from_snapshot: bool = False
    """Attempts forked from one post-setup snapshot per task."""
    owner_pid: int | None = None
    """PID of the ``rollbox run`` process."""
    host: str = ""
    """Hostname of the machine that ran it."""
    rollbox_version: str = ""
    """rollbox version that ran it."""
    summary: dict[str, Any] = {}
    """The final summary (``RunSummary`` dump) and cleanup check."""
    rollouts: dict[str, str] = {}
    """Sealed runs: every rollout id -> its provenance digest (detects missing records)."""
    provenance_digest: str | None = None
    """``sha256:…`` over the canonical run record (set by ``provenance.seal_run``)."""


class Quantiles(RecordModel):
    """Summary statistics of a duration sample, in seconds."""

    n: int = 0
    """Sample size."""
    p50: float | None = None
    """Median."""
    p95: float | None = None
    """95th percentile."""
    p99: float | None = None
    """99th percentile."""
    mean: float | None = None
    """Mean."""
    max: float | None = None
    """Maximum."""


class TaskSummary(RecordModel):
    """Per-task results of a run (final attempts only; retried records excluded)."""

    task: str
    """Task name."""
    task_digest: str
    """Task identity."""
    attempts: int
    """Final attempts counted."""
    passed: int
    """Attempts the verifier passed."""
    pass_rate: float
    """passed / attempts."""
    mean_reward: float | None
    """Mean reward over attempts with a reward."""
    pass_at_k: dict[str, float]
    """Unbiased pass@k estimates, keyed ``"1"``, ``"k"``..."""
    errors: int
    """Attempts that ended failed/infra_error/interrupted."""


class PlatformSummary(RecordModel):
    """Infrastructure figures of a run."""

    rollouts: int
    """All records, retried ones included."""
    final_rollouts: int
    """Records not superseded by a retry."""
    provisioning_s: Quantiles
    """Provisioning latency (provisioning -> setup)."""
    queue_s: Quantiles
    """Queue time (queued -> provisioning)."""
    total_s: Quantiles
    """Rollout wall time (queued -> finished)."""
    successful_starts: int
    """Records whose sandbox came up (reached ``setup``)."""
    completed: int
    """Final records with status ``done``."""
    completion_rate: float
    """completed / final_rollouts."""
    infra_errors: int
    """Records with status ``infra_error`` (retried ones included)."""
    infra_error_rate: float
    """infra_errors / rollouts."""
    retries: int
    """Records that are retries of another."""
    wall_s: float | None
    """Run wall time (created -> finished or last rollout)."""
    throughput_per_s: float | None
    """Rollouts finished per second of run wall time."""
    cleanup_ok: bool | None
    """Host state before/after the run matched (None when not checked)."""
    cleanup_leftovers: list[str] = []
    """What the cleanup check found left over."""
    limits_reached: dict[str, int] = {}
    """Final rollouts that reached each sandbox limit, e.g. ``{"oom_killed": 2}``."""


class RunSummary(RecordModel):
    """The report of a run: per task results and platform figures."""

    run_id: str
    """The run."""
    status: RunStatus
    """Its status."""
    backend: str
    """Backend used."""
    agent: str
    """Agent used."""
    tasks: list[TaskSummary]
    """Per task, in name order."""
    platform: PlatformSummary
    """Infrastructure figures."""
    overall_pass_rate: float | None
    """Passed / final attempts over all tasks."""
    mean_reward: float | None
    """Mean reward over all final attempts with a reward."""
    suspicious_changes: int = 0
    """Paths under system directories changed by agents (``suspicious_changes``), summed over
    final attempts."""
    suspicious_rollouts: int = 0
    """Final attempts with at least one suspicious change."""
    unprotected_rollouts: int = 0
    """Final attempts whose shared-mode verifier ran with the agent's processes alive on a
    backend that cannot isolate it (``verifier_isolation = "none"``)."""
