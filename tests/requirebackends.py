"""``ROLLBOX_REQUIRE_BACKENDS``: a backend that cannot run is a failure, not a skip.

Every fixture that used to skip when a backend is unavailable calls
:func:`backend_unavailable` instead (importable as ``requirebackends``: pytest puts
``tests/`` on ``sys.path``). With ``ROLLBOX_REQUIRE_BACKENDS=namespace,gvisor,microvm``
(``.ci/run`` and ``make test`` set it on the machine kind CI runs on), such a test fails
and names the reason; without it, the test is skipped and the session ends with one line
per skipped backend (see ``pytest_terminal_summary`` in ``tests/conftest.py``).
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

ENV = "ROLLBOX_REQUIRE_BACKENDS"
KNOWN = ("namespace", "gvisor", "microvm")

SKIPPED: dict[str, str] = {}
"""Backend -> the first reason it was skipped in this session."""


def required_backends() -> set[str]:
    """The backends ``ROLLBOX_REQUIRE_BACKENDS`` names (``all`` = every known one).

    Raises:
        pytest.UsageError: a name that is no backend.
    """
    raw = os.environ.get(ENV, "")
    names = {n.strip() for n in raw.split(",") if n.strip()}
    if "all" in names:
        names = (names - {"all"}) | set(KNOWN)
    unknown = sorted(names - set(KNOWN))
    if unknown:
        raise pytest.UsageError(
            f"{ENV}: unknown backend {', '.join(unknown)}; use a comma list of {', '.join(KNOWN)}"
        )
    return names


def backend_unavailable(backend: str, reason: object) -> NoReturn:
    """Skip the test because ``backend`` cannot run here, or fail it when required.

    Args:
        backend: ``namespace``, ``gvisor`` or ``microvm``.
        reason: why (usually the ``BackendUnavailableError``).
    """
    text = str(reason).replace("\n", " ").strip()
    if backend in required_backends():
        pytest.fail(f"backend {backend} is required ({ENV}) but unavailable: {text}", pytrace=False)
    SKIPPED.setdefault(backend, text)
    pytest.skip(f"backend {backend} unavailable: {text}")


def summary_lines() -> list[str]:
    """One line per backend skipped in this session."""
    return [
        f"rollbox: backend {b} was SKIPPED ({r}); set {ENV}={b} to make that a failure"
        for b, r in sorted(SKIPPED.items())
    ]
