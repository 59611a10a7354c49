"""Test-only mutants of the ``namespace`` backend: each removes ONE protection.

A mutant is a :class:`~rollbox.backends.namespace.backend.NamespaceBackend` subclass that
only a test can select: :func:`installed` puts an instance in the backend registry's
per-home instance cache for the test's own home, so ``rollbox.audit.runner.run_audit``
(and every sandbox it creates) uses it there. Nothing in ``src/`` names these classes;
the CLI and the registry's name table never see them.

Two kinds of mutation:

* bwrap-level: ``prepare()`` points the backend's bwrap at a small wrapper script that
  rewrites bwrap's arguments (drop ``--unshare-pid``, drop ``--seccomp``, add a capability,
  add a bind of a host path, join a pid namespace the test made, leak an fd) and then
  executes the real bwrap;
* host-side: limits removed from the spec, a sandbox handle whose exec timeout does not
  kill the process tree, naive file transfer that follows symlinks on the host, a
  teardown that leaves the sandbox's cgroups behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from rollbox.backends import registry
from rollbox.backends.common.cgroups import Cgroup
from rollbox.backends.namespace import teardown
from rollbox.backends.namespace.backend import NamespaceBackend, NamespaceSandbox
from rollbox.backends.state import sandbox_dir
from rollbox.config import Home
from rollbox.models import BaselineInfo, ExecResult, SandboxSpec

WRAPPER = r'''#!/usr/bin/python3 -I
"""bwrap with one protection removed (rollbox test mutant); config: CFG."""
import glob, json, os, resource, sys
cfg = json.load(open(@CFG@))
args = sys.argv[1:]
out, i = [], 0
while i < len(args):
    a = args[i]
    if a in cfg["drop_flags"]:
        i += 1; continue
    if a == "--seccomp" and cfg["no_seccomp"]:
        i += 2; continue
    if a in ("--bind", "--ro-bind", "--ro-bind-try") and args[i:i + 3] in cfg["drop_binds"]:
        i += 3; continue
    out.append(a); i += 1
binds = []
for mode, pattern in cfg["bind_globs"]:
    for p in sorted(glob.glob(pattern)):
        binds += [mode, p, p]
for mode, src, dst in cfg["binds"]:
    binds += [mode, src, dst]
at = out.index("--unshare-ipc")
out[at:at] = binds
prog = next(k for k, a in enumerate(out) if a.startswith("/proc/self/fd/") and k > at)
if cfg["no_seccomp"]:
    # PROG serve LFD READY SECCOMPFD: the agent loads the filter (and drops CAP_SYS_ADMIN)
    # in each command only when given the filter's fd
    if out[prog + 1] == "serve":
        del out[prog + 4:]
out[prog:prog] = [x for c in cfg["add_caps"] for x in ("--cap-add", c)]
if cfg["leak_fd"]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), max(hard, 2048)))
    fd = os.open(cfg["leak_fd"], os.O_RDONLY)
    os.dup2(fd, 1500, inheritable=True)
    os.close(fd)
argv = [cfg["bwrap"], *out]
if cfg["pidns_of"]:
    argv = ["/usr/bin/nsenter", "--pid=/proc/%d/ns/pid" % cfg["pidns_of"], "--", *argv]
os.execv(argv[0], argv)
'''


@dataclass
class Mutation:
    """One protection removed."""

    name: str
    removed: str
    """What protection is gone, in words."""
    probes: list[str]
    """The probes that must report a breach against it."""
    drop_flags: list[str] = field(default_factory=list)
    no_seccomp: bool = False
    drop_binds: list[list[str]] = field(default_factory=list)
    binds: list[list[str]] = field(default_factory=list)
    bind_globs: list[list[str]] = field(default_factory=list)
    add_caps: list[str] = field(default_factory=list)
    leak_fd: str = ""
    pidns_of: int = 0
    limits: dict[str, Any] = field(default_factory=dict)
    """Limits replaced in every spec (e.g. ``{"memory_mb": None}``)."""
    no_timeout_kill: bool = False
    naive_files: bool = False
    verbatim_links: bool = False
    keep_cgroups: bool = False


class NaiveFiles:
    """File transfer that joins paths onto the root and lets the HOST follow symlinks
    (what :class:`~rollbox.backends.namespace.files.RootFiles` exists to prevent)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _p(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def read(self, path: str) -> bytes:
        return self._p(path).read_bytes()

    def write(self, path: str, data: bytes, mode: int = 0o644) -> None:
        p = self._p(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)

    def upload(self, src: Path, dest: str) -> None:
        if src.is_dir():
            shutil.copytree(src, self._p(dest), dirs_exist_ok=True)
        else:
            self.write(dest, src.read_bytes())

    def download(self, src: str, dest: Path, *_a: Any, **_kw: Any) -> None:
        p = self._p(src)
        if p.is_dir():
            shutil.copytree(p, dest, symlinks=False)
        else:
            dest.write_bytes(p.read_bytes())


class VerbatimLinkFiles(NaiveFiles):
    """Safe reads, but downloads copy symlinks as they are (absolute targets included):
    the host then holds links to its own files (microvm's ``sandbox cp`` before the
    file-copy contract)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        from rollbox.backends.namespace.files import RootFiles

        self.safe = RootFiles(root)

    def read(self, path: str) -> bytes:
        return self.safe.read(path)

    def download(self, src: str, dest: Path, *_a: Any, **_kw: Any) -> None:
        p = self._p(src)
        if p.is_symlink():
            os.symlink(os.readlink(p), dest)
        elif p.is_dir():
            shutil.copytree(p, dest, symlinks=True)
        else:
            dest.write_bytes(p.read_bytes())


class _NoKillOnTimeout(NamespaceSandbox):
    """A handle whose exec timeout leaves the command's process tree running."""

    _active = 0
    _patch: Any = None

    async def exec(self, cmd: list[str] | str, **kw: Any) -> ExecResult:
        # the per-exec group is of the same (v1 or v2) class as the sandbox's; execs
        # overlap, so the patch stays while any of them runs
        cls = _NoKillOnTimeout
        if cls._active == 0:
            cls._patch = mock.patch.object(type(self.cgroup), "kill_all", lambda _self: None)
            cls._patch.start()
        cls._active += 1
        try:
            return await super().exec(cmd, **kw)
        finally:
            cls._active -= 1
            if cls._active == 0:
                cls._patch.stop()


class MutantNamespaceBackend(NamespaceBackend):
    """The namespace backend with :attr:`mutation` applied (tests only)."""

    def __init__(self, home: Home, mutation: Mutation) -> None:
        super().__init__(home)
        self.mutation = mutation
        self._wrapper: Path | None = None

    def prepare(self) -> None:
        super().prepare()
        if self._wrapper is None:
            m = self.mutation
            d = self.home.root / "mutant"
            d.mkdir(exist_ok=True)
            cfg = d / f"{m.name}.json"
            real = shutil.which("bwrap")
            assert real is not None
            cfg.write_text(
                json.dumps(
                    {
                        "bwrap": real,
                        "drop_flags": m.drop_flags,
                        "no_seccomp": m.no_seccomp,
                        "drop_binds": m.drop_binds,
                        "binds": m.binds,
                        "bind_globs": m.bind_globs,
                        "add_caps": m.add_caps,
                        "leak_fd": m.leak_fd,
                        "pidns_of": m.pidns_of,
                    }
                )
            )
            w = d / f"bwrap-{m.name}"
            w.write_text(WRAPPER.replace("@CFG@", repr(str(cfg))))
            w.chmod(w.stat().st_mode | stat.S_IXUSR)
            self._wrapper = w
        self._bwrap = str(self._wrapper)

    def _create_sync(
        self, spec: SandboxSpec, baseline: BaselineInfo, upper_from: Path | None
    ) -> NamespaceSandbox:
        m = self.mutation
        if m.limits:
            spec = spec.model_copy(update={"limits": spec.limits.model_copy(update=m.limits)})
        handle = super()._create_sync(spec, baseline, upper_from)
        if m.no_timeout_kill:
            handle.__class__ = _NoKillOnTimeout
        if m.naive_files:
            handle.files = NaiveFiles(handle.rootfs.root)  # type: ignore[assignment]
        if m.verbatim_links:
            handle.files = VerbatimLinkFiles(handle.rootfs.root)  # type: ignore[assignment]
        return handle

    def _teardown_names(self, sandbox_id: str, net: dict[str, object] | None) -> None:
        if not self.mutation.keep_cgroups:
            super()._teardown_names(sandbox_id, net)
            return
        # Kill everything and remove the root, but leave the cgroup directories.
        teardown.kill_sandbox(Cgroup.open(self.home.tag, sandbox_id))
        sdir = sandbox_dir(self.home, sandbox_id)
        if not teardown.remove_rootfs(sdir):
            from rollbox.backends.common.rootfs import remove_sandbox_dir

            remove_sandbox_dir(sdir)


@contextlib.contextmanager
def installed(home: Home, mutation: Mutation) -> Iterator[MutantNamespaceBackend]:
    """Make ``namespace`` mean the mutant for ``home`` (this process only) inside the block."""
    key = ("namespace", home.root)
    be = MutantNamespaceBackend(home, mutation)
    old = registry._INSTANCES.get(key)
    registry._INSTANCES[key] = be
    try:
        yield be
    finally:
        if old is None:
            registry._INSTANCES.pop(key, None)
        else:
            registry._INSTANCES[key] = old


@contextlib.contextmanager
def pid_namespace() -> Iterator[int]:
    """A pid namespace the test owns (its init reaps orphans); yields the holder's pid
    (its namespace is the one to join). Killing it kills everything in the namespace."""
    reaper = (
        "import os, time\n"
        "while True:\n"
        "    try: os.wait()\n"
        "    except ChildProcessError: time.sleep(0.2)\n"
    )
    import subprocess

    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", reaper],
        start_new_session=True,
    )
    try:
        # unshare forks; the namespace's init is its child
        for _ in range(100):
            kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            if kids:
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("the pid namespace holder did not start")
        yield int(kids[0])
    finally:
        proc.kill()
        proc.wait()


def host_pty() -> tuple[int, str]:
    """A pty pair on the host: (master fd, slave path)."""
    master, slave = os.openpty()
    path = os.ttyname(slave)
    os.close(slave)
    return master, path
