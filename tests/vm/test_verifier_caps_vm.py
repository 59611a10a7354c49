"""microvm: what the agent leaves running cannot reach the verifier's private namespace.

Commands in the guest run as root; the guest agent gives workload commands Docker's default
capability set (no CAP_SYS_ADMIN, no CAP_SYS_PTRACE) and lets only private (verifier) execs
keep a marker capability (CAP_WAKE_ALARM). A process the agent left running then fails the
kernel's ptrace access check against the verifier's processes: no ``/proc/PID/root`` and no
``/proc/PID/ns/mnt`` (setns) into its private ``/logs/verifier``. The same probe with a
guest configured to let commands keep every capability (the guard off) gets through and
forges the reward, so the check can fail.
"""

from __future__ import annotations

import asyncio

import pytest

from rollbox.backends.isolation import IsolatedExec
from rollbox.backends.microvm import MicroVMBackend
from rollbox.models import BaselineInfo, SandboxSpec

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.vm]

WORKLOAD_CAPS = 0x00000000A00425FB
"""Docker's default set without CAP_MKNOD (backends/common/bundle.py DEFAULT_CAPS)."""
VERIFIER_CAPS = WORKLOAD_CAPS | 1 << 35
"""... plus CAP_WAKE_ALARM, the marker only private execs keep."""
CAP_LINES = "grep -E '^Cap(Eff|Prm|Bnd|Inh):' /proc/self/status"

# Left running by the "agent": waits for the verifier's process, then tries every way in:
# /proc/PID/root (ls and a write of the reward), setns through /proc/PID/ns/mnt (nsenter),
# and keeps rewriting the reward through /proc/PID/root for as long as the verifier runs
# (in place, "1<>": a truncating rewrite could be collected empty, between its two steps).
LEFTOVER = r"""
find() { for f in /proc/[0-9]*/cmdline; do
    IFS= read -r -d '' a0 < "$f" 2>/dev/null && [ "$a0" = "$1" ] && {
        p=${f#/proc/}; echo ${p%/cmdline}; return; }; done; }
v=
for _ in $(seq 400); do v=$(find rbx-private); [ -n "$v" ] && break; sleep 0.05; done
{
[ -n "$v" ] && echo found
echo "root: $(ls /proc/$v/root/logs/verifier/ >/dev/null 2>&1 && echo reachable || echo refused)"
(echo 1 > /proc/$v/root/logs/verifier/reward.txt) 2>/dev/null && echo wrote-root
nsenter --mount=/proc/$v/ns/mnt sh -c 'echo 1 > /logs/verifier/reward.txt' 2>/dev/null \
    && echo wrote-setns
} > /tmp/probe.out 2>&1
while [ -d /proc/$v ]; do (echo 1 1<> /proc/$v/root/logs/verifier/reward.txt) 2>/dev/null
    sleep 0.01; done
"""
# The verifier: writes 0, stays (as rbx-private) long enough for the leftover to try.
VERIFIER = "echo 0 > /logs/verifier/reward.txt; exec -a rbx-private sleep 6"


def _caps(text: str) -> dict[str, int]:
    return {ln.split(":")[0]: int(ln.split()[1], 16) for ln in text.splitlines()}


@pytest.mark.parametrize("guard", ["on", "off"])
def test_leftover_cannot_reach_the_verifier_namespace(
    guard: str, vm_backend: MicroVMBackend, vm_baseline: BaselineInfo
) -> None:
    async def go() -> None:
        vm_backend.full_command_caps = guard == "off"
        h = await vm_backend.create(SandboxSpec(baseline=vm_baseline.digest), vm_baseline)
        try:
            plain = _caps((await h.exec(CAP_LINES)).stdout)
            iso0 = IsolatedExec(fresh=("/logs/verifier",))
            private = _caps((await h.exec(CAP_LINES, isolate=iso0)).stdout)
            if guard == "on":
                for key in ("CapEff", "CapPrm", "CapBnd"):
                    assert plain[key] == WORKLOAD_CAPS, (key, plain)
                    assert private[key] == VERIFIER_CAPS, (key, private)
                assert plain["CapInh"] & ~WORKLOAD_CAPS == 0, plain
            else:
                assert plain["CapEff"] & 1 << 21  # CAP_SYS_ADMIN kept: the guard is off
            await h.exec(["sh", "-c", "printf '%s' \"$1\" > /tmp/left.sh", "sh", LEFTOVER])
            await h.exec("setsid bash /tmp/left.sh </dev/null >/dev/null 2>&1 &")
            iso = IsolatedExec(fresh=("/logs/verifier",), collect="/logs/verifier")
            r = await h.exec(["bash", "-c", VERIFIER], isolate=iso, timeout=60)
            assert r.exit_code == 0, r
            probe = ""
            for _ in range(100):
                probe = (await h.exec("cat /tmp/probe.out 2>/dev/null")).stdout
                if probe:
                    break
                await asyncio.sleep(0.1)
            if guard == "on":
                assert probe == "found\nroot: refused\n", probe
                assert iso.collected == {"reward.txt": b"0\n"}
            else:
                assert probe == "found\nroot: reachable\nwrote-root\nwrote-setns\n", probe
                assert iso.collected == {"reward.txt": b"1\n"}
        finally:
            await h.destroy()

    asyncio.run(go())
