"""The conformance suite, run against every local backend."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rollbox.backends.base import Backend
from rollbox.backends.conformance import CHECKS, run_check_sync
from rollbox.models import BaselineInfo

pytestmark = pytest.mark.root

BACKENDS = ["namespace", "gvisor", "microvm"]


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_conformance(
    backend: str,
    check: str,
    backend_or_skip: Callable[[str], Backend],
    dev_baseline: BaselineInfo,
) -> None:
    be = backend_or_skip(backend)
    run_check_sync(check, be, dev_baseline)
