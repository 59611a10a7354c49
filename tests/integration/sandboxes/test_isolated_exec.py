"""``exec(isolate=IsolatedExec(...))`` on real sandboxes: fresh directories that only the
command sees, files carried in and out, killing what else runs, and (namespace) no access to
a private command's files through ``/proc/PID/root`` for the other processes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from rollbox.backends.agent.build import SOURCE, compile_c
from rollbox.backends.base import Backend
from rollbox.backends.isolation import IsolatedExec
from rollbox.config import Home
from rollbox.errors import CapabilityError
from rollbox.models import BaselineInfo, SandboxSpec

pytestmark = [pytest.mark.root, pytest.mark.slow]

WRITER = (
    "mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; "
    "printf 'while :; do echo 1 > /logs/verifier/reward.txt; sleep 0.01; done' > /tmp/loop.sh; "
    "setsid sh /tmp/loop.sh </dev/null >/dev/null 2>&1 &"
)
SCRIPT = b"""sleep 0.3
echo 0.5 > /logs/verifier/reward.txt
mkdir /logs/verifier/d && echo x > /logs/verifier/d/f
"""
# the writer loop's processes (the bracket keeps the scanning commands themselves out)
COUNT_LOOPS = "grep -l 'loo[p][.]sh' /proc/[0-9]*/cmdline 2>/dev/null | wc -l"


@pytest.mark.parametrize(
    "name", ["namespace", "gvisor", pytest.param("microvm", marks=pytest.mark.vm)]
)
def test_private_dirs_belong_to_the_command(
    name: str, backend_or_skip: Callable[[str], Backend], dev_baseline: BaselineInfo
) -> None:
    async def go() -> None:
        be = backend_or_skip(name)
        h = await be.create(SandboxSpec(baseline=dev_baseline.digest), dev_baseline)
        try:
            await h.exec(WRITER)
            iso = IsolatedExec(
                fresh=("/tests", "/logs/verifier"),
                files={"/tests/sub/t.sh": (0o700, SCRIPT)},
                collect="/logs/verifier",
            )
            cmd = "ls -A /logs/verifier | wc -l; stat -c %a /tests/sub/t.sh; sh /tests/sub/t.sh"
            if name == "gvisor":
                with pytest.raises(CapabilityError, match="private mount namespace"):
                    await h.exec(cmd, isolate=iso)
            else:
                r = await h.exec(cmd, isolate=iso)
                assert (r.exit_code, r.stdout) == (0, "0\n700\n"), r
                # the writer loop wrote all along: none of it is in the command's directory
                assert iso.collected == {"reward.txt": b"0.5\n", "d/f": b"x\n"}
                assert not iso.truncated
                # and the command's directories never showed outside
                r = await h.exec("cat /logs/verifier/reward.txt; ls -A /tests | wc -l")
                assert r.stdout == "1\n0\n", r
            assert (await h.exec(COUNT_LOOPS)).stdout.strip() == "1"
            r = await h.exec(COUNT_LOOPS, isolate=IsolatedExec(kill_others=True))
            assert r.stdout.strip() == "0", r
            assert (await h.exec(COUNT_LOOPS)).stdout.strip() == "0"
        finally:
            await h.destroy()

    asyncio.run(go())


MARKER_DROP = "    if (!private_exec && drop_cap(CAP_WAKE_ALARM) < 0) return -1;\n"


def mutant_agent(home: Home, tmp_path: Path) -> Path:
    """The agent built with every command keeping the marker capability (the guard off)."""
    src = SOURCE.read_text()
    assert src.count(MARKER_DROP) == 1, "agent.c changed: update the mutation"
    mutant = tmp_path / "agent-no-marker.c"
    mutant.write_text(src.replace(MARKER_DROP, "    (void)private_exec;\n"))
    return compile_c(home, mutant, "rollbox-agent-no-marker", ["-static", "-O2"])


@pytest.mark.parametrize("guard", ["on", "off"])
def test_left_processes_cannot_reach_a_private_command_through_proc(
    guard: str,
    backend_or_skip: Callable[[str], Backend],
    dev_baseline: BaselineInfo,
    sbx_home: Home,
    tmp_path: Path,
) -> None:
    """namespace: a private command keeps a capability the others lack, so the kernel's
    ptrace access check refuses them its /proc/PID/root; the same probe against an ordinary
    command's process succeeds. With an agent that lets every command keep the marker (guard
    off), the left process reaches the private command's files and rewrites its reward."""

    async def go() -> None:
        be = backend_or_skip("namespace")
        if guard == "off":
            be._agent = mutant_agent(sbx_home, tmp_path)  # type: ignore[attr-defined]
        h = await be.create(SandboxSpec(baseline=dev_baseline.digest), dev_baseline)
        try:
            await h.exec("setsid bash -c 'exec -a rbx-plain sleep 30' </dev/null >/dev/null 2>&1 &")
            iso = IsolatedExec(fresh=("/logs/verifier",), collect="/logs/verifier")
            private = "echo 0 > /logs/verifier/reward.txt; exec -a rbx-private sleep 3"
            verifier = asyncio.ensure_future(h.exec(["bash", "-c", private], isolate=iso))
            probe = r"""
            find() { for f in /proc/[0-9]*/cmdline; do
                IFS= read -r -d '' a0 < "$f" 2>/dev/null && [ "$a0" = "$1" ] && {
                    p=${f#/proc/}; echo ${p%/cmdline}; return; }; done; }
            for _ in $(seq 100); do v=$(find rbx-private); [ -n "$v" ] && break; sleep 0.05; done
            n=$(find rbx-plain)
            [ -n "$v" ] && [ -n "$n" ] && echo found
            echo "plain: $(ls /proc/$n/root/ >/dev/null 2>&1 && echo reachable || echo refused)"
            echo "private: $(ls /proc/$v/root/ >/dev/null 2>&1 && echo reachable || echo refused)"
            (echo 1 > /proc/$v/root/logs/verifier/reward.txt) 2>/dev/null && echo wrote
            """
            r = await h.exec(["bash", "-c", probe])
            result = await verifier
            assert result.exit_code == 0
            if guard == "on":
                assert r.stdout == "found\nplain: reachable\nprivate: refused\n", r
                assert iso.collected == {"reward.txt": b"0\n"}
            else:
                assert r.stdout == "found\nplain: reachable\nprivate: reachable\nwrote\n", r
                assert iso.collected == {"reward.txt": b"1\n"}
        finally:
            await h.destroy()

    asyncio.run(go())
