"""The contract as the only door, on real sandboxes (issue 10 items 3, 5, 6):

* an outside backend declared only through an entry point (a dist-info written into a
  temporary directory on ``sys.path``) is listed, creates real bwrap sandboxes and leaves
  nothing behind;
* an operation the backend's capabilities lack is refused with one error before anything
  runs (and the same handle call without the check would have gone through);
* errors carry ``sandbox_id``/``backend``; file errors are builtin file errors too;
* an :class:`AsyncSandbox` refuses another event loop; ``Sandbox.to_async()`` gives one for
  the caller's loop.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rollbox.backends import registry
from rollbox.backends.base import Backend, MemorySnapshots, memory_snapshots
from rollbox.backends.state import list_states
from rollbox.config import Home
from rollbox.errors import (
    BackendUnavailableError,
    InvalidInputError,
    SandboxStateError,
    UnsupportedOperationError,
)
from rollbox.models import BaselineInfo
from rollbox.sandbox import AsyncSandbox, Sandbox

from ..rollouts.hostleaks import home_leftovers

pytestmark = pytest.mark.root

PLUGIN = '''
"""An outside backend: bubblewrap sandboxes without fork or pause."""
from typing import ClassVar

from rollbox.backends.namespace import NamespaceBackend
from rollbox.models import Capabilities


class NoForkBackend(NamespaceBackend):
    name: ClassVar[str] = "{name}"
    capabilities: ClassVar[Capabilities] = Capabilities(fork=False, pause=False)
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An installed-looking distribution ``rbx-plugin`` declaring backend ``ext-nofork``
    (and a broken ``ext-missing``) in the ``rollbox.backends`` group."""
    site = tmp_path / "site"
    dist = site / "rbx_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rbx-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[rollbox.backends]\n"
        "ext-nofork = rbx_plugin_mod:NoForkBackend\n"
        "ext-missing = rbx_plugin_absent:Nothing\n"
    )
    (site / "rbx_plugin_mod.py").write_text(textwrap.dedent(PLUGIN.format(name="ext-nofork")))
    monkeypatch.syspath_prepend(str(site))
    yield "ext-nofork"
    sys.modules.pop("rbx_plugin_mod", None)
    registry._REGISTERED.pop("ext-nofork", None)
    registry._INSTANCES.pop(("ext-nofork", Home.from_env().root), None)


def test_outside_backend_through_an_entry_point(
    plugin: str, sbx_home: Home, dev_baseline: BaselineInfo
) -> None:
    assert "rbx_plugin_mod" not in sys.modules
    assert plugin in registry.names() and "ext-missing" in registry.names()
    assert "rbx_plugin_mod" not in sys.modules, "listing must not import the backend"
    with pytest.raises(BackendUnavailableError) as err:
        registry.backend_class("ext-missing")
    assert "rbx_plugin_absent" in err.value.one_line() and "\n" not in err.value.one_line()

    with Sandbox.create(dev_baseline.digest, backend=plugin, home=sbx_home) as sbx:
        assert sbx.info.backend == plugin
        assert sbx.exec(["sh", "-c", "echo $((6*7))"]).stdout == "42\n"
        sbx.files.write("/tmp/x", "hi")
        assert sbx.files.read_text("/tmp/x") == "hi"
        # capability checked before use: fork and pause are refused, nothing made
        before = {i.id for i in list_states(sbx_home)}
        with pytest.raises(UnsupportedOperationError) as refused:
            sbx.fork(1)
        assert (refused.value.backend, refused.value.operation) == (plugin, "fork")
        assert refused.value.sandbox_id == sbx.id
        with pytest.raises(UnsupportedOperationError):
            sbx.pause()
        with pytest.raises(UnsupportedOperationError):
            sbx.snapshot_memory()
        assert {i.id for i in list_states(sbx_home)} == before
    assert [i.id for i in list_states(sbx_home) if i.state != "destroyed"] == []
    assert home_leftovers(sbx_home) == []


