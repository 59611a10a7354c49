"""Results of an audit."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from rollbox.models import Model

Status = Literal["pass", "breach", "skip", "error"]


class ProbeResult(Model):
    """The outcome of one probe."""

    name: str
    """Probe name, e.g. ``cross-sandbox-files``."""
    category: str
    """``conformance``, ``kernel``, ``network``, ``host`` or ``store``."""
    status: Status
    """``pass``; ``breach`` (isolation failed); ``skip`` (not applicable, with the reason);
    ``error`` (the probe could not run: that proves nothing)."""
    summary: str
    """One line saying what was checked and what was seen."""
    evidence: dict[str, Any] = {}
    """What was observed (command outputs, errno names, host-side listings)."""
    duration_s: float = 0.0
    """How long the probe took."""


class AuditReport(Model):
    """The whole audit (what ``--json`` prints)."""

    kind: Literal["rollbox-audit"] = "rollbox-audit"
    """Document type."""
    backend: str
    """Backend audited."""
    backend_version: str = ""
    """Its tool's version."""
    baseline: str
    """Baseline digest the sandboxes started from."""
    started_at: datetime
    """Start (UTC)."""
    finished_at: datetime
    """End (UTC)."""
    probes: list[ProbeResult]
    """Every probe, in the order run."""
    breaches: int
    """Probes with status ``breach``."""
    errors: int
    """Probes with status ``error``."""
    passed: int
    """Probes with status ``pass``."""
    skipped: int
    """Probes with status ``skip``."""
    kernel: dict[str, Any] = {}
    """Whose kernel runs the sandboxes (boot id inside vs the host's): kernel-surface probes
    count an accepted mount/bpf/device read/TIOCSTI as a breach only on the host's kernel."""
    host_leaks: dict[str, list[str]] = {}
    """Resources of this home left on the host after the audit (should be empty)."""

    @property
    def ok(self) -> bool:
        """No breach, no probe error, nothing left behind."""
        return self.breaches == 0 and self.errors == 0 and not self.host_leaks
