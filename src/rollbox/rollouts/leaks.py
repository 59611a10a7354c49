"""The run's cleanup check: host resources its sandboxes left behind."""

from __future__ import annotations

from pathlib import Path

from rollbox.backends.common import network
from rollbox.config import Home
from rollbox.hoststate import HostState


def _marks(home: Home, ids: set[str]) -> list[str]:
    """Strings that name host resources of these sandboxes: their ids (mounts, cgroups,
    sandbox dirs, runtime command lines) and their network names (netns, veth, chain)."""
    marks = list(ids)
    for sid in ids:
        marks += [
            network.netns_name(home.tag, sid),
            network.host_if_name(home.tag, sid),
            network.chain_name(home.tag, sid),
        ]
    return marks


def _leftovers(before: HostState, after: HostState, home: Home, ids: set[str]) -> list[str]:
    """Resources in ``after`` not in ``before`` that belong to this run's sandboxes (other
    runs and tests share the host, even the home: only what names our sandboxes counts)."""
    out: list[str] = []
    marks = _marks(home, ids)
    for kind, items in before.diff(after).items():
        for item in items:
            if kind == "processes":
                pid = item.split(" ", 1)[0]
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                except OSError:
                    continue  # gone by now: not a leak
                if any(m.encode() in cmdline for m in marks):
                    out.append(f"{kind}: {item}")
            elif any(m in item for m in marks):
                out.append(f"{kind}: {item}")
    for sid in ids:  # a sandbox dir that outlived its rollout, even if it predates the run
        if (home.sandboxes / sid).exists() and f"sandbox_dirs: {sid}" not in out:
            out.append(f"sandbox_dirs: {sid}")
    return out
