"""microVM-specific behaviour: exec basics, memory snapshots (restore keeps a running
process, branches diverge, fresh RNG, current clock), corrupt snapshots refused, a killed
QEMU detected, nothing left behind. One VM is booted for the module and reused (boots are
seconds under TCG)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollbox.backends.conformance import scoped_diff
from rollbox.backends.microvm import MicroVMBackend, MicroVMSandbox
from rollbox.backends.microvm import snapshot as snaps
from rollbox.backends.microvm.qemu import find_processes, proc_name
from rollbox.config import Home
from rollbox.errors import CorruptionError, SandboxCrashedError, SandboxStateError
from rollbox.hoststate import HostState
from rollbox.ids import new_id
from rollbox.models import BaselineInfo, Limits, SandboxSpec

pytestmark = [pytest.mark.vm, pytest.mark.slow]

# write-then-rename so a reader never sees the file truncated between two values
COUNTER = (
    "setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; "
    "mv /tmp/count.new /tmp/count; sleep 0.05; done' >/dev/null 2>&1 &"
)


async def read_count(h: MicroVMSandbox) -> int:
    """The counter's current value, waiting (bounded) for its first write."""
    for _ in range(100):
        out = (await h.exec("cat /tmp/count 2>/dev/null")).stdout.strip()
        if out:
            return int(out)
        await asyncio.sleep(0.1)
    raise AssertionError("the counter never wrote /tmp/count")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@dataclass
class World:
    home: Home
    backend: MicroVMBackend
    baseline: BaselineInfo
    before: HostState
    source: MicroVMSandbox
    snap: snaps.MemorySnapshot
    count_at_snapshot: int

    def spec(self, **kw: Any) -> SandboxSpec:
        return SandboxSpec(baseline=self.baseline.digest, backend="microvm", **kw)


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, shared_home: Home, vm_baseline: BaselineInfo
) -> Iterator[World]:
    root = tmp_path_factory.mktemp("vm") / "home"
    root.mkdir()
    for name in ("oci", "layers", "baselines", "cache"):
        os.symlink(shared_home.root / name, root / name)
    home = Home(root).ensure()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROLLBOX_HOME", str(root))
        be = MicroVMBackend(home)
        be.prepare()
        before = HostState.capture(home.sandboxes)
        spec = SandboxSpec(baseline=vm_baseline.digest, backend="microvm",
                           limits=Limits(memory_mb=96, disk_mb=256))  # fmt: skip

        async def setup(h: MicroVMSandbox) -> tuple[snaps.MemorySnapshot, int]:
            await h.exec(COUNTER)
            await read_count(h)  # the loop is running before we freeze it
            await h.write_file("/root/state", "before-snapshot")
            snap = await h.memory_snapshot()
            # the count the snapshot froze is at most what we read right after it
            return snap, await read_count(h)

        h = run(be.create(spec, vm_baseline))
        assert isinstance(h, MicroVMSandbox)
        try:
            snap, count = run(setup(h))
        except BaseException:
            run(h.destroy())
            be.cleanup_orphans()
            raise
        w = World(home, be, vm_baseline, before, h, snap, count)
        try:
            yield w
        finally:
            run(h.destroy())
            be.cleanup_orphans()


