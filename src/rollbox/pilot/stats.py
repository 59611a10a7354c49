"""Order statistics over latency samples (no numpy needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rollbox.models import Model


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks.

    Raises:
        ValueError: no samples, or ``q`` outside 0..100.
    """
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile out of range: {q}")
    xs = sorted(samples)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return xs[lo]
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class Summary(Model):
    """Percentiles of one series of durations, in milliseconds."""

    n: int
    """Number of samples."""
    p50_ms: float | None = None
    """Median."""
    p95_ms: float | None = None
    """95th percentile."""
    p99_ms: float | None = None
    """99th percentile."""
    mean_ms: float | None = None
    """Arithmetic mean."""
    min_ms: float | None = None
    """Smallest sample."""
    max_ms: float | None = None
    """Largest sample."""


def summarize(seconds: Sequence[float]) -> Summary:
    """Summary (in ms) of durations given in seconds; an empty series gives ``n=0``."""
    if not seconds:
        return Summary(n=0)
    ms = [s * 1000.0 for s in seconds]
    return Summary(
        n=len(ms),
        p50_ms=round(percentile(ms, 50), 3),
        p95_ms=round(percentile(ms, 95), 3),
        p99_ms=round(percentile(ms, 99), 3),
        mean_ms=round(sum(ms) / len(ms), 3),
        min_ms=round(min(ms), 3),
        max_ms=round(max(ms), 3),
    )


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` rounded to 2 decimals, or ``None`` when either is missing or ``b`` is 0."""
    if a is None or b is None or b <= 0:
        return None
    return round(a / b, 2)
