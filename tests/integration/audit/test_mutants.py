"""Mutation test of the audit: every probe reports a breach against a backend with the one
protection it checks removed (test-only mutants of the namespace backend, see mutants.py).

Each case runs the real audit runner with only the probes that the mutant must trip, then
checks that nothing of the test's home is left on the host.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from integration.audit import mutants
from integration.audit.mutants import Mutation
from rollbox.audit.models import AuditReport
from rollbox.audit.runner import probe_names, run_audit, select
from rollbox.baselines.store import BaselineStore
from rollbox.config import Home
from rollbox.models import BaselineInfo

pytestmark = [pytest.mark.root, pytest.mark.slow]


class Env:
    """What the mutations need from the test: paths, a pid namespace, a host pty."""

    def __init__(self, home: Home, tmp: Path, baseline: BaselineInfo) -> None:
        self.home = home
        self.tmp = tmp
        self.baseline = baseline
        self.layers = BaselineStore(home).layer_dirs(baseline.digest)
        self.extra_layers: list[Path] = []
        self.pidns = 0
        self.pty_slave = ""

    def shared_dir(self) -> str:
        d = self.tmp / "shared-tmp"
        d.mkdir(mode=0o1777, exist_ok=True)
        return str(d)

    def layer_copy(self) -> str:
        """A copy of the baseline's /etc and /usr/bin/env standing in for its top layer
        (the session store's real layers must not be damaged): the audit is told it is
        the top layer, and the mutant binds its /etc writable over the sandbox's /etc."""
        top = self.tmp / "layer-copy"
        for rel in ("etc", "usr/bin/env"):
            src = next(d / rel for d in reversed(self.layers) if (d / rel).exists())
            dst = top / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst, symlinks=True)
            else:
                shutil.copy2(src, dst)
        self.extra_layers = [top]
        return str(top / "etc")


MUTATIONS: dict[str, Callable[[Env], Mutation]] = {
    "shared-tmp": lambda e: Mutation(
        "shared-tmp",
        "every sandbox's /tmp is one host directory",
        ["cross-sandbox-files"],
        binds=[["--bind", e.shared_dir(), "/tmp"]],
    ),
    "shared-pidns": lambda e: Mutation(
        "shared-pidns",
        "no pid namespace of its own (all sandboxes in one pid namespace the test made)",
        ["cross-sandbox-processes", "cross-sandbox-env-secrets", "kill-all"],
        drop_flags=["--unshare-pid", "--as-pid-1"],
        pidns_of=e.pidns,
    ),
    "bind-canary": lambda e: Mutation(
        "bind-canary",
        "a bind of host files (the audit's canary directory, at its host path)",
        ["host-files-invisible"],
        bind_globs=[["--ro-bind", f"/var/tmp/rbx-audit-{e.home.tag}-*"]],
    ),
    "bind-home": lambda e: Mutation(
        "bind-home",
        "a bind of ROLLBOX_HOME (at its host path)",
        ["host-files-invisible", "mountinfo-host-paths", "rollbox-home-and-sockets"],
        binds=[["--ro-bind", str(e.home.root), str(e.home.root)]],
    ),
    "writable-layer": lambda e: Mutation(
        "writable-layer",
        "/etc is a writable bind of the top layer's directory instead of an overlay",
        ["baseline-immutable"],
        binds=[["--bind", e.layer_copy(), "/etc"]],
    ),
    "no-pids-limit": lambda e: Mutation(
        "no-pids-limit", "no pids limit", ["pids-limit"], limits={"pids": None}
    ),
    "no-memory-limit": lambda e: Mutation(
        "no-memory-limit", "no memory limit", ["memory-limit"], limits={"memory_mb": None}
    ),
    "no-disk-limit": lambda e: Mutation(
        "no-disk-limit",
        "the disk limit is not applied (1 GiB whatever was asked)",
        ["disk-limit"],
        limits={"disk_mb": 1024},
    ),
    "no-timeout-kill": lambda e: Mutation(
        "no-timeout-kill",
        "a timed-out exec's process tree is not killed",
        ["timeout-no-survivors"],
        no_timeout_kill=True,
    ),
    "host-pidns": lambda e: Mutation(
        "host-pidns",
        "the host's pid namespace (plus CAP_SYS_PTRACE and no seccomp filter, without "
        "which root inside still cannot read or attach to host root processes)",
        ["proc-environ", "ptrace"],
        drop_flags=["--unshare-pid", "--as-pid-1"],
        add_caps=["CAP_SYS_PTRACE"],
        no_seccomp=True,
    ),
    "writable-proc-sys": lambda e: Mutation(
        "writable-proc-sys",
        "/proc/sys writable (the host's, bound read-write)",
        ["proc-sys-write"],
        drop_binds=[["--ro-bind", "/proc/sys", "/proc/sys"]],
        binds=[["--bind", "/proc/sys", "/proc/sys"]],
    ),
    "host-sys": lambda e: Mutation(
        "host-sys",
        "the host's /sys bound read-write",
        ["sys-write"],
        binds=[["--bind", "/sys", "/sys"]],
    ),
    "cap-mknod": lambda e: Mutation(
        "cap-mknod", "CAP_MKNOD in the capability set", ["mknod"], add_caps=["CAP_MKNOD"]
    ),
    "no-seccomp": lambda e: Mutation(
        "no-seccomp",
        "no seccomp filter in commands (the agent then also leaves them CAP_SYS_ADMIN, "
        "which it drops together with loading the filter)",
        ["mount", "keyctl", "bpf"],
        no_seccomp=True,
    ),
    "host-tty": lambda e: Mutation(
        "host-tty",
        "a host terminal reachable inside (at /dev/console) and no seccomp filter",
        ["tiocsti"],
        no_seccomp=True,
        binds=[["--dev-bind", e.pty_slave, "/dev/console"]],
    ),
    "host-network": lambda e: Mutation(
        "host-network",
        "no network namespace with network none",
        ["network-none-no-route", "host-loopback-service", "netns-server-allowlist"],
        drop_flags=["--unshare-net"],
    ),
    "leak-fd": lambda e: Mutation(
        "leak-fd",
        "a host fd (1500, above the agent's close loop) inherited by every command",
        ["inherited-fds"],
        leak_fd="/etc/hostname",
    ),
    "naive-files": lambda e: Mutation(
        "naive-files",
        "file transfer that lets the host follow symlinks inside the root",
        ["download-symlink-race"],
        naive_files=True,
    ),
    "verbatim-links": lambda e: Mutation(
        "verbatim-links",
        "downloads copy symlinks as they are (host links to host files)",
        ["download-symlink-race"],
        verbatim_links=True,
    ),
    "keep-cgroups": lambda e: Mutation(
        "keep-cgroups",
        "destroy leaves the sandbox's cgroups behind",
        ["residue-cycles"],
        keep_cgroups=True,
    ),
}


