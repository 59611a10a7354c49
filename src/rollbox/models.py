"""Pydantic models shared by the library, the CLI (``--json``), the store and the API.

No I/O here. Every model forbids unknown fields, every field has a docstring, and
timestamps are timezone-aware UTC.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

SCHEMA_VERSION = 1
"""Version of the on-disk/record schema written by this rollbox."""

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def utcnow() -> datetime:
    """Now, timezone-aware UTC."""
    return datetime.now(UTC)


class Model(BaseModel):
    """Base: unknown fields are an error, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --------------------------------------------------------------------------- baselines


class RecipeSource(Model):
    """The baseline was bootstrapped from a Debian recipe with mmdebstrap."""

    type: Literal["recipe"] = "recipe"
    recipe_hash: str
    """sha256 of the canonical recipe JSON (the cache key)."""
    recipe: dict[str, object]
    """The recipe itself, canonicalised."""


class DockerfileSource(Model):
    """The baseline was built from a Dockerfile/Containerfile with buildah."""

    type: Literal["dockerfile"] = "dockerfile"
    input_hash: str
    """sha256 over the Dockerfile, the build args and every file of the context (cache key)."""
    dockerfile: str
    """Path of the Dockerfile as given."""
    context: str
    """Path of the build context as given."""


class ImageSource(Model):
    """The baseline was imported from an image reference by skopeo."""

    type: Literal["image"] = "image"
    reference: str
    """The transport:reference that was imported, e.g. ``docker://127.0.0.1:5000/x:1``."""


class ImportSource(Model):
    """The baseline was imported from a rootfs directory or tarball."""

    type: Literal["import"] = "import"
    path: str
    """The imported path."""
    content_hash: str
    """sha256 of the produced layer tar (deterministic for the same content)."""


class SnapshotSource(Model):
    """The baseline is a snapshot of a running sandbox: its changes as a new top layer."""

    type: Literal["snapshot"] = "snapshot"
    sandbox_id: str
    """The sandbox the snapshot was taken of."""
    backend: str
    """That sandbox's backend."""


BaselineSource = Annotated[
    RecipeSource | DockerfileSource | ImageSource | ImportSource | SnapshotSource,
    Field(discriminator="type"),
]


class LayerInfo(Model):
    """One layer of a baseline."""

    digest: str
    """Digest of the layer blob as stored (what the manifest lists)."""
    diff_id: str
    """Digest of the uncompressed layer tar (names the unpacked directory)."""
    size: int
    """Size of the blob in bytes."""
    media_type: str
    """OCI media type of the blob."""


class ImageConfig(Model):
    """The runtime parts of the OCI image config that a sandbox honours."""

    env: list[str] = []
    """``KEY=VALUE`` entries."""
    workdir: str = "/"
    """Working directory for commands."""
    user: str = ""
    """User (name or uid[:gid]) commands run as; empty means root."""
    cmd: list[str] = []
    """Default command (informational)."""
    entrypoint: list[str] = []
    """Entrypoint (informational; rollbox runs its own agent)."""


class BaselineInfo(Model):
    """Metadata of one baseline in the store."""

    schema_version: int = SCHEMA_VERSION
    """Record schema version."""
    digest: str
    """Identity: the OCI manifest digest, ``sha256:<64 hex>``."""
    names: list[str] = []
    """Names/tags pointing at it, e.g. ``debian:bookworm``, ``rollbox/default``."""
    source: BaselineSource
    """How it was made."""
    parent: str | None = None
    """Digest of the baseline it was derived from (lineage), if any."""
    layers: list[LayerInfo]
    """Layers, bottom first."""
    config: ImageConfig = ImageConfig()
    """Runtime config from the image."""
    size: int
    """Total size of the layer blobs in bytes."""
    created_at: datetime
    """When it entered this store (UTC)."""

    @field_validator("digest")
    @classmethod
    def _digest_ok(cls, v: str) -> str:
        if not DIGEST_RE.match(v):
            raise ValueError(f"not a sha256 digest: {v!r}")
        return v


# --------------------------------------------------------------------------- sandboxes

BackendName = str
"""``namespace``, ``gvisor``, ``microvm`` (or ``auto`` where a choice is made for you)."""


MAX_CPUS = 1024
"""Largest ``cpus`` limit accepted."""

