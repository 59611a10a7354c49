"""namespace exec details beyond the conformance suite."""

from __future__ import annotations

import asyncio

import pytest

from rollbox.backends.namespace import NamespaceBackend
from rollbox.config import Home
from rollbox.errors import InvalidInputError
from rollbox.models import BaselineInfo, Limits, SandboxSpec

pytestmark = pytest.mark.root


def test_chatty_daemon_does_not_hold_the_exec(sbx_home: Home, dev_baseline: BaselineInfo) -> None:
    async def go() -> None:
        be = NamespaceBackend(sbx_home)
        spec = SandboxSpec(baseline=dev_baseline.digest, limits=Limits(output_bytes=4096))
        h = await be.create(spec, dev_baseline)
        try:
            # `yes` keeps stdout open and full after the shell exits
            r = await asyncio.wait_for(h.exec("yes & sleep 0.1; echo done >&2"), 30)
            assert r.truncated and len(r.stdout) == 4096 and r.stderr == "done\n"
            with pytest.raises(InvalidInputError, match="working directory"):
                await h.exec(["true"], cwd="/no/such/dir")
            r = await h.exec(["sh", "-c", "ulimit -n"])
            assert r.stdout.strip() == str(spec.limits.nofile)
        finally:
            await h.destroy()

    asyncio.run(go())
