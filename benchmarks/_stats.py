"""Summary statistics shared by the benchmark scripts (imported as a sibling module)."""

from __future__ import annotations

import statistics


def stats_ms(xs: list[float], digits: int = 2) -> dict[str, float]:
    """Median, p99 (nearest rank) and mean of durations in seconds, as milliseconds."""
    s = sorted(xs)
    p99 = s[min(len(s) - 1, max(0, round(0.99 * len(s)) - 1))]
    return {
        "p50_ms": round(statistics.median(s) * 1000, digits),
        "p99_ms": round(p99 * 1000, digits),
        "mean_ms": round(statistics.fmean(s) * 1000, digits),
        "n": len(s),
    }