def test_every_probe_has_a_mutant() -> None:
    """All 28 probes are covered: 27 by a backend mutant, baseline-hash-mismatch by a
    store mutant (test_store_mutant below)."""
    covered = {p for f in MUTATIONS.values() for p in f(_NullEnv()).probes}
    assert covered | {"baseline-hash-mismatch"} == set(probe_names())
    assert len(probe_names()) == 28


class _NullEnv(Env):
    def __init__(self) -> None:
        self.home = Home(Path("/nonexistent"))
        self.tmp = Path("/nonexistent")
        self.pidns = 1
        self.pty_slave = "/dev/null"

    def shared_dir(self) -> str:
        return "/nonexistent"

    def layer_copy(self) -> str:
        return "/nonexistent"


@pytest.fixture
def env(linked_home: Home, tmp_path: Path, dev_baseline: BaselineInfo) -> Iterator[Env]:
    e = Env(linked_home, tmp_path, dev_baseline)
    with mutants.pid_namespace() as holder:
        e.pidns = holder
        master, e.pty_slave = mutants.host_pty()
        try:
            yield e
        finally:
            os.close(master)


def _audit(e: Env, probes: list[str], cycles: int = 3) -> AuditReport:
    layers: list[object] = [*e.layers, *e.extra_layers]
    return asyncio.run(
        run_audit(e.home, "namespace", e.baseline.digest, layers, probes=select(probes, None),
                  cycles=cycles)
    )  # fmt: skip


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_probe_reports_breach_against_its_mutant(env: Env, name: str) -> None:
    mutation = MUTATIONS[name](env)
    leaky = mutation.keep_cgroups
    with mutants.installed(env.home, mutation) as be:
        report = _audit(env, mutation.probes)
        if leaky:  # the mutant's own leftovers: the real cleanup removes them
            assert report.host_leaks  # the audit's own leak check saw them too
            be.mutation.keep_cgroups = False
            removed = be.cleanup_orphans()
            assert any("cgroup" in line for line in removed), removed
            assert not be.cleanup_orphans(dry_run=True)
    got = {p.name: p for p in report.probes}
    assert list(got) == [n for n in probe_names() if n in mutation.probes]
    wrong = {n: (p.status, p.summary) for n, p in got.items() if p.status != "breach"}
    assert not wrong, f"{name} ({mutation.removed}): {wrong}"
    if not leaky:
        assert report.host_leaks == {}, report.host_leaks


def test_store_mutant(
    linked_home: Home, dev_baseline: BaselineInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``verify`` that checks no content: baseline-hash-mismatch reports the breach."""
    from rollbox.baselines import verify as verify_mod

    real = verify_mod.verify
    monkeypatch.setattr(verify_mod, "verify", lambda store, infos=None: real(store, []))
    layers: list[object] = list(BaselineStore(linked_home).layer_dirs(dev_baseline.digest))
    report = asyncio.run(
        run_audit(linked_home, "namespace", dev_baseline.digest, layers,
                  probes=select(["baseline-hash-mismatch"], None), cycles=0)
    )  # fmt: skip
    (res,) = report.probes
    assert res.status == "breach", res.summary
    assert "not detected" in res.summary


@pytest.mark.parametrize(
    "mutation",
    [
        # "removed" holds the message the check must fail with
        Mutation("naive-files", "did not give the SANDBOX's /etc/shadow", [], naive_files=True),
        Mutation("verbatim-links", "made a host symlink", [], verbatim_links=True),
    ],
    ids=lambda m: m.name,
)
def test_file_copy_check_fails_against_broken_transfer(
    linked_home: Home, dev_baseline: BaselineInfo, mutation: Mutation
) -> None:
    """The conformance check of the file-copy contract can fail: it rejects file transfer
    that follows links on the host, and one that copies links verbatim."""
    from rollbox.backends.conformance import run_check_sync
    from rollbox.backends.registry import get_backend

    with mutants.installed(linked_home, mutation):
        be = get_backend("namespace", linked_home)
        assert isinstance(be, mutants.MutantNamespaceBackend)
        with pytest.raises(AssertionError, match=mutation.removed) as err:
            run_check_sync("file_copy_links", be, dev_baseline)
    print(f"{mutation.name}: {err.value}")
