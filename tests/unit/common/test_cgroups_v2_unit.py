"""cgroup v2 base selection and the missing-controller error, on a fake cgroup tree (the
real behaviour is proven inside a cgroup-v2 guest by ``tests/v2``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbox.backends.common import cgroup_base, cgroups, cgroups_v2
from rollbox.errors import BackendUnavailableError


@pytest.fixture
def fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    monkeypatch.setattr(cgroup_base, "CGROUP_ROOT", root)
    cgroup_base._version.cache_clear()
    yield root
    cgroup_base._version.cache_clear()


def _unit(root: Path, rel: str, controllers: str) -> Path:
    d = root / rel
    d.mkdir(parents=True)
    (d / "cgroup.controllers").write_text(controllers + "\n")
    (d / "cgroup.type").write_text("domain\n")
    (d / "cgroup.subtree_control").write_text("")
    (d / "cgroup.procs").write_text("")
    return d


def test_a_unified_root_picks_v2(fake_root: Path) -> None:
    assert cgroups.cgroup_version() == 2


def test_missing_controllers_are_named_with_the_fix(
    fake_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _unit(fake_root, "system.slice/x.service", "cpu pids")
    monkeypatch.setattr(cgroups_v2, "_own_cgroup", lambda: "/system.slice/x.service")
    with pytest.raises(BackendUnavailableError) as exc:
        cgroups.require_cgroups()
    text = exc.value.one_line()
    assert "the memory controller is not delegated" in text
    assert "system.slice/x.service" in text
    assert "systemd-run --scope -p Delegate=yes" in text
    assert exc.value.exit_code == 2


def test_base_is_the_parent_of_rollboxs_own_leaf(
    fake_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cgroups_v2, "_own_cgroup", lambda: f"/a/b/{cgroups_v2.LEAF}")
    assert cgroups_v2.base_dir() == fake_root / "a" / "b"
    monkeypatch.setattr(cgroups_v2, "_own_cgroup", lambda: "/")
    assert cgroups_v2.base_dir() == fake_root
    assert cgroups_v2.is_root(fake_root)
    assert not cgroups_v2.is_root(_unit(fake_root, "c", "memory pids"))


def test_no_hierarchy_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroup_base, "CGROUP_ROOT", tmp_path)
    cgroup_base._version.cache_clear()
    try:
        with pytest.raises(BackendUnavailableError, match="no usable cgroup hierarchy"):
            cgroups.cgroup_version()
    finally:
        cgroup_base._version.cache_clear()


def test_a_refused_limit_is_a_limits_error_naming_it(fake_root: Path) -> None:
    from rollbox.errors import LimitsError
    from rollbox.models import Limits

    d = fake_root / "g"
    (d / "pids.max").mkdir(parents=True)  # writing it fails, as a refused write would
    cg = cgroups_v2.CgroupV2("rollbox-t/sbx-x", dict.fromkeys(cgroups.CONTROLLERS, d))
    with pytest.raises(LimitsError, match=r"the kernel refused pids\.max=5 for cgroup"):
        cg.apply(Limits(cpus=None, memory_mb=None, pids=5))
