"""``--backend auto``: the strongest isolation that works well on this host.

``microvm`` where KVM is usable (the microVM backend's own accelerator probe decides: it boots a
tiny guest, so a ``/dev/kvm`` that opens but cannot run guests does not count), else ``gvisor``
where ``runsc`` works, else ``namespace``. The choice and the reason are printed at the start of
a run and recorded in the run record.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollbox.backends.registry import get_backend, names
from rollbox.config import Home
from rollbox.errors import RollboxError, UnknownBackendError


@dataclass(frozen=True)
class BackendChoice:
    """The backend a run uses and why."""

    name: str
    reason: str


def _kvm_verdict(home: Home) -> tuple[bool, str]:
    """Ask the microVM backend whether KVM is usable; (usable, explanation).

    The backend's ``prepare()`` fetches its guest kernel and runs the accelerator probe once
    per host boot (cached); ``accelerator()`` then says ``kvm`` or ``tcg`` and why.
    """
    try:
        be = get_backend("microvm", home)
    except RollboxError as exc:
        return False, f"microvm backend not available ({exc})"
    try:
        be.prepare()
        return be.hardware_virtualized()
    except RollboxError as exc:
        return False, f"microvm unavailable: {exc.one_line()}"
    except Exception as exc:
        return False, f"microvm probe failed: {type(exc).__name__}: {exc}"


def _works(name: str, home: Home) -> tuple[bool, str]:
    try:
        get_backend(name, home).prepare()
    except RollboxError as exc:
        return False, exc.one_line()
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return True, "ok"


def choose_backend(requested: str, home: Home) -> BackendChoice:
    """Resolve ``requested`` (a backend name or ``auto``) to a backend and a reason.

    Raises:
        UnknownBackendError: ``requested`` is neither ``auto`` nor a registered backend.
    """
    if requested != "auto":
        if requested not in names():
            raise UnknownBackendError(
                f"unknown backend {requested!r}", hint=f"choose one of: {', '.join(names())}, auto"
            )
        return BackendChoice(requested, "requested explicitly")
    reasons: list[str] = []
    kvm, why = _kvm_verdict(home)
    if kvm:
        ok, detail = _works("microvm", home)
        if ok:
            return BackendChoice("microvm", f"KVM is usable ({why})")
        reasons.append(f"microvm: {detail}")
    else:
        reasons.append(f"no microvm: {why}")
    ok, detail = _works("gvisor", home)
    if ok:
        return BackendChoice("gvisor", "; ".join([*reasons, "runsc works"]))
    reasons.append(f"no gvisor: {detail}")
    return BackendChoice("namespace", "; ".join(reasons))
