"""Harbor task directories: load, validate and identify them.

A task directory (Harbor's layout, loaded unchanged)::

    TASK/
      instruction.md          what the agent is asked to do (required)
      task.toml               limits, timeouts, verifier mode, artifacts, [rollbox] settings
      environment/Dockerfile  the baseline (built through the baseline store, cached);
                              absent: the default Debian baseline
      tests/test.sh           the verifier; writes /logs/verifier/reward.txt or reward.json
      solution/solve.sh       what the ``oracle`` agent runs

Every problem is a :class:`~rollbox.errors.TaskError` naming the file and the field; nothing
else escapes :func:`load_task` (the hypothesis fuzz in ``tests/unit/rollouts`` holds it to that).
A task's identity is the sha256 over its directory: sorted relative paths, file modes and
contents (symlinks by their target).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import tarfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rollbox.errors import TaskError
from rollbox.models import LIMIT_CAPS, MAX_CPUS, MAX_SECONDS, HostPort, Limits, NetworkPolicy

MAX_TASK_BYTES = 64 << 20
"""A task directory larger than this is refused (tasks are inputs, not datasets)."""

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def _size_mb(value: object, what: str) -> int:
    """``2048``, ``"2G"``, ``"512M"`` → MiB."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number of MiB or a size like '2G'")
    if isinstance(value, int | float):
        if not 0 < value <= LIMIT_CAPS["memory_mb"]:  # also refuses nan and inf
            raise ValueError(f"{what} must be > 0 and at most {LIMIT_CAPS['memory_mb']} MiB")
        return int(value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            num = float(m.group(1))
            mult = {"": 1 / (1 << 20), "k": 1 / 1024, "m": 1, "g": 1024, "t": 1 << 20}
            mb = num * mult[m.group(2).lower()]
            if 1 <= mb <= LIMIT_CAPS["memory_mb"]:
                return int(mb)
            raise ValueError(
                f"{what} must be 1 MiB to {LIMIT_CAPS['memory_mb']} MiB, got {value!r}"
            )
    raise ValueError(f"{what} must be a number of MiB or a size like '2G', got {value!r}")


class _Table(BaseModel):
    """Harbor tables: known keys are typed; unknown keys are kept (Harbor adds fields over
    time and existing task sets must load unchanged)."""

    model_config = ConfigDict(extra="allow", frozen=True)


class AgentSection(_Table):
    """``[agent]``."""

    timeout_sec: float = Field(600.0, gt=0, le=MAX_SECONDS)
    """Wall-clock limit of the agent phase."""


class VerifierSection(_Table):
    """``[verifier]``."""

    timeout_sec: float = Field(600.0, gt=0, le=MAX_SECONDS)
    """Wall-clock limit of the verifier."""
    env: dict[str, str] = {}
    """Environment variables of the verifier command."""
    environment_mode: Literal["shared", "separate"] = "shared"
    """``shared``: verify in the agent's sandbox; ``separate``: in a fresh sandbox made from a
    snapshot of the agent's final filesystem."""


class EnvironmentSection(_Table):
    """``[environment]``."""

    cpus: float | None = Field(None, gt=0, le=MAX_CPUS)
    """CPU cores."""
    memory_mb: int | None = Field(None, gt=0, le=LIMIT_CAPS["memory_mb"])
    """Memory limit (MiB); Harbor's older ``memory = "2G"`` is accepted too."""
    storage_mb: int | None = Field(None, gt=0, le=LIMIT_CAPS["disk_mb"])
    """Writable disk (MiB); Harbor's older ``storage = "10G"`` is accepted too."""
    network_mode: Literal["none", "loopback", "allow"] = "none"
    """Network policy mode."""
    allowed_hosts: list[str] = []
    """``HOST:PORT`` destinations for ``network_mode = "allow"``."""
    env: dict[str, str] = {}
    """Environment variables of every command in the sandbox."""
    workdir: str | None = None
    """Working directory of the agent and verifier (default: the image's)."""
    docker_image: str | None = None
    """A prebuilt baseline reference used instead of ``environment/Dockerfile``."""

    @field_validator("workdir")
    @classmethod
    def _abs(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError("workdir must be an absolute path")
        return v


class RollboxSection(BaseModel):
    """``[rollbox]``: rollbox's own settings (strict: a typo is an error)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str | None = None
    """Backend for this task (overridden by ``--backend``)."""
    attempts: int | None = Field(None, ge=1, le=10000)
    """Attempts when ``--attempts`` is not given."""
    group_mode: Literal["independent", "snapshot"] = "independent"
    """``snapshot``: set up once, snapshot, start every attempt from it."""
    pass_threshold: float | None = Field(None, allow_inf_nan=False)
    """A rollout passes when its reward is at least this (unset: when it is above 0)."""
    baseline: str | None = None
    """A baseline reference (digest/name) to use instead of ``environment/Dockerfile``."""
    stop_agent_before_verify: bool = False
    """Kill every process the agent left running before a shared-mode verifier starts
    (default: they keep running, so tests can query a server the agent started). On a
    backend that cannot isolate the verifier (gvisor) they are stopped unless this is set
    to ``false`` explicitly (then the rollout is recorded as unprotected)."""


@dataclass(frozen=True)
class Task:
    """A loaded, validated task directory."""

    path: Path
    """The directory (absolute)."""
    name: str
    """``[task] name`` or the directory name."""
    digest: str
    """``sha256:<hex>`` over the directory (paths, modes, contents)."""
    instruction: str
    """Contents of ``instruction.md``."""
    agent: AgentSection
    verifier: VerifierSection
    environment: EnvironmentSection
    rollbox: RollboxSection
    artifacts: tuple[str, ...]
    """Absolute paths inside the sandbox collected after the verifier."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """``[metadata]`` as written."""
    dockerfile: Path | None = None
    """``environment/Dockerfile`` (or ``Containerfile``) when present."""
    ignored_keys: tuple[str, ...] = ()
    """Harbor keys this rollbox does not act on (kept for the record)."""

    @property
    def tests_dir(self) -> Path:
        """``tests/`` (uploaded to ``/tests`` only after the agent finished)."""
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        """``solution/`` (uploaded to ``/solution`` for the ``oracle`` agent)."""
        return self.path / "solution"

    def limits(self) -> Limits:
        """Sandbox limits from ``[environment]`` (rollbox defaults where unset)."""
        base = Limits()
        return Limits(
            cpus=self.environment.cpus if self.environment.cpus is not None else base.cpus,
            memory_mb=self.environment.memory_mb or base.memory_mb,
            disk_mb=self.environment.storage_mb or base.disk_mb,
        )

    def network(self) -> NetworkPolicy:
        """Network policy from ``[environment]``."""
        env = self.environment
        return NetworkPolicy(
            mode=env.network_mode, allow=[HostPort.parse(h) for h in env.allowed_hosts]
        )


def task_digest(path: Path) -> str:
    """sha256 over sorted relative paths, modes and contents of a directory.

    Raises:
        TaskError: unreadable entries, or the directory is larger than ``MAX_TASK_BYTES``.
    """
    h = hashlib.sha256()
    total = 0
    for rel, full in _walk(path):
        st = full.lstat()
        h.update(rel.encode("utf-8", "surrogateescape") + b"\0")
        h.update(f"{stat.S_IFMT(st.st_mode):o}:{stat.S_IMODE(st.st_mode):o}\0".encode())
        if full.is_symlink():
            # A link out of the task would pull host files into the sandbox (instruction,
            # tests, solution are copied in): refused.
            target = (full.parent / os.readlink(full)).resolve()
            root = path.resolve()
            if target != root and root not in target.parents:
                raise TaskError(
                    f"task {path.name}: {rel} is a symlink pointing outside the task directory"
                )
            h.update(os.readlink(full).encode("utf-8", "surrogateescape"))
        elif full.is_file():
            total += st.st_size
            if total > MAX_TASK_BYTES:
                raise TaskError(f"task {path} is larger than {MAX_TASK_BYTES >> 20} MiB")
            try:
                h.update(full.read_bytes())
            except OSError as exc:
                raise TaskError(f"cannot read {full}: {exc.strerror}") from None
        h.update(b"\0")
    return "sha256:" + h.hexdigest()


def _walk(root: Path) -> list[tuple[str, Path]]:
    out: list[tuple[str, Path]] = []
    try:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            d = Path(dirpath)
            for name in [*dirnames, *filenames]:
                full = d / name
                rel = full.relative_to(root).as_posix()
                if rel.startswith(".git/") or rel == ".git" or "__pycache__" in rel.split("/"):
                    continue
                out.append((rel, full))
    except OSError as exc:
        raise TaskError(f"cannot read task directory {root}: {exc}") from None
    out.sort(key=lambda x: x[0])
    return out


def task_tar(path: Path) -> bytes:
    """A deterministic tar of the task directory (the stored copy of the task)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, full in _walk(path):
            info = tar.gettarinfo(str(full), arcname=rel)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.isfile():
                with open(full, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def _fmt_validation(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    return f"{loc}: {err['msg']}" if loc else str(err["msg"])


def _section(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise TaskError(f"task.toml: [{key}] must be a table, got {type(value).__name__}")
    return value


def load_task(path: Path | str) -> Task:
    """Load and validate a Harbor task directory.

    Args:
        path: the task directory.

    Returns:
        The task, with its digest.

    Raises:
        TaskError: the directory, ``instruction.md`` or ``task.toml`` is missing or malformed
            (the message names the file and the field).
    """
    try:
        return _load(Path(path))
    except TaskError:
        raise
    except (OSError, ValueError, TypeError, UnicodeError, RecursionError) as exc:
        # Belt and braces: anything the checks above did not foresee is still one clear line.
        raise TaskError(f"task {path}: {type(exc).__name__}: {exc}") from None


def _load(path: Path) -> Task:
    path = path.absolute()
    if not path.is_dir():
        raise TaskError(f"task directory {path} does not exist", hint="give a Harbor task dir")
    instr = path / "instruction.md"
    if not instr.is_file():
        raise TaskError(f"task {path.name}: instruction.md is missing", hint=f"create {instr}")
    try:
        instruction = instr.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TaskError(f"task {path.name}: instruction.md is not UTF-8 text") from None
    toml_path = path / "task.toml"
    doc: dict[str, Any] = {}
    if toml_path.is_file():
        try:
            doc = tomllib.loads(toml_path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise TaskError(f"task {path.name}: task.toml is not UTF-8 text") from None
        except tomllib.TOMLDecodeError as exc:
            raise TaskError(f"task {path.name}: task.toml is not valid TOML: {exc}") from None
    elif toml_path.exists():
        raise TaskError(f"task {path.name}: task.toml is not a file")

    sections: dict[str, Any] = {}
    for key, model in (
        ("agent", AgentSection),
        ("verifier", VerifierSection),
        ("environment", EnvironmentSection),
        ("rollbox", RollboxSection),
    ):
        raw = dict(_section(doc, key))
        try:
            if key == "environment":
                for old, new in (("memory", "memory_mb"), ("storage", "storage_mb")):
                    if old in raw and new not in raw:
                        raw[new] = _size_mb(raw.pop(old), old)
            sections[key] = model.model_validate(raw)
        except (ValidationError, ValueError) as exc:
            msg = _fmt_validation(exc) if isinstance(exc, ValidationError) else str(exc)
            raise TaskError(f"task {path.name}: task.toml [{key}] {msg}") from None
    env: EnvironmentSection = sections["environment"]
    for hp in env.allowed_hosts:
        try:
            HostPort.parse(hp)
        except ValueError as exc:
            raise TaskError(f"task {path.name}: task.toml [environment] allowed_hosts: {exc}")
    if env.allowed_hosts and env.network_mode != "allow":
        raise TaskError(
            f"task {path.name}: task.toml [environment] allowed_hosts needs network_mode = 'allow'"
        )

    meta = _section(doc, "metadata")
    task_table = _section(doc, "task")
    name = task_table.get("name", path.name)
    if not isinstance(name, str) or not name.strip():
        raise TaskError(f"task {path.name}: task.toml [task] name must be a non-empty string")

    artifacts = doc.get("artifacts", [])
    if not isinstance(artifacts, list) or not all(isinstance(a, str) for a in artifacts):
        raise TaskError(f"task {path.name}: task.toml artifacts must be a list of paths")
    for a in artifacts:
        if not a.startswith("/") or "\0" in a or ".." in a.split("/"):
            raise TaskError(
                f"task {path.name}: task.toml artifacts: {a!r} must be an absolute path "
                "inside the sandbox without '..'"
            )

    dockerfile = None
    for candidate in ("Dockerfile", "Containerfile"):
        p = path / "environment" / candidate
        if p.is_file():
            dockerfile = p
            break

    known = {"task", "metadata", "agent", "verifier", "environment", "rollbox", "artifacts"}
    ignored = sorted(k for k in doc if k not in known)
    for key in ("agent", "verifier", "environment"):
        extra = sections[key].model_extra or {}
        ignored += [f"{key}.{k}" for k in sorted(extra)]

    return Task(
        path=path,
        name=name.strip(),
        digest=task_digest(path),
        instruction=instruction,
        agent=sections["agent"],
        verifier=sections["verifier"],
        environment=env,
        rollbox=sections["rollbox"],
        artifacts=tuple(artifacts),
        metadata=dict(meta),
        dockerfile=dockerfile,
        ignored_keys=tuple(ignored),
    )
