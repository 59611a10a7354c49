"""The conformance harness: sandboxes made through the contract only, reaped at the end; the
assertion helper and the host-state diff scoped to one home."""

from __future__ import annotations

import contextlib
from pathlib import Path

from rollbox.backends.base import Backend, SandboxHandle
from rollbox.config import Home
from rollbox.errors import (
    RollboxError,
)
from rollbox.hoststate import HostState
from rollbox.models import BaselineInfo, SandboxSpec


def check(cond: object, message: str) -> None:
    """``assert`` that survives ``python -O``."""
    if not cond:
        raise AssertionError(message)


def scoped_diff(before: HostState, after: HostState, home: Home) -> dict[str, list[str]]:
    """Leaks between two host states that belong to ``home`` (other homes' sandboxes,
    made concurrently by other processes, are ignored)."""
    marks = (home.tag, str(home.root))
    out: dict[str, list[str]] = {}
    for kind, items in before.diff(after).items():
        if kind == "processes":
            mine = [i for i in items if _proc_in_home(int(i.split()[0]), home.tag)]
        elif kind == "sandbox_dirs":
            mine = list(items)
        else:
            mine = [i for i in items if any(m in i for m in marks)]
        if mine:
            out[kind] = mine
    return out


def _proc_in_home(pid: int, tag: str) -> bool:
    try:
        return f"rollbox-{tag}" in Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False


class Harness:
    """Creates sandboxes of one backend from one baseline, and reaps them all at the end."""

    def __init__(self, backend: Backend, baseline: BaselineInfo) -> None:
        self.backend = backend
        self.baseline = baseline
        self.home = backend.home
        self.made: list[SandboxHandle] = []

    async def create(self, **kwargs: object) -> SandboxHandle:
        """A new sandbox; ``kwargs`` are :class:`SandboxSpec` fields."""
        spec = SandboxSpec(baseline=self.baseline.digest, backend=self.backend.name, **kwargs)  # type: ignore[arg-type]
        self.backend.check(spec)
        self.backend.prepare()
        h = await self.backend.create(spec, self.baseline)
        self.made.append(h)
        return h

    def track(self, handles: list[SandboxHandle]) -> list[SandboxHandle]:
        """Reap these too at :meth:`close`."""
        self.made.extend(handles)
        return handles

    def layer_dirs(self, digest: str | None = None) -> list[Path]:
        """The unpacked layer directories of a baseline (default: the harness's)."""
        from rollbox.baselines.store import BaselineStore

        return BaselineStore(self.home).layer_dirs(digest or self.baseline.digest)

    async def close(self) -> None:
        """Destroy every sandbox made through this harness."""
        for h in self.made:
            with contextlib.suppress(RollboxError):
                await h.destroy()
        self.made.clear()


async def sh(h: SandboxHandle, script: str, **kwargs: object) -> str:
    """Run ``script`` with ``/bin/sh -c`` and return stdout; fail on a non-zero exit."""
    r = await h.exec(script, **kwargs)  # type: ignore[arg-type]
    check(r.exit_code == 0, f"{script!r} exited {r.exit_code}: {r.stderr.strip()[-300:]}")
    return r.stdout
