"""The disk-limit preflight against what the host can hold (no root needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbox.backends.common.hostlimits import (
    check_disk,
    free_disk_mb,
    tmpfs_capacity_mb,
)
from rollbox.errors import LimitsError
from rollbox.models import Limits


def test_tmpfs_capacity_is_ram_plus_swap(tmp_path: Path) -> None:
    fake = tmp_path / "meminfo"
    fake.write_text("MemTotal:  2097152 kB\nMemFree: 1 kB\nSwapTotal:  1048576 kB\n")
    assert tmpfs_capacity_mb(fake) == 3072
    assert tmpfs_capacity_mb() > 0


def test_tmpfs_backed_disk_beyond_ram_and_swap_is_refused() -> None:
    cap = tmpfs_capacity_mb()
    check_disk(Limits(disk_mb=min(cap, 256)), "tmpfs")
    check_disk(Limits(disk_mb=None), "tmpfs")
    with pytest.raises(LimitsError, match=r"disk_mb=\d+ exceeds this host's RAM \+ swap"):
        check_disk(Limits(disk_mb=cap + 1), "tmpfs")


def test_file_backed_disk_beyond_free_space_is_refused(tmp_path: Path) -> None:
    free = free_disk_mb(tmp_path)
    assert free > 0
    # a home that does not exist yet is measured at its nearest existing parent
    home = tmp_path / "not" / "yet"
    assert free_disk_mb(home) == pytest.approx(free, abs=64)
    check_disk(Limits(disk_mb=1), "file", home)
    with pytest.raises(LimitsError, match=rf"exceeds the free disk under {home}"):
        check_disk(Limits(disk_mb=free + 1024), "file", home)


@pytest.mark.parametrize("backend", ["namespace", "gvisor", "microvm"])
def test_backends_preflight_refuses_a_disk_the_host_cannot_hold(
    backend: str, tmp_path: Path
) -> None:
    from rollbox.backends.registry import backend_class
    from rollbox.config import Home
    from rollbox.models import SandboxSpec

    be = backend_class(backend)(Home(tmp_path / "home"))
    huge = max(tmpfs_capacity_mb(), free_disk_mb(tmp_path)) + 1024
    spec = SandboxSpec(baseline="sha256:" + "0" * 64, backend=backend)
    be.check(spec)  # the default limits fit
    with pytest.raises(LimitsError, match=rf"disk_mb={huge} exceeds"):
        be.check(spec.model_copy(update={"limits": Limits(disk_mb=huge)}))
