"""Who is to blame for a rollout's error, and whether it is worth a retry.

The default rule (see :mod:`rollbox.rollouts.runner`): a
:class:`~rollbox.errors.BackendError` is the infrastructure's (``infra_error``, retried),
another :class:`~rollbox.errors.RollboxError` is the task's, anything else is an internal
error. Sandbox limits change it:

* a limit reached **in the agent phase** (``oom_killed``, ``pids_exhausted``, ``disk_full``,
  ``ttl_expired``; see :mod:`rollbox.backends.common.reasons`) makes the agent responsible
  for whatever fails afterwards -- the sandbox the agent's memory hog took down (gVisor), the
  tests that could not be uploaded to the disk it filled, the reward the verifier could not
  write -- ``failed``/``agent``, never retried;
* a limit reached in the verifier phase (the agent's were fine) is the verifier's;
* a TTL that expires outside the agent phase stays an infrastructure error (the rollout's
  sandboxes live the agent's and the verifier's time budgets plus a margin, so only rollbox
  itself can use that up).

A rollout that succeeds despite a limit (the agent retried with less memory, the verifier
passed) stays ``done``; its record lists the reasons all the same.
"""

from __future__ import annotations

from collections.abc import Iterable

from rollbox.backends.base import SandboxHandle
from rollbox.backends.common.reasons import REASONS, seen
from rollbox.errors import BackendError, RollboxError
from rollbox.models import ErrorKind, LimitReason, Limits, RolloutRecord, RolloutStatus

AGENT = "agent"
VERIFY = "verify"


def limit_text(reason: str, limits: Limits | None) -> str:
    """What reaching ``reason`` means, with the limit's value, e.g. ``was OOM-killed at its
    memory limit (memory_mb=64)``."""
    lim = limits or Limits()
    if reason == "oom_killed":
        return f"was OOM-killed at its memory limit (memory_mb={lim.memory_mb})"
    if reason == "pids_exhausted":
        return f"could not fork: it reached its process limit (pids={lim.pids})"
    if reason == "disk_full":
        return f"filled the sandbox's disk (disk_mb={lim.disk_mb})"
    if reason == "ttl_expired":
        return "outlived the sandbox's TTL"
    return reason


def note(rec: RolloutRecord, reasons: Iterable[str], phase: str) -> None:
    """Add ``reasons`` reached in ``phase`` to the record (each once: the first phase stays)."""
    new = [r for r in reasons if r in REASONS and r not in rec.reasons]
    if not new:
        return
    found: list[LimitReason] = [r for r in REASONS if r in new]
    rec.reasons = [*rec.reasons, *found]
    rec.reason_phases = {**rec.reason_phases, **{r: phase for r in found}}


def note_handles(rec: RolloutRecord, handles: Iterable[SandboxHandle], phase: str) -> None:
    """Add what the commands of ``handles`` ran into so far, as reached in ``phase``."""
    for h in handles:
        note(rec, seen(h), phase)


def current_phase(rec: RolloutRecord) -> str:
    """The phase the rollout is in (the last one stamped)."""
    return rec.phases[-1].phase if rec.phases else "queued"


def agent_reasons(rec: RolloutRecord) -> list[str]:
    """The limits the agent reached (in the agent phase)."""
    return [r for r in rec.reasons if rec.reason_phases.get(r) == AGENT]


def agent_text(rec: RolloutRecord) -> str:
    """``the agent was OOM-killed at ... and filled ...`` for the agent's reasons."""
    parts = [limit_text(r, rec.limits) for r in agent_reasons(rec)]
    return "the agent " + " and ".join(parts)


def classify(
    rec: RolloutRecord, exc: Exception, phase: str
) -> tuple[RolloutStatus, ErrorKind, str]:
    """Status, blamed party and one-line message of a rollout that raised ``exc`` in
    ``phase`` (the record's reasons are updated with the error's own reason first)."""
    reason = exc.reason if isinstance(exc, BackendError) else None
    if reason is not None:
        note(rec, [reason], phase)
    text = exc.one_line() if isinstance(exc, RollboxError) else f"{type(exc).__name__}: {exc}"
    if agent_reasons(rec):
        if reason is not None and phase == AGENT:
            return "failed", "agent", f"{agent_text(rec)}: {text}"
        return "failed", "agent", f"{agent_text(rec)}; then: {text}"
    if reason is not None and reason != "ttl_expired" and phase == VERIFY:
        what = limit_text(reason, rec.limits)
        return "failed", "verifier", f"the verifier {what}: {text}"
    if isinstance(exc, BackendError):
        return "infra_error", "infra", text
    if isinstance(exc, RollboxError):
        return "failed", "task", text
    return "failed", "infra", f"internal error: {text}"


def agent_failure(rec: RolloutRecord, error: str) -> str:
    """The agent's own failure (timeout, crash) with the limits it reached, if any."""
    return f"{error} ({agent_text(rec)})" if agent_reasons(rec) else error


def verifier_error(rec: RolloutRecord, error: str) -> tuple[ErrorKind, str]:
    """Who is to blame for the verifier's giving no reward (``error``): the agent when it
    reached a limit (a full disk leaves no room for the reward), else the verifier."""
    if agent_reasons(rec):
        return "agent", f"{agent_text(rec)}; then: {error}"
    return "verifier", error


def retryable(rec: RolloutRecord) -> bool:
    """True when the rollout ended in an infrastructure error that a fresh sandbox may not
    repeat (never when the agent reached a sandbox limit)."""
    return rec.status == "infra_error" and not agent_reasons(rec)
