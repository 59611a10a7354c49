"""Teardown errors surface (issue 15, item 9): destroy and cleanup say what they could not
remove, on every backend; the TTL reaper logs its failures and ``rollbox cleanup`` shows them.

The broken teardowns are real where the host allows it (an immutable file, ``chattr +i``,
in the sandbox directory of a real namespace, gVisor or microVM sandbox: nothing can delete
it) and monkeypatched steps where it does not (a microVM's network and cgroup, a runsc
container that will not go).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rollbox.backends.base import Backend
from rollbox.backends.registry import get_backend
from rollbox.backends.state import read_state, sandbox_dir, write_state
from rollbox.config import Home
from rollbox.errors import BackendError, TeardownError
from rollbox.ids import new_id
from rollbox.models import BaselineInfo, SandboxInfo, SandboxSpec, utcnow
from rollbox.sandbox import AsyncSandbox

pytestmark = pytest.mark.root

ROLLBOX = str(Path(sys.executable).with_name("rollbox"))


@contextmanager
def immutable(path: Path) -> Iterator[Path]:
    """``chattr +i path`` (root cannot delete or replace it either) until the block ends."""
    subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=False)


def _cleanup(home: Home) -> tuple[int, dict[str, object]]:
    out = subprocess.run(
        [ROLLBOX, "cleanup", "--json"],
        env={**os.environ, "ROLLBOX_HOME": str(home.root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout)


def _create(
    home: Home, baseline: BaselineInfo, ttl: float | None = None, backend: str = "namespace"
) -> AsyncSandbox:
    return asyncio.run(AsyncSandbox.create(baseline.digest, backend=backend, ttl=ttl, home=home))


@pytest.mark.parametrize("backend", ["namespace", "gvisor", "microvm"])
def test_destroy_and_cleanup_report_what_stayed(
    sbx_home: Home,
    dev_baseline: BaselineInfo,
    backend: str,
    backend_or_skip: Callable[[str], Backend],
) -> None:
    backend_or_skip(backend)
    sbx = _create(sbx_home, dev_baseline, backend=backend)
    sdir = sandbox_dir(sbx_home, sbx.id)
    with immutable(sdir / "state.json"):
        with pytest.raises(TeardownError) as err:
            asyncio.run(sbx.destroy())
        assert "state.json" in str(err.value) and "not permitted" in str(err.value)
        assert any(sbx.id in e for e in err.value.errors)

        # cleanup finds it (its processes are gone: crashed), fails again, and says so
        code, doc = _cleanup(sbx_home)
        assert code == 1
        assert not any(sbx.id in line for line in doc["removed"]), doc  # type: ignore[attr-defined]
        problems = doc["problems"]
        assert any(sbx.id in p and "state.json" in p for p in problems), doc  # type: ignore[attr-defined]
        assert sdir.exists()
    code, doc = _cleanup(sbx_home)  # the host lets go: now it is removed
    assert code == 0, doc
    assert any(sbx.id in line for line in doc["removed"]), doc  # type: ignore[attr-defined]
    assert not sdir.exists()


def test_namespace_cleanup_without_the_fix_would_claim_removal(
    sbx_home: Home, dev_baseline: BaselineInfo
) -> None:
    """The library call, not the CLI: cleanup_orphans raises TeardownError with the lines of
    what it did remove and the errors, instead of listing the failed sandbox as removed."""
    be = get_backend("namespace", sbx_home)
    sbx = _create(sbx_home, dev_baseline)
    other = _create(sbx_home, dev_baseline)
    for s in (sbx, other):  # both crash (their processes die): both are orphans
        info = read_state(sbx_home, s.id)
        write_state(sbx_home, info.model_copy(update={"owner_pid": 2**22 + 1}))
    with (
        immutable(sandbox_dir(sbx_home, sbx.id) / "state.json"),
        pytest.raises(TeardownError) as err,
    ):
        be.cleanup_orphans()
    assert [e for e in err.value.errors if sbx.id in e]
    assert not [e for e in err.value.errors if other.id in e]
    assert any(other.id in line for line in err.value.removed)
    assert not any(sbx.id in line for line in err.value.removed)
    assert be.cleanup_orphans() is not None  # now it goes
    assert not sandbox_dir(sbx_home, sbx.id).exists()


def _fake_microvm_state(home: Home, baseline: BaselineInfo) -> SandboxInfo:
    """A microvm sandbox record whose VM is gone (no QEMU needed to test the teardown)."""
    sid = new_id("sbx")
    info = SandboxInfo(
        id=sid,
        backend="microvm",
        baseline=baseline.digest,
        spec=SandboxSpec(baseline=baseline.digest, backend="microvm"),
        state="running",
        created_at=utcnow(),
        owner_pid=2**22 + 1,
        extra={"net": {"netns": "rbx-test"}, "qemu_pid": None},
    )
    home.sandboxes.mkdir(parents=True, exist_ok=True)
    sandbox_dir(home, sid).mkdir()
    write_state(home, info)
    (sandbox_dir(home, sid) / "overlay.qcow2").write_bytes(b"x")
    return info


def test_microvm_destroy_reports_network_cgroup_and_dir_failures(
    sbx_home: Home, dev_baseline: BaselineInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollbox.backends.microvm import lifecycle as mvm

    def broken_net(_info: SandboxInfo) -> bool:
        raise BackendError("veth rtest0 is busy (deliberately broken)")

    def broken_cgroup(_home: Home, _sid: str) -> bool:
        raise OSError(16, "Device or resource busy (deliberately broken)")

    monkeypatch.setattr(mvm, "teardown_vm_network", broken_net)
    monkeypatch.setattr(mvm, "_drop_host_cgroup", broken_cgroup)
    be = get_backend("microvm", sbx_home)
    info = _fake_microvm_state(sbx_home, dev_baseline)
    sdir = sandbox_dir(sbx_home, info.id)
    with immutable(sdir / "overlay.qcow2"), immutable(sdir / "state.json"):
        with pytest.raises(TeardownError) as err:
            be.destroy_by_id(info.id)
        text = " | ".join(err.value.errors)
        assert "network: BackendError: veth rtest0 is busy" in text
        assert "cgroup: " in text and "resource busy" in text
        assert "sandbox dir" in text and "Operation not permitted" in text
        # cleanup: reported as errors, the sandbox never listed as removed
        with pytest.raises(TeardownError) as err2:
            be.cleanup_orphans()
        assert any(info.id in e for e in err2.value.errors)
        assert not any("sandbox dir" in r for r in err2.value.removed)
    monkeypatch.undo()
    write_state(sbx_home, info.model_copy(update={"extra": {}}))  # no fake network this time
    assert any("sandbox dir" in r for r in be.destroy_by_id(info.id))  # type: ignore[attr-defined]
    assert not sandbox_dir(sbx_home, info.id).exists()


def test_gvisor_cleanup_reports_a_runsc_container_it_could_not_delete(
    sbx_home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollbox.backends.gvisor.backend import GVisorBackend

    be = get_backend("gvisor", sbx_home)
    assert isinstance(be, GVisorBackend)

    def broken_delete(cid: str) -> None:
        raise BackendError(f"runsc delete {cid}: device busy (deliberately broken)")

    monkeypatch.setattr(be, "list_runsc_containers", lambda: ["sbx-ghost"])
    monkeypatch.setattr(be, "_runsc_delete", broken_delete)
    with pytest.raises(TeardownError) as err:
        be.cleanup_orphans()
    assert err.value.errors == [
        "runsc container sbx-ghost: runsc delete sbx-ghost: device busy (deliberately broken)"
    ]
    assert not any("sbx-ghost" in r for r in err.value.removed)
    assert be.cleanup_orphans(dry_run=True) == ["runsc container sbx-ghost"]


def test_reaper_logs_failures_and_cleanup_shows_them(
    sbx_home: Home, dev_baseline: BaselineInfo
) -> None:
    from rollbox.backends import reaper

    sbx = _create(sbx_home, dev_baseline, ttl=1.5)
    state = sandbox_dir(sbx_home, sbx.id) / "state.json"
    with immutable(state):
        deadline = time.monotonic() + 30
        while not reaper.read_failures(sbx_home) and time.monotonic() < deadline:
            time.sleep(0.2)
        failures = reaper.read_failures(sbx_home)
        assert failures, "the reaper's failure was not logged"
        assert failures[0]["sandbox"] == sbx.id
        assert "state.json" in str(failures[0]["error"])
        code, doc = _cleanup(sbx_home)
        assert code == 1  # still cannot be removed: an error, not a removal
        shown = doc["reaper_failures"]
        assert any(f["sandbox"] == sbx.id for f in shown)  # type: ignore[attr-defined]
    code, doc = _cleanup(sbx_home)
    assert code == 0, doc
    assert not sandbox_dir(sbx_home, sbx.id).exists()
    # shown once, then kept aside (the record of what failed is not lost)
    assert sbx.id in (sbx_home.root / "reaper-failures.seen.jsonl").read_text()