def test_exec_basics_and_accelerator(world: World) -> None:
    h = world.source
    assert h.info.accelerator in ("kvm", "tcg")
    assert h.info.extra["kernel"]

    async def go() -> None:
        r = await h.exec(["python3", "-c", "import sys; print(6*7); sys.exit(3)"])
        assert (r.exit_code, r.stdout) == (3, "42\n")
        r = await h.exec("cat; echo $X >&2", stdin=b"in", env={"X": "y"}, cwd="/tmp")
        assert (r.stdout, r.stderr) == ("in", "y\n")
        assert (await h.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
        assert (await h.exec(["id", "-u"], user="1000")).stdout == "1000\n"
        assert (await h.read_file("/root/state")) == b"before-snapshot"
        # a secret split across two streamed chunks is still masked in the callbacks
        chunks: list[str] = []
        r = await h.exec(
            'printf %s "${TOKEN%????}"; sleep 0.3; printf \'%s\\n\' "${TOKEN#????}"',
            secrets={"TOKEN": "abcdefgh"},
            on_stdout=chunks.append,
        )
        assert "abcdefgh" not in "".join(chunks) and r.stdout == "***\n"

    run(go())


def test_restore_keeps_running_process_state(world: World) -> None:
    async def go() -> None:
        r = await world.backend.create(world.spec(from_snapshot=world.snap.id), world.baseline)
        try:
            assert isinstance(r, MicroVMSandbox)
            first = await read_count(r)
            await asyncio.sleep(0.5)
            later = await read_count(r)
            # the shell loop kept its in-memory counter: it continues, it did not restart
            assert first >= 1 and later > first
            assert first <= world.count_at_snapshot + 5
            assert (await r.read_file("/root/state")) == b"before-snapshot"
            assert r.info.extra["snapshot"] == world.snap.id
        finally:
            await r.destroy()

    run(go())


def test_branches_diverge_with_fresh_rng_and_current_clock(world: World) -> None:
    async def go() -> None:
        branches = await world.backend.restore_many(world.snap, 2, world.spec())
        try:
            a, b = branches
            rng = [
                (await x.exec("head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'")).stdout
                for x in branches
            ]
            assert rng[0] != rng[1] and len(rng[0]) == 32
            for x in branches:
                guest = int((await x.exec(["date", "+%s"])).stdout)
                assert abs(guest - time.time()) < 10, "guest clock is stale after restore"
            await a.write_file("/root/state", "branch-a")
            await b.exec("rm /root/state; echo b > /root/only-b")
            assert (await a.read_file("/root/state")) == b"branch-a"
            assert (await b.exec("test -e /root/state")).exit_code == 1
            assert (await a.exec("test -e /root/only-b")).exit_code == 1
            assert (await world.source.read_file("/root/state")) == b"before-snapshot"
        finally:
            for x in branches:
                await x.destroy()

    run(go())


def _copy_snapshot(world: World) -> Path:
    sid = new_id("snap")
    src = snaps.snap_dir(world.home, world.snap.id)
    dst = snaps.snap_dir(world.home, sid)
    dst.mkdir()
    os.link(src / "disk.qcow2", dst / "disk.qcow2")
    for name in ("state.bin", "ram.img"):  # sparse copies: holes stay holes
        subprocess.run(["cp", "--sparse=always", src / name, dst / name], check=True)
    snaps.save(world.home, world.snap.model_copy(update={"id": sid}))
    return dst


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_truncated_and_corrupted_snapshots_are_refused(world: World) -> None:
    assert world.snap.layout == "split"
    before = HostState.capture(world.home.sandboxes)
    cases = []
    truncated = _copy_snapshot(world)
    with open(truncated / "ram.img", "r+b") as f:
        f.truncate(world.snap.ram_size // 2)
    cases.append((truncated, "truncated"))
    state = _copy_snapshot(world)
    _flip(state / "state.bin", world.snap.memory_size - 100)
    cases.append((state, "sha256"))
    ram = _copy_snapshot(world)
    # a byte inside the RAM image's first data region
    with open(ram / "ram.img", "rb") as f:
        first_data = os.lseek(f.fileno(), 0, os.SEEK_DATA)
    _flip(ram / "ram.img", first_data + 10)
    cases.append((ram, "RAM image"))
    intact = _copy_snapshot(world)  # a faithful copy (new inode: fully re-hashed) restores

    for d, words in cases:
        with pytest.raises(CorruptionError, match=words):
            run(world.backend.create(world.spec(from_snapshot=d.name), world.baseline))
    ok = run(world.backend.create(world.spec(from_snapshot=intact.name), world.baseline))
    try:
        assert run(ok.read_file("/root/state")) == b"before-snapshot"
    finally:
        run(ok.destroy())
    leaks = scoped_diff(before, HostState.capture(world.home.sandboxes), world.home)
    assert not leaks
    names = find_processes(proc_name(world.home.tag, ""))
    assert list(names) == [proc_name(world.home.tag, world.source.id)]


def test_killed_qemu_is_detected_and_cleaned(world: World) -> None:
    async def go() -> None:
        r = await world.backend.create(world.spec(from_snapshot=world.snap.id), world.baseline)
        assert isinstance(r, MicroVMSandbox)
        pid = r.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0.2)
        with pytest.raises(SandboxCrashedError):
            await r.exec(["true"])
        assert r.info.state == "crashed"
        assert any(r.id in line for line in world.backend.cleanup_orphans(dry_run=True))
        await r.destroy()
        with pytest.raises(SandboxStateError):
            await r.exec(["true"])

    run(go())


def test_no_leftovers_after_destroy(world: World) -> None:
    async def go() -> None:
        before = HostState.capture(world.home.sandboxes)
        r = await world.backend.create(world.spec(from_snapshot=world.snap.id), world.baseline)
        assert isinstance(r, MicroVMSandbox)
        forks = await r.fork(2)
        rdir = r.rdir
        for x in [r, *forks]:
            await x.destroy()
        after = HostState.capture(world.home.sandboxes)
        assert not scoped_diff(before, after, world.home)
        assert not rdir.exists()
        assert not find_processes(proc_name(world.home.tag, r.id))
        # the fork's ephemeral snapshot went with its last branch
        ephemeral = [s for s in snaps.all_snapshots(world.home) if s.ephemeral]
        assert ephemeral == []

    run(go())


def test_remove_snapshot_refused_while_in_use(world: World) -> None:
    from rollbox.errors import InUseError

    with pytest.raises(InUseError, match=world.source.id):
        world.backend.remove_snapshot(world.snap.id)
    spare = _copy_snapshot(world)
    world.backend.remove_snapshot(spare.name)
    assert not spare.exists()
    assert spare.name not in [s.id for s in world.backend.list_snapshots()]