def test_the_check_is_what_refuses(plugin: str, sbx_home: Home, dev_baseline: BaselineInfo) -> None:
    """Against a deliberately broken facade (the capability check removed) the outside
    backend's fork goes through: the refusal above comes from the check alone."""

    async def main() -> None:
        sbx = await AsyncSandbox.create(dev_baseline.digest, backend=plugin, home=sbx_home)
        try:
            sbx.backend.require = lambda op: None  # type: ignore[method-assign]
            forks = await sbx.fork(1)
            assert len(forks) == 1
            assert (await forks[0].exec(["true"])).exit_code == 0
            await forks[0].destroy()
        finally:
            await sbx.destroy()

    asyncio.run(main())
    assert home_leftovers(sbx_home) == []


def test_errors_carry_the_sandbox_and_are_builtin_file_errors(
    sbx_home: Home, dev_baseline: BaselineInfo
) -> None:
    sbx = Sandbox.create(dev_baseline.digest, backend="namespace", home=sbx_home)
    try:
        with pytest.raises(FileNotFoundError) as nf:
            sbx.files.read("/no/such/file")
        assert (nf.value.sandbox_id, nf.value.backend) == (sbx.id, "namespace")  # type: ignore[attr-defined]
        with pytest.raises(IsADirectoryError) as isdir:
            sbx.files.read("/etc")
        assert isdir.value.sandbox_id == sbx.id  # type: ignore[attr-defined]
        with pytest.raises(PermissionError):
            sbx.files.read("/../../etc/shadow")
        with pytest.raises(UnsupportedOperationError) as mem:
            sbx.snapshot_memory()
        assert mem.value.operation == "memory_snapshot" and mem.value.sandbox_id == sbx.id
    finally:
        sbx.destroy()
    with pytest.raises(SandboxStateError) as gone:
        sbx.exec(["true"])
    assert (gone.value.sandbox_id, gone.value.backend) == (sbx.id, "namespace")


def test_no_sandbox_bound_to_another_loop(sbx_home: Home, dev_baseline: BaselineInfo) -> None:
    with Sandbox.create(dev_baseline.digest, backend="namespace", home=sbx_home) as sbx:

        async def mine() -> str:
            for foreign in (sbx._a.exec(["true"]), sbx._a.files.read("/etc/hostname")):
                with pytest.raises(InvalidInputError, match="another event loop"):
                    await foreign  # the facade's objects, from this loop
            aio = await sbx.to_async()  # one for this loop
            return (await aio.exec(["echo", "same"])).stdout

        assert asyncio.run(mine()) == "same\n"
        assert sbx.exec(["echo", "still"]).stdout == "still\n"  # the facade is unaffected
    assert home_leftovers(sbx_home) == []


@pytest.mark.parametrize("backend", ["namespace", "gvisor", "microvm"])
def test_same_door_same_types_on_every_backend(
    backend: str, backend_or_skip: Callable[[str], Backend], dev_baseline: BaselineInfo
) -> None:
    """destroy_by_id returns list[str] everywhere; snapshot() a digest everywhere;
    snapshot_memory() a snap- id where declared, else UnsupportedOperationError before
    anything happens; the memory-snapshot interface exists exactly where declared."""
    be = backend_or_skip(backend)
    home: Home = be.home

    async def main() -> None:
        sbx = await AsyncSandbox.create(dev_baseline.digest, backend=backend, home=home)
        try:
            await sbx.exec(["sh", "-c", "echo v1 > /root/f"])
            digest = await sbx.snapshot()
            assert digest.startswith("sha256:") and digest != dev_baseline.digest
            if be.capabilities.memory_snapshot:
                snap = await sbx.snapshot_memory()
                assert snap.startswith("snap-")
                records = memory_snapshots(be).list_snapshots()
                assert snap in [r.id for r in records]
                assert memory_snapshots(be).load_snapshot(snap).source == sbx.id
            else:
                with pytest.raises(UnsupportedOperationError) as err:
                    await sbx.snapshot_memory()
                assert (err.value.backend, err.value.sandbox_id) == (backend, sbx.id)
                assert not isinstance(be, MemorySnapshots)
            assert (await sbx.exec(["cat", "/root/f"])).stdout == "v1\n"  # still running
        finally:
            removed = be.destroy_by_id(sbx.id)
        assert isinstance(removed, list) and removed and all(isinstance(x, str) for x in removed)
        assert be.destroy_by_id(sbx.id) == []  # idempotent, same type
        with pytest.raises(SandboxStateError):
            await sbx.exec(["true"])

    asyncio.run(main())
    assert [i.id for i in list_states(home) if i.state != "destroyed"] == []
    assert home_leftovers(home) == []
