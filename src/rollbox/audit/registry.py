"""The probe registry: each probe is an async function registered with a name."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rollbox.audit.context import AuditContext
from rollbox.audit.models import Status


@dataclass
class Outcome:
    """What a probe function returns."""

    status: Status
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)


ProbeFn = Callable[[AuditContext], Awaitable[Outcome]]


@dataclass(frozen=True)
class Probe:
    """A registered probe."""

    name: str
    category: str
    doc: str
    fn: ProbeFn


PROBES: list[Probe] = []


def probe(name: str, category: str) -> Callable[[ProbeFn], ProbeFn]:
    """Register ``fn`` under ``name``; its docstring's first line describes it."""

    def deco(fn: ProbeFn) -> ProbeFn:
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else name
        PROBES.append(Probe(name, category, doc, fn))
        return fn

    return deco


def verdict(breaches: list[str], ok_summary: str) -> Outcome:
    """``breach`` with the breaches joined when there are any, else ``pass``."""
    if breaches:
        return Outcome("breach", "; ".join(breaches))
    return Outcome("pass", ok_summary)