LIMIT_CAPS = {
    "memory_mb": 1 << 30,
    "disk_mb": 1 << 30,
    "pids": 1 << 22,
    "nofile": 1 << 20,
    "output_bytes": 1 << 34,
}
"""Largest value of each integer limit (1 PiB of memory or disk, the kernel's pid_max and
nr_open ceilings, 16 GiB of output): beyond them a number is a typo or an overflow."""

MAX_SECONDS = 30 * 86400.0
"""Longest timeout accepted (30 days); a larger one overflows timers or means never."""

MAX_TTL_S = 100 * 86400.0
"""Longest sandbox TTL accepted (100 days): a rollout's sandbox lives for its agent and
verifier timeouts plus a margin, so this exceeds twice ``MAX_SECONDS``."""


def check_seconds(v: float | None, what: str, most: float = MAX_SECONDS) -> float | None:
    """``v`` if it is a usable duration (finite, > 0, at most ``most``).

    Raises:
        ValueError: naming ``what`` and the accepted range.
    """
    if v is not None and not 0 < v <= most:  # also refuses nan and inf
        raise ValueError(f"{what} must be > 0 and at most {most:.0f} seconds, got {v}")
    return v


class Limits(Model):
    """Resource limits of a sandbox. ``None`` means: no limit of that kind."""

    cpus: float | None = 1.0
    """CPU quota in cores (may be fractional; vCPUs for microVMs, rounded up)."""
    memory_mb: int | None = 512
    """Memory limit; exceeding it gets the offending process OOM-killed inside."""
    pids: int | None = 256
    """Maximum number of processes/threads inside."""
    disk_mb: int | None = 1024
    """Maximum bytes the sandbox may write on top of its baseline."""
    nofile: int | None = 1024
    """Open-file limit (RLIMIT_NOFILE) of processes inside."""
    output_bytes: int = 1 << 20
    """Cap on captured stdout and on stderr per exec; the rest is dropped and flagged."""

    @field_validator("cpus")
    @classmethod
    def _cpus_ok(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v <= MAX_CPUS:  # also refuses nan and inf
            raise ValueError(f"cpus must be > 0 and at most {MAX_CPUS}")
        return v

    @field_validator("memory_mb", "pids", "disk_mb", "nofile")
    @classmethod
    def _positive(cls, v: int | None, info: ValidationInfo) -> int | None:
        cap = LIMIT_CAPS[str(info.field_name)]
        if v is not None and not 0 < v <= cap:
            raise ValueError(f"must be > 0 and at most {cap}")
        return v

    @field_validator("output_bytes")
    @classmethod
    def _output_ok(cls, v: int) -> int:
        if not 0 <= v <= LIMIT_CAPS["output_bytes"]:
            raise ValueError(f"must be >= 0 and at most {LIMIT_CAPS['output_bytes']}")
        return v


class HostPort(Model):
    """One allowed network destination."""

    host: str
    """IP address (v4) of the destination."""
    port: int = Field(ge=1, le=65535)
    """TCP/UDP port."""

    @classmethod
    def parse(cls, text: str) -> HostPort:
        """Parse ``HOST:PORT``."""
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"expected HOST:PORT, got {text!r}")
        if not 1 <= int(port) <= 65535:
            raise ValueError(f"port must be 1..65535, got {port} in {text!r}")
        return cls(host=host, port=int(port))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


class NetworkPolicy(Model):
    """What the sandbox may reach over the network."""

    mode: Literal["none", "loopback", "allow"] = "none"
    """``none``: only the sandbox's own loopback; ``loopback``: same (its own loopback, never
    the host's); ``allow``: a veth to the host with firewall rules admitting only ``allow``."""
    allow: list[HostPort] = []
    """Destinations reachable in ``allow`` mode."""


