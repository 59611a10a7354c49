"""Pydantic models shared by the library, the CLI (``--json``), the store and the API.

No I/O here. Every model forbids unknown fields, every field has a docstring, and
timestamps are timezone-aware UTC.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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
        if v is not None and v <= 0:
            raise ValueError("cpus must be > 0")
        return v

    @field_validator("memory_mb", "pids", "disk_mb", "nofile")
    @classmethod
    def _positive(cls, v: int | None) -> int | None:
        if v is not None and v <= 0:
            raise ValueError("must be > 0")
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
    truncated: bool = False
    """stdout or stderr was cut at the output cap."""

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.exit_code == 0


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
