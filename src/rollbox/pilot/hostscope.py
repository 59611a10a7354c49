"""Host-state comparisons scoped to the sandboxes one pilot or audit made.

Other processes — other homes, and other users of the *same* home (tests share one) — may
create and destroy sandboxes while a pilot or audit runs, so a raw :meth:`HostState.diff`
shows resources that are not ours. With ``ids`` (the sandboxes we created), a resource is
ours when its name or path carries one of those ids, or is one of the network names derived
from them (netns, veth, iptables chain), or, for a process, its command line names one.
Without ``ids`` the scope is the whole home: its tag in names, its root in paths.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rollbox.config import Home
from rollbox.hoststate import HostState


def _cmdline(pid: str) -> str:
    try:
        data = Path(f"/proc/{pid}/cmdline").read_bytes()
        return data.replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _network_names(home: Home, ids: Iterable[str]) -> set[str]:
    try:
        from rollbox.backends.common import network as net
    except ImportError:
        return set()
    out: set[str] = set()
    for i in ids:
        out |= {
            net.netns_name(home.tag, i),
            net.host_if_name(home.tag, i),
            net.chain_name(home.tag, i),
        }
    return out


def _ours(kind: str, item: str, home: Home, marks: list[str], names: set[str]) -> bool:
    if kind == "processes":
        text = _cmdline(item.split(" ", 1)[0])
        # gone meanwhile: it did not survive, so it did not leak
        return bool(text) and any(m in text for m in marks)
    if kind in ("netns", "links", "chains") and item in names:
        return True
    return any(m in item for m in marks)


def scoped_leaks(
    before: HostState, after: HostState, home: Home, ids: Iterable[str] | None = None
) -> dict[str, list[str]]:
    """Resources in ``after`` and not in ``before`` that belong to ``ids`` (our sandboxes)
    or, when ``ids`` is None, to ``home``; by kind."""
    id_list = sorted(set(ids)) if ids is not None else None
    if id_list is None:
        marks = [str(home.root), home.tag]
        names: set[str] = set()
    else:
        marks = id_list
        names = _network_names(home, id_list)
    out: dict[str, list[str]] = {}
    if id_list is not None and not id_list:
        return out
    for kind, items in before.diff(after).items():
        if kind == "sandbox_dirs" and id_list is None:
            mine = list(items)
        else:
            mine = [x for x in items if _ours(kind, x, home, marks, names)]
        if mine:
            out[kind] = mine
    return out


def capture(home: Home) -> HostState:
    """The host state now, with ``home``'s sandbox directories."""
    return HostState.capture(home.sandboxes)