class SandboxSpec(Model):
    """Everything needed to create a sandbox. Persisted (without secrets) with the sandbox."""

    baseline: str
    """Digest (or unique prefix, or name) of the baseline to start from."""
    backend: BackendName = "namespace"
    """Backend to isolate with."""
    limits: Limits = Limits()
    """Resource limits."""
    network: NetworkPolicy = NetworkPolicy()
    """Network policy."""
    env: dict[str, str] = {}
    """Environment variables of every exec (on top of the image's)."""
    labels: dict[str, str] = {}
    """Free-form labels, shown by ``sandbox ls``."""
    ttl_s: float | None = None
    """Seconds after creation at which the sandbox is destroyed, even if its creator died."""
    hostname: str = "sandbox"
    """Hostname inside."""
    workdir: str | None = None
    """Default working directory (the image's when unset)."""
    user: str | None = None
    """Default user, ``root`` or a uid[:gid] / name inside (the image's when unset)."""
    from_snapshot: str | None = None
    """Restore from a memory snapshot id instead of booting (backends with memory snapshots)."""

    @field_validator("ttl_s")
    @classmethod
    def _ttl_ok(cls, v: float | None) -> float | None:
        return check_seconds(v, "ttl", MAX_TTL_S)


class SandboxInfo(Model):
    """The state of a sandbox, as stored in ``sandboxes/<id>/state.json`` and shown by ls."""

    schema_version: int = SCHEMA_VERSION
    """Record schema version."""
    id: str
    """``sbx-<ulid>``."""
    backend: BackendName
    """Backend that isolates it."""
    backend_version: str = ""
    """Version string of the backend's tool (runc/runsc/qemu)."""
    baseline: str
    """Resolved baseline digest."""
    spec: SandboxSpec
    """What it was created with (secrets never included)."""
    state: Literal["creating", "running", "paused", "destroyed", "crashed"] = "creating"
    """Lifecycle state."""
    created_at: datetime
    """Creation time (UTC)."""
    expires_at: datetime | None = None
    """When the TTL destroys it (UTC), if it has one."""
    owner_pid: int | None = None
    """PID of the process that created it (informational)."""
    accelerator: str | None = None
    """microVM only: ``kvm`` or ``tcg``."""
    extra: dict[str, object] = {}
    """Backend-specific runtime facts (pids, paths, netns name...)."""


LimitReason = Literal["oom_killed", "pids_exhausted", "disk_full", "ttl_expired"]
"""A sandbox limit a command or rollout ran into: the memory limit (a process was OOM-killed),
the pids limit (a fork failed), the disk limit (the writable layer filled up), the TTL (the
sandbox was destroyed under it)."""


class ExecResult(Model):
    """Result of one command run in a sandbox."""

    exit_code: int
    """The command's exit status; ``128+N`` when killed by signal N."""
    stdout: str
    """Captured stdout (decoded UTF-8 with replacement), capped at ``Limits.output_bytes``."""
    stderr: str
    """Captured stderr, capped likewise."""
    duration_s: float
    """Wall-clock time of the command."""
    oom_killed: bool = False
    """The kernel OOM-killed a process of this command (memory limit)."""
    pids_exhausted: bool = False
    """A process of this command could not fork: the sandbox's pids limit was reached."""
    disk_full: bool = False
    """The sandbox's writable layer was full when the command ended (``disk_mb`` reached)."""
    truncated: bool = False
    """stdout or stderr was cut at the output cap."""

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.exit_code == 0

    @property
    def reasons(self) -> list[LimitReason]:
        """The limits this command ran into, in a fixed order (empty: none)."""
        flags: list[tuple[bool, LimitReason]] = [
            (self.oom_killed, "oom_killed"),
            (self.pids_exhausted, "pids_exhausted"),
            (self.disk_full, "disk_full"),
        ]
        return [name for hit, name in flags if hit]


class Capabilities(Model):
    """What a backend can do; requests are checked against it before anything starts."""

    snapshot: bool = True
    """Filesystem snapshot to a new baseline layer."""
    memory_snapshot: bool = False
    """Snapshot of memory + devices, restorable with ``from_snapshot``."""
    fork: bool = True
    """``fork(n)``."""
    pause: bool = True
    """``pause()``/``resume()``."""
    network_modes: list[Literal["none", "loopback", "allow"]] = ["none", "loopback"]
    """Supported ``NetworkPolicy.mode`` values."""
    users: bool = True
    """Commands may run as an unprivileged uid inside."""


# --------------------------------------------------------------------------- runs and rollouts
# Records of the rollout runner, kept by ``rollbox.store`` (SQLite/PostgreSQL + blobs) and
# sealed by ``rollbox.store.provenance``. Appended by the store engineer (D1).

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
