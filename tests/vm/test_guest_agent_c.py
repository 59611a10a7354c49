"""The C guest agent in a real microVM: a baseline without python3 boots and execs (file-tree
ops refuse with one clear line), bad requests get error replies and the agent keeps serving,
the agent caps output itself, and stdin streams through."""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
from pathlib import Path

import pytest

from requirebackends import backend_unavailable
from rollbox.backends.microvm import MicroVMBackend, MicroVMSandbox
from rollbox.backends.microvm.guest_agent import T_JSON, T_OUT, frame
from rollbox.baselines.store import BaselineStore
from rollbox.config import Home
from rollbox.errors import InvalidInputError
from rollbox.models import BaselineInfo, Limits, SandboxSpec

pytestmark = [pytest.mark.vm, pytest.mark.slow]

BUSYBOX = Path("/bin/busybox")


def _busybox_rootfs(root: Path) -> Path:
    """A rootfs of busybox-static only: /bin/sh and a few applets; no python3, no /etc,
    not even the mount points (the init makes them)."""
    (root / "bin").mkdir(parents=True)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    for applet in ("sh", "echo", "cat", "ls", "id", "head"):
        (root / "bin" / applet).symlink_to("busybox")
    return root


def test_baseline_without_python_boots_and_execs(
    vm_backend: MicroVMBackend, vm_home: Home, tmp_path: Path
) -> None:
    if not BUSYBOX.is_file():
        backend_unavailable("microvm", "busybox-static is not installed")
    info = BaselineStore(vm_home).import_rootfs(_busybox_rootfs(tmp_path / "rootfs"))
    spec = SandboxSpec(baseline=info.digest, backend="microvm", limits=Limits(memory_mb=48))

    async def go() -> None:
        h = await vm_backend.create(spec, info)
        try:
            assert not (await h.exec(["sh", "-c", "test -e /usr/bin/python3"])).ok
            r = await h.exec(["sh", "-c", "echo $HOME; id -u; echo err >&2; exit 3"])
            assert (r.exit_code, r.stdout, r.stderr) == (3, "/root\n0\n", "err\n")
            missing = await h.exec(["no-such-program"])
            assert missing.exit_code == 127 and "cannot run 'no-such-program'" in missing.stderr
            # single files need no python3 in the guest
            await h.write_file("/data/f.txt", "payload")
            assert await h.read_file("/data/f.txt") == b"payload"
            assert (await h.exec(["cat", "/data/f.txt"])).stdout == "payload"
            # file trees do: one clear line naming what is missing
            src = tmp_path / "tree"
            (src / "sub").mkdir(parents=True)
            (src / "sub" / "x").write_text("x")
            with pytest.raises(InvalidInputError, match="no /usr/bin/python3") as exc:
                await h.upload(src, "/data/tree")
            assert "\n" not in str(exc.value)
            with pytest.raises(InvalidInputError, match="no /usr/bin/python3"):
                await h.download("/data", tmp_path / "down")
            # the agent kept serving after the refusals
            assert (await h.exec(["echo", "still"])).stdout == "still\n"
        finally:
            await h.destroy()
        assert vm_backend.list_sandboxes() == []

    asyncio.run(go())


def test_agent_survives_bad_requests_caps_output_and_streams_stdin(
    vm_backend: MicroVMBackend, vm_baseline: BaselineInfo
) -> None:
    spec = SandboxSpec(baseline=vm_baseline.digest, backend="microvm")

    async def go() -> None:
        h = await vm_backend.create(spec, vm_baseline)
        assert isinstance(h, MicroVMSandbox)
        try:
            async with h._session() as ch:
                assert ch.hello["agent"] == "c"
                rid = ch.new_id()
                await ch.send(frame(T_JSON, rid, b'{"id": 1, "op": "exec", "argv": [tru'))
                bad = await ch.reply(rid)
                assert bad["error"]["type"] == "agent" and "malformed" in bad["error"]["message"]
                unknown = await ch.call("no_such_op")
                assert "unknown op" in unknown["error"]["message"]
                assert "error" not in await ch.call("ping")
                # the agent's own output cap: 1 MB written, 1000 bytes sent, truncated
                rid = ch.new_id()
                argv = ["head", "-c", str(1 << 20), "/dev/zero"]
                req = {"id": rid, "op": "exec", "argv": argv, "output_bytes": 1000}
                await ch.send(frame(T_JSON, rid, json.dumps(req).encode()))
                got = bytearray()

                def sink(kind: int, payload: bytes) -> None:
                    if kind == T_OUT:
                        got.extend(payload)

                reply = await ch.reply(rid, sink)
                assert reply["exit_code"] == 0 and reply["truncated"] is True
                assert bytes(got) == b"\0" * 1000
            # 200 KB of stdin round-trips through cat
            data = secrets.token_hex(100 * 1024)
            r = await h.exec(["cat"], stdin=data)
            assert r.exit_code == 0 and r.stdout == data and not r.truncated
        finally:
            await h.destroy()

    asyncio.run(go())
