"""A baseline without python3 is refused with one clear line before any VM starts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rollbox.backends.microvm import MicroVMBackend
from rollbox.baselines.store import BaselineStore
from rollbox.config import Home
from rollbox.errors import CapabilityError
from rollbox.models import SandboxSpec

pytestmark = pytest.mark.vm


def test_baseline_without_python_is_refused(
    vm_backend: MicroVMBackend, vm_home: Home, tmp_path: Path
) -> None:
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "hostname").write_text("nopython\n")
    info = BaselineStore(vm_home).import_rootfs(root)
    spec = SandboxSpec(baseline=info.digest, backend="microvm")
    with pytest.raises(CapabilityError, match="no /usr/bin/python3") as exc:
        asyncio.run(vm_backend.create(spec, info))
    assert "\n" not in str(exc.value)
    assert vm_backend.list_sandboxes() == []
