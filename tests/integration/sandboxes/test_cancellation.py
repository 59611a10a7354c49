"""Cancellation safety of the sandbox API on every backend (issue 15, item 2).

* a cancelled exec (``task.cancel()``, e.g. a policy's own ``wait_for``) kills its process
  tree, ``setsid`` daemons included -- before, only ``TimeoutError`` did;
* a create in flight when its caller is cancelled is waited for and destroyed;
* the sync facade interrupted by Ctrl-C (a real SIGINT) unwinds the same way.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable

import pytest

from rollbox.backends.base import Backend
from rollbox.backends.state import list_states
from rollbox.config import Home
from rollbox.models import BaselineInfo
from rollbox.sandbox import AsyncSandbox, Sandbox

from ..rollouts.hostleaks import home_leftovers

pytestmark = pytest.mark.root

BACKENDS = ["namespace", "gvisor", "microvm"]
MARK = "rbxcancel"
# two long-lived processes under a marker name: a child and a setsid grandchild
TREE = (
    f"cp /bin/sleep /tmp/{MARK} && /tmp/{MARK} 300 & "
    f"sleep 0.2; setsid /tmp/{MARK} 301 </dev/null >/dev/null 2>&1 & wait"
)
COUNT = (
    "n=0; for c in /proc/[0-9]*/comm; do "
    f'[ "$(cat $c 2>/dev/null)" = {MARK} ] && n=$((n+1)); done; echo $n'
)


async def _count(sbx: AsyncSandbox) -> int:
    return int((await sbx.exec(["sh", "-c", COUNT])).stdout.strip() or "0")


async def _wait_count(sbx: AsyncSandbox, want: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    n = await _count(sbx)
    while n != want and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        n = await _count(sbx)
    return n


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancelled_exec_kills_its_tree(
    backend: str, backend_or_skip: Callable[[str], Backend], dev_baseline: BaselineInfo
) -> None:
    be = backend_or_skip(backend)

    async def main() -> None:
        sbx = await AsyncSandbox.create(dev_baseline.digest, backend=be.name, home=be.home)
        try:
            # the counter can see live processes: a finished exec's setsid survivor counts
            await sbx.exec(["sh", "-c", f"cp /bin/sleep /tmp/{MARK}; setsid /tmp/{MARK} 5 &"])
            assert await _wait_count(sbx, 1) == 1
            await sbx.exec(["sh", "-c", f"kill $(pidof {MARK} 2>/dev/null) 2>/dev/null; true"])
            await _wait_count(sbx, 0, timeout=8)

            task = asyncio.create_task(sbx.exec(["sh", "-c", TREE]))
            assert await _wait_count(sbx, 2) == 2, "the tree never started"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await _wait_count(sbx, 0, timeout=5) == 0, "the cancelled exec's tree lives"
            # the sandbox itself is fine afterwards
            assert (await sbx.exec(["echo", "ok"])).stdout == "ok\n"
        finally:
            await sbx.destroy()

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancelled_create_is_destroyed(
    backend: str, backend_or_skip: Callable[[str], Backend], dev_baseline: BaselineInfo
) -> None:
    be = backend_or_skip(backend)
    home: Home = be.home

    async def main() -> None:
        for delay in (0.01, 0.08, 0.3):
            task = asyncio.create_task(
                AsyncSandbox.create(dev_baseline.digest, backend=be.name, home=home)
            )
            await asyncio.sleep(delay)
            if task.done():  # created before the cancel could land: destroy and go on
                await (await task).destroy()
                continue
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    t0 = time.monotonic()
    asyncio.run(main())
    assert [i.id for i in list_states(home) if i.state != "destroyed"] == []
    assert home_leftovers(home) == []
    assert time.monotonic() - t0 < 120


def _sigint_after(delay: float) -> threading.Timer:
    t = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
    t.start()
    return t


def _count_sync(sbx: Sandbox, want: int, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        n = int(sbx.exec(["sh", "-c", COUNT]).stdout.strip() or "0")
        if n == want or time.monotonic() > deadline:
            return n
        time.sleep(0.1)


def test_sync_facade_ctrl_c_unwinds(
    sbx_home: Home, dev_baseline: BaselineInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real SIGINT while the sync API waits: the exec's tree is killed, a create in
    flight is destroyed, before KeyboardInterrupt reaches the caller."""
    from rollbox.backends.namespace.backend import NamespaceBackend

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with Sandbox.create(dev_baseline.digest, backend="namespace", home=sbx_home) as sbx:
        timer = _sigint_after(1.0)
        with pytest.raises(KeyboardInterrupt):
            sbx.exec(["sh", "-c", TREE])
        timer.join()
        assert _count_sync(sbx, 0) == 0, "the interrupted exec's tree lives"

    # every create lingers 1.5 s after its sandbox exists: the signal lands mid-create
    orig = NamespaceBackend._create_sync

    def slow(self: NamespaceBackend, *a: object, **k: object) -> object:
        h = orig(self, *a, **k)  # type: ignore[arg-type]
        time.sleep(1.5)
        return h

    monkeypatch.setattr(NamespaceBackend, "_create_sync", slow)
    timer = _sigint_after(0.5)
    with pytest.raises(KeyboardInterrupt):
        Sandbox.create(dev_baseline.digest, backend="namespace", home=sbx_home)
    timer.join()
    assert [i.id for i in list_states(sbx_home) if i.state != "destroyed"] == []
    assert home_leftovers(sbx_home) == []
