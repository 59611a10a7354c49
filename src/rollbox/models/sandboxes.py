"""Sandboxes: limits, network policy, the create request, state, exec results, capabilities."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from rollbox.models.base import SCHEMA_VERSION, Model

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
