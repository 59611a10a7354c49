"""Host-state comparisons scoped to one rollbox home.

Other homes' sandboxes (other users, other test runs) may come and go on the same host
while a pilot or audit runs, so a raw :meth:`HostState.diff` can show resources that are
not ours. A resource is *ours* when its name carries the home's tag (cgroups, netns, veths,
iptables chains), its path lies under the home (mounts, sandbox dirs) or, for processes,
its command line names the home or the tag.
"""

from __future__ import annotations

from pathlib import Path

from rollbox.config import Home
from rollbox.hoststate import HostState


def _cmdline(pid: str) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _ours(kind: str, item: str, home: Home) -> bool:
    root = str(home.root)
    tag = home.tag
    if kind == "sandbox_dirs":
        return True
    if kind == "mounts":
        return root in item or tag in item
    if kind == "processes":
        pid = item.split(" ", 1)[0]
        text = _cmdline(pid)
        if not text:  # gone meanwhile: it did not survive, so it did not leak
            return False
        return root in text or tag in text
    # cgroups, netns, links, chains: named with the tag (veth names are short: prefix of it)
    return tag in item or tag[:6] in item


def scoped_leaks(before: HostState, after: HostState, home: Home) -> dict[str, list[str]]:
    """Resources of ``home`` present in ``after`` and not in ``before``, by kind."""
    out: dict[str, list[str]] = {}
    for kind, items in before.diff(after).items():
        mine = [x for x in items if _ours(kind, x, home)]
        if mine:
            out[kind] = mine
    return out


def capture(home: Home) -> HostState:
    """The host state now, with ``home``'s sandbox directories."""
    return HostState.capture(home.sandboxes)
