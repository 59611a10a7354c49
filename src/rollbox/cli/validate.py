"""Range checks of the CLI's numeric options, as typer callbacks.

Each factory returns a callback that passes a good value through and raises
:class:`~rollbox.errors.InvalidInputError` (one line, exit 2) for nan, inf, a negative, zero
where it means nothing, or a number so large it would overflow a timer or a kernel limit.
The check runs while the command line is parsed, so nothing has started when it fails.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from rollbox.errors import InvalidInputError
from rollbox.models import LIMIT_CAPS, MAX_CPUS, MAX_SECONDS, MAX_TTL_S

MAX_CONCURRENCY = 1024
"""Most rollouts (or sandboxes) at once that a command accepts."""

MAX_COUNT = 1_000_000
"""Ceiling of plain counts (attempts, cycles, samples): far beyond any sane run."""

MAX_FORKS = 256
"""Most sandboxes one ``fork`` makes."""

SEED_BITS = 63
"""Seeds are signed 64-bit integers (they cross JSON, SQL and other languages)."""


def _fmt(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def int_range(option: str, lo: int, hi: int) -> Callable[[int | None], int | None]:
    """A callback accepting ``None`` or an integer in ``lo..hi``."""

    def check(value: int | None) -> int | None:
        if value is not None and value < lo:
            least = "0 or more" if lo == 0 else f"at least {lo}"
            raise InvalidInputError(f"{option} must be {least}, got {value}")
        if value is not None and value > hi:
            raise InvalidInputError(f"{option} must be at most {hi}, got {value}")
        return value

    return check


def positive_float(option: str, hi: float) -> Callable[[float | None], float | None]:
    """A callback accepting ``None`` or a finite number in ``(0, hi]``."""

    def check(value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and 0 < value <= hi):
            raise InvalidInputError(
                f"{option} must be a number > 0 and at most {_fmt(hi)}, got {_fmt(value)}"
            )
        return value

    return check


def seconds(option: str) -> Callable[[float | None], float | None]:
    """A callback for a duration in seconds: finite, > 0, at most ``MAX_SECONDS`` (30 days)."""
    return positive_float(option, MAX_SECONDS)


def ttl(option: str = "--ttl") -> Callable[[float | None], float | None]:
    """A callback for a sandbox TTL in seconds: finite, > 0, at most ``MAX_TTL_S``."""
    return positive_float(option, MAX_TTL_S)


def cpus(option: str = "--cpus") -> Callable[[float | None], float | None]:
    """A callback for a CPU quota in cores."""
    return positive_float(option, MAX_CPUS)


def limit(option: str, field: str) -> Callable[[int | None], int | None]:
    """A callback for an integer sandbox limit (``memory_mb``, ``disk_mb``, ``pids``...)."""
    return int_range(option, 1, LIMIT_CAPS[field])


def seed(option: str = "--seed") -> Callable[[int | None], int | None]:
    """A callback for a signed 64-bit seed."""
    return int_range(option, -(1 << SEED_BITS), (1 << SEED_BITS) - 1)
