"""What each pilot rollout runs once its sandbox is up.

Built-in workloads (``NAME`` or ``NAME:ARG``):

* ``sleep[:SECONDS]`` — ``sleep`` (default 0.05 s): provisioning-bound;
* ``cpu[:SECONDS]`` — a python3 busy loop (default 0.2 s): CPU-bound;
* ``disk[:MB]`` — ``dd`` of MB MiB (default 16) into the sandbox's writable layer, fsynced.

Anything else that names a directory is a Harbor task directory, run by the rollout runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rollbox.errors import InvalidInputError

_DEFAULTS = {"sleep": 0.05, "cpu": 0.2, "disk": 16.0}


@dataclass(frozen=True)
class Workload:
    """A parsed ``--workload`` value."""

    kind: str
    """``sleep``, ``cpu``, ``disk`` or ``task``."""
    arg: float = 0.0
    """Seconds (sleep, cpu) or MiB (disk)."""
    task_dir: Path | None = None
    """The task directory for ``task``."""

    @property
    def label(self) -> str:
        """Short human name, e.g. ``sleep:0.05`` or the task directory's name."""
        if self.kind == "task":
            return f"task:{self.task_dir.name if self.task_dir else '?'}"
        return f"{self.kind}:{self.arg:g}"

    def command(self) -> list[str]:
        """The argv run in the sandbox (built-in workloads only)."""
        if self.kind == "sleep":
            return ["sleep", f"{self.arg:g}"]
        if self.kind == "cpu":
            code = (
                "import time\n"
                f"end = time.perf_counter() + {self.arg!r}\n"
                "n = 0\n"
                "while time.perf_counter() < end:\n"
                "    n += 1\n"
                "print(n)\n"
            )
            return ["python3", "-c", code]
        if self.kind == "disk":
            mb = max(1, int(self.arg))
            return [
                "sh",
                "-c",
                f"dd if=/dev/zero of=/tmp/pilot-disk.bin bs=1M count={mb} conv=fsync "
                "2>/dev/null && rm -f /tmp/pilot-disk.bin",
            ]
        raise InvalidInputError(f"workload {self.kind!r} has no command")

    def timeout(self) -> float:
        """A generous exec timeout for the built-in workload."""
        if self.kind in ("sleep", "cpu"):
            return 30.0 + self.arg * 20
        return 120.0


def parse_workload(text: str) -> Workload:
    """Parse ``--workload``.

    Raises:
        InvalidInputError: neither a built-in workload nor an existing task directory.
    """
    name, sep, arg = text.partition(":")
    if name in _DEFAULTS:
        value = _DEFAULTS[name]
        if sep:
            try:
                value = float(arg)
            except ValueError:
                raise InvalidInputError(
                    f"bad workload argument {arg!r} in {text!r}",
                    hint=f"use {name}:NUMBER, e.g. {name}:{_DEFAULTS[name]:g}",
                ) from None
            if not 0 <= value <= 3600:  # also refuses nan
                raise InvalidInputError(f"workload argument out of range (0..3600): {text!r}")
        return Workload(kind=name, arg=value)
    path = Path(text)
    if path.is_dir():
        if not (path / "task.toml").is_file() and not (path / "instruction.md").is_file():
            raise InvalidInputError(
                f"{text!r} is a directory but not a Harbor task (no task.toml/instruction.md)"
            )
        return Workload(kind="task", task_dir=path.resolve())
    raise InvalidInputError(
        f"unknown workload {text!r}", hint="use sleep[:S], cpu[:S], disk[:MB] or a task directory"
    )
