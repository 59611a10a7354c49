"""The conformance suite every backend must pass (the tests parametrize it over backends).

Each check is an ``async`` function taking a :class:`Harness` and raising
``AssertionError`` with a message when the backend falls short. The harness creates
sandboxes through the backend contract only (so the microVM backend can reuse every check)
and destroys whatever a check left when :meth:`Harness.close` runs.

Run one check from a test::

    harness = Harness(backend, baseline)
    try:
        await CHECKS["file_isolation"](harness)
    finally:
        await harness.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import stat
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from rollbox.backends.base import Backend, SandboxHandle
from rollbox.backends.common.testnet import CLIENT, netns_server
from rollbox.config import Home
from rollbox.errors import (
    ExecTimeoutError,
    InvalidInputError,
    NotFoundError,
    PathEscapeError,
    RollboxError,
    SandboxCrashedError,
    SandboxStateError,
)
from rollbox.hoststate import HostState
from rollbox.models import BaselineInfo, Limits, SandboxSpec


def check(cond: object, message: str) -> None:
    """``assert`` that survives ``python -O``."""
    if not cond:
        raise AssertionError(message)


def scoped_diff(before: HostState, after: HostState, home: Home) -> dict[str, list[str]]:
    """Leaks between two host states that belong to ``home`` (other homes' sandboxes,
    made concurrently by other processes, are ignored)."""
    marks = (home.tag, str(home.root))
    out: dict[str, list[str]] = {}
    for kind, items in before.diff(after).items():
        if kind == "processes":
            mine = [i for i in items if _proc_in_home(int(i.split()[0]), home.tag)]
        elif kind == "sandbox_dirs":
            mine = list(items)
        else:
            mine = [i for i in items if any(m in i for m in marks)]
        if mine:
            out[kind] = mine
    return out


def _proc_in_home(pid: int, tag: str) -> bool:
    try:
        return f"rollbox-{tag}" in Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False


class Harness:
    """Creates sandboxes of one backend from one baseline, and reaps them all at the end."""

    def __init__(self, backend: Backend, baseline: BaselineInfo) -> None:
        self.backend = backend
        self.baseline = baseline
        self.home = backend.home
        self.made: list[SandboxHandle] = []

    async def create(self, **kwargs: object) -> SandboxHandle:
        """A new sandbox; ``kwargs`` are :class:`SandboxSpec` fields."""
        spec = SandboxSpec(baseline=self.baseline.digest, backend=self.backend.name, **kwargs)  # type: ignore[arg-type]
        self.backend.check(spec)
        self.backend.prepare()
        h = await self.backend.create(spec, self.baseline)
        self.made.append(h)
        return h

    def track(self, handles: list[SandboxHandle]) -> list[SandboxHandle]:
        """Reap these too at :meth:`close`."""
        self.made.extend(handles)
        return handles

    def layer_dirs(self, digest: str | None = None) -> list[Path]:
        """The unpacked layer directories of a baseline (default: the harness's)."""
        from rollbox.baselines.store import BaselineStore

        return BaselineStore(self.home).layer_dirs(digest or self.baseline.digest)

    async def close(self) -> None:
        """Destroy every sandbox made through this harness."""
        for h in self.made:
            with contextlib.suppress(RollboxError):
                await h.destroy()
        self.made.clear()


async def sh(h: SandboxHandle, script: str, **kwargs: object) -> str:
    """Run ``script`` with ``/bin/sh -c`` and return stdout; fail on a non-zero exit."""
    r = await h.exec(script, **kwargs)  # type: ignore[arg-type]
    check(r.exit_code == 0, f"{script!r} exited {r.exit_code}: {r.stderr.strip()[-300:]}")
    return r.stdout


# --------------------------------------------------------------------------- checks


async def exec_basics(t: Harness) -> None:
    """exit code, stdout/stderr, stdin, cwd, env, user, streaming, output cap."""
    h = await t.create(env={"SPEC_VAR": "spec"}, limits=Limits(output_bytes=1000))
    r = await h.exec(["/bin/sh", "-c", "echo out; echo err >&2; exit 7"])
    check((r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n"), f"basic exec: {r}")
    r = await h.exec(["cat"], stdin=b"from stdin")
    check(r.stdout == "from stdin", f"stdin not passed: {r.stdout!r}")
    r = await h.exec("pwd; echo $SPEC_VAR $EXEC_VAR", cwd="/tmp", env={"EXEC_VAR": "x"})
    check(r.stdout == "/tmp\nspec x\n", f"cwd/env: {r.stdout!r}")
    r = await h.exec(["id", "-u"], user="1000")
    check(r.stdout.strip() == "1000", f"user: {r.stdout!r}")
    chunks: list[str] = []
    r = await h.exec("echo a; sleep 0.1; echo b", on_stdout=chunks.append)
    check("".join(chunks) == "a\nb\n" and r.stdout == "a\nb\n", f"streaming: {chunks}")
    r = await h.exec("head -c 5000 /dev/zero | tr '\\0' x")
    check(r.truncated and len(r.stdout) == 1000, f"cap: {len(r.stdout)} {r.truncated}")
    r = await h.exec(["/no/such/program"])
    check(r.exit_code == 127, f"missing program exit {r.exit_code}")
    r = await h.exec("kill -9 $$")
    check(r.exit_code == 137, f"signal exit {r.exit_code}")


async def file_isolation(t: Harness) -> None:
    """A file written in A is invisible to B and to the baseline layers."""
    a, b = await t.create(), await t.create()
    name = f"/tmp/iso-{uuid.uuid4().hex}"
    await sh(a, f"echo secret > {name}")
    await a.write_file(name + "-api", "via api")
    r = await b.exec(["test", "-e", name])
    check(r.exit_code == 1, "B sees A's file")
    for d in t.layer_dirs():
        check(not (d / name.lstrip("/")).exists(), f"A's file reached layer {d}")
    with contextlib.suppress(NotFoundError):
        await b.read_file(name + "-api")
        raise AssertionError("B reads A's file through the files API")


async def process_isolation(t: Harness) -> None:
    """A's processes are neither visible nor signallable from B."""
    a, b = await t.create(), await t.create()
    marker = f"iso{uuid.uuid4().hex[:8]}"
    await sh(a, f"cp /bin/sleep /tmp/{marker}; setsid /tmp/{marker} 300 >/dev/null 2>&1 &")
    for _ in range(50):  # the backgrounded process may not have exec'd yet
        seen = await sh(a, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
        if marker in seen:
            break
        await asyncio.sleep(0.05)
    check(marker in seen, "A cannot see its own process")
    seen_b = await sh(b, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
    check(marker not in seen_b, "B sees A's process")
    host_pids = [
        int(d.name)
        for d in Path("/proc").iterdir()
        if d.name.isdigit() and _cmdline(int(d.name)).startswith(f"/tmp/{marker}")
    ]
    # B signals A's host pid (meaningless in B's pid namespace) when the host can see it
    # (not with a user-space kernel or a VM), then every pid it can see except its agent;
    # it may well kill its own shell doing so.
    if host_pids:
        await b.exec(f"kill -9 {host_pids[0]}")
    await b.exec(
        "for p in /proc/[0-9]*; do p=${p#/proc/}; "
        "case \"$(tr '\\0' ' ' < /proc/$p/cmdline 2>/dev/null)\" in "
        "*rollbox/agent*|*/proc/self/fd/*serve*) ;; "
        "*) kill -9 $p 2>/dev/null;; esac; done"
    )
    seen = await sh(a, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    check(marker in seen, "B killed A's process")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


async def env_secret_isolation(t: Harness) -> None:
    """A's env and secrets are absent from B; secrets are masked in captured output."""
    a = await t.create(env={"A_ONLY": "alpha"})
    b = await t.create()
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    r = await a.exec("echo $A_ONLY $TOKEN", secrets={"TOKEN": secret})
    check(r.stdout == "alpha ***\n", f"secret not masked: {r.stdout!r}")
    streamed: list[str] = []
    await a.exec(
        ["sh", "-c", "printf %s $TOKEN"], secrets={"TOKEN": secret}, on_stdout=streamed.append
    )
    check(secret not in "".join(streamed), "secret leaked through streaming")
    r = await b.exec("env")
    check("alpha" not in r.stdout and secret not in r.stdout, "B sees A's env or secret")
    # Nothing under the sandboxes' host dirs (state, logs, upper dirs) holds the secret.
    for dirpath, dirs, files in os.walk(t.home.sandboxes):
        if "rootfs" in dirs:
            dirs.remove("rootfs")  # the overlay view: its writes are in upperfs/upper
        for f in files:
            p = Path(dirpath, f)
            with contextlib.suppress(OSError):
                st = p.lstat()
                if stat.S_ISREG(st.st_mode) and st.st_size < 1 << 20:
                    check(secret.encode() not in p.read_bytes(), f"secret written to {p}")


async def no_host_files(t: Harness) -> None:
    """Host files outside the baseline are not visible inside."""
    marker = Path(f"/tmp/rollbox-host-marker-{uuid.uuid4().hex}")
    marker.write_text("host only")
    try:
        h = await t.create()
        r = await h.exec(["test", "-e", str(marker)])
        check(r.exit_code == 1, "a host file is visible inside")
        r = await h.exec(["test", "-e", str(t.home.root)])
        check(r.exit_code == 1, "the rollbox home is visible inside")
    finally:
        marker.unlink()


async def baseline_untouched(t: Harness) -> None:
    """Writes, deletes and overwrites inside never reach the baseline layers."""
    before = _tree_digest(t.layer_dirs())
    h = await t.create()
    await sh(
        h, "echo changed > /etc/hostname; rm -f /etc/issue; mkdir -p /opt/new; touch /opt/new/f"
    )
    await h.write_file("/etc/motd", "overwritten")
    check(_tree_digest(t.layer_dirs()) == before, "the baseline layers changed")


def _tree_digest(dirs: list[Path]) -> str:
    h = hashlib.sha256()
    for d in dirs:
        for sub in ("etc", "opt"):
            for dirpath, dirnames, files in os.walk(d / sub):
                dirnames.sort()
                for f in sorted(files):
                    p = Path(dirpath, f)
                    st = p.lstat()
                    h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


async def path_escapes(t: Harness) -> None:
    """A sandbox path climbing above ``/`` is refused; symlinks resolve with chroot
    semantics (an absolute or ``../../..`` link lands in the sandbox's own root)."""
    h = await t.create()
    await sh(
        h, "ln -s /etc/shadow /tmp/abs; ln -s ../../../../../../etc /tmp/rel; ln -s / /tmp/root"
    )
    for path in ("/../etc/passwd", "../../etc/passwd"):
        try:
            await h.read_file(path)
        except PathEscapeError:
            continue
        raise AssertionError(f"read of {path!r} was not refused")
    own_passwd = await h.read_file("/etc/passwd")
    for path in ("/tmp/rel/passwd", "/tmp/root/etc/passwd"):
        got = await h.read_file(path)
        check(got == own_passwd, f"{path} did not resolve to the sandbox's own /etc/passwd")
    await h.write_file("/tmp/rel/rbx-conformance", "x")
    check(await sh(h, "cat /etc/rbx-conformance") == "x", "write through a link not clamped")
    check(await h.read_file("/etc/hostname") != b"", "a normal read failed")


def _host_links_out(root: Path) -> list[str]:
    """Host symlinks below ``root`` whose target (resolved on the host) leaves ``root``."""
    bad = []
    top = os.path.realpath(root)
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                real = os.path.realpath(p)
                inside = real == top or real.startswith(top + "/")
                if os.readlink(p).startswith("/") or not inside:
                    bad.append(f"{p} -> {os.readlink(p)}")
    return bad


async def file_copy_links(t: Harness) -> None:
    """The file-copy contract (rollbox.backends.common.copylinks), the same on every
    backend: a single-file download follows a link inside the sandbox (chroot semantics),
    never to the host; a tree download keeps in-tree links as relative links and refuses
    (default) or replaces links out of the tree; uploads never write through a link to the
    host; no download ever leaves a host link pointing out of its destination."""
    import tempfile

    h = await t.create()
    token = uuid.uuid4().hex
    await sh(
        h,
        f"echo {token} > /tmp/real; ln -s /tmp/real /tmp/l2; ln -s /etc/shadow /tmp/shadow;"
        " ln -s ../../../../../etc/hostname /tmp/up; ln -s /nonexistent /tmp/dangling;"
        " mkdir -p /data/sub; echo in > /data/sub/f; ln -s sub/f /data/rel;"
        " ln -s /data/sub/f /data/abs_in; ln -s /etc/hostname /data/out;"
        " ln -s ../etc /data/outdir",
    )
    own_shadow = await sh(h, "cat /etc/shadow")
    own_hostname = await sh(h, "cat /etc/hostname")
    home_tmp = t.home.tmp
    home_tmp.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home_tmp) as d:
        out = Path(d)
        # single files: followed inside the sandbox, never on the host
        await h.download("/tmp/shadow", out / "shadow")
        check(not (out / "shadow").is_symlink(), "a download made a host symlink")
        check(
            (out / "shadow").read_text() == own_shadow,
            "a link to /etc/shadow did not give the SANDBOX's /etc/shadow",
        )
        await h.download("/tmp/l2", out / "l2")
        check(not (out / "l2").is_symlink(), "a download made a host symlink")
        check((out / "l2").read_text() == f"{token}\n", "a link to a file inside not followed")
        (out / "into").mkdir()  # an existing directory: the file lands in it, by its name
        await h.download("/tmp/l2", out / "into")
        check((out / "into" / "l2").read_text() == f"{token}\n", "download into a directory")
        await h.download("/tmp/up", out / "up")
        check(not (out / "up").is_symlink(), "a download made a host symlink")
        check((out / "up").read_text() == own_hostname, "../../.. was not clamped at the root")
        try:
            await h.download("/tmp/dangling", out / "dangling")
        except NotFoundError:
            pass
        else:
            raise AssertionError("a dangling link downloaded something")
        check(not (out / "dangling").exists() and not (out / "dangling").is_symlink(),
              "a dangling link left something at the destination")  # fmt: skip
        # an existing host symlink at the destination is replaced, never written through
        victim = out / "victim.txt"
        victim.write_text("host\n")
        os.symlink(victim, out / "trap")
        await h.download("/tmp/real", out / "trap")
        check(victim.read_text() == "host\n", "a download wrote through a host symlink")
        # trees: refuse (default) names the link out
        try:
            await h.download("/data", out / "tree")
        except PathEscapeError as exc:
            check("/data/out" in str(exc) or "/data/outdir" in str(exc), f"message: {exc}")
        else:
            raise AssertionError("a tree with links out of it was copied with links=refuse")
        check(not _host_links_out(out), f"host links out: {_host_links_out(out)}")
        await h.exec(["rm", "/data/out", "/data/outdir"])
        await h.download("/data", out / "kept")
        k = out / "kept"
        check((k / "rel").is_symlink() and (k / "abs_in").is_symlink(), "in-tree links lost")
        check(not os.readlink(k / "abs_in").startswith("/"), "an in-tree link kept absolute")
        check((k / "abs_in").read_text() == "in\n", "in-tree absolute link not rewritten")
        check((k / "rel").read_text() == "in\n", "in-tree relative link broken")
        # trees: content
        await sh(h, "ln -s /etc/hostname /data/out; ln -s ../etc/default /data/outdir")
        await h.download("/data", out / "content", links="content")
        c = out / "content"
        check(not (c / "out").is_symlink(), "links=content left a link out")
        check((c / "out").read_text() == own_hostname, "links=content: wrong content")
        check((c / "outdir").is_dir() and not (c / "outdir").is_symlink(), "dir link out")
        check((c / "abs_in").is_symlink(), "links=content must still keep in-tree links")
        check(not _host_links_out(out), f"host links out: {_host_links_out(out)}")
        # uploads: a link AT the destination is replaced (never written through); links
        # in its directories resolve inside the sandbox, never to the host
        await sh(
            h,
            "ln -s /etc/rbx-upload-target /tmp/upl; mkdir -p /up; ln -s / /up/root;"
            " ln -s /etc/rbx-tree-target /up/lnk",
        )
        src = out / "upfile"
        src.write_text("uploaded\n")
        await h.upload(src, "/tmp/upl")
        check(
            await sh(h, "test -f /tmp/upl && ! test -L /tmp/upl && cat /tmp/upl") == "uploaded\n",
            "an upload onto a link did not replace the link",
        )
        check(
            await sh(h, "ls /etc/rbx-upload-target 2>/dev/null || true") == "",
            "an upload was written through a link",
        )
        tree = out / "uptree"
        (tree / "root" / "tmp").mkdir(parents=True)
        (tree / "root" / "tmp" / "rbx-up").write_text("tree\n")
        (tree / "lnk").write_text("file\n")
        await h.upload(tree, "/up")
        check(await sh(h, "cat /tmp/rbx-up") == "tree\n", "tree upload through a link inside")
        check(await sh(h, "cat /up/lnk") == "file\n", "tree upload onto a link")
        check(
            await sh(h, "ls /etc/rbx-tree-target 2>/dev/null || true") == "",
            "a tree upload was written through a link",
        )
        check(not Path("/tmp/rbx-up").exists(), "an upload wrote a host file")


async def fork_bomb(t: Harness) -> None:
    """A fork bomb is held by the pids limit; its timeout kills all of it; the host and a
    sibling sandbox stay usable meanwhile. (A user-space kernel that dies of the bomb may
    report its sandbox crashed instead; the damage must still stay inside.)"""
    sibling = await t.create()
    h = await t.create(limits=Limits(pids=64))
    crashed = False
    try:
        # the sleeper starts first: once the bomb fills the pids limit nothing can fork
        await h.exec("sleep 30 & s=$!; b() { b | b & }; b; wait $s", timeout=3)
    except ExecTimeoutError:
        pass
    except SandboxCrashedError:
        crashed = True
    else:
        raise AssertionError("the fork bomb's exec did not time out")
    check(await sh(sibling, "echo alive") == "alive\n", "a sibling sandbox was starved")
    # user processes only (a VM also lists its kernel threads, whose cmdline is empty)
    count = "grep -l . /proc/[0-9]*/cmdline 2>/dev/null | wc -l"
    for _ in range(20):  # killed processes may take a moment to be reaped
        try:
            r = await h.exec(["sh", "-c", count], timeout=20)
        except (SandboxCrashedError, SandboxStateError) as exc:
            check(crashed or "crashed" in str(exc), f"sandbox unusable after the bomb: {exc}")
            return
        check(not crashed, "the exec reported a crash but the sandbox still answers")
        if r.exit_code == 0 and int(r.stdout) < 20:
            return
        await asyncio.sleep(0.2)
    ps = (await h.exec("ps -eo pid,ppid,stat,args | head -8")).stdout
    raise AssertionError(f"bomb survivors: {r.stdout.strip()}: {ps}")


async def memory_hog(t: Harness) -> None:
    """A memory hog is OOM-killed and reported; the damage stays inside its sandbox (a
    sibling sandbox keeps working; the hog's own sandbox either keeps answering or, with a
    user-space kernel that dies of it, reports itself crashed)."""
    sibling = await t.create()
    h = await t.create(limits=Limits(memory_mb=64))
    r = await h.exec(["python3", "-c", "a = bytearray(400 << 20); print(len(a))"], timeout=60)
    check(r.exit_code != 0 and r.oom_killed, f"hog not OOM-killed: {r}")
    check(await sh(sibling, "echo alive") == "alive\n", "a sibling sandbox was hit")
    try:
        r = await h.exec(["echo", "alive"])
    except SandboxStateError as exc:
        check("crashed" in str(exc), f"unexpected state after OOM: {exc}")
    else:
        check(r.stdout == "alive\n", "sandbox unusable after the hog")


async def disk_filler(t: Harness) -> None:
    """Writing past the disk limit fails inside with ENOSPC."""
    h = await t.create(limits=Limits(disk_mb=16))
    r = await h.exec("dd if=/dev/zero of=/tmp/big bs=1M count=64", timeout=60)
    check(r.exit_code != 0 and "No space left" in r.stderr, f"disk not limited: {r}")
    r = await h.exec("du -sm /tmp/big | cut -f1")
    check(int(r.stdout.strip() or 0) <= 16, f"wrote {r.stdout.strip()} MB past a 16 MB limit")


async def timeout_no_survivors(t: Harness) -> None:
    """A timed-out exec's whole tree dies, setsid daemons included."""
    h = await t.create()
    try:
        await h.exec("setsid sleep 301 & (sleep 302 &) ; sleep 303", timeout=1)
    except ExecTimeoutError:
        pass
    else:
        raise AssertionError("no ExecTimeoutError")
    r = await h.exec("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
    check(not any(f"sleep 30{i}" in r.stdout for i in (1, 2, 3)), f"survivors: {r.stdout}")


async def network_none(t: Harness) -> None:
    """With network ``none`` only ``lo`` exists, there is no route, and neither a server in
    a network namespace made by this check (reachable from the host) nor a server on the
    host's own loopback is reachable from inside."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        h = await t.create()
        ifaces = (await sh(h, "tail -n +3 /proc/net/dev | cut -d: -f1")).split()
        check([i.strip() for i in ifaces] == ["lo"], f"interfaces inside: {ifaces}")
        routes = (await sh(h, "tail -n +2 /proc/net/route")).strip()
        check(routes == "", f"routes inside: {routes}")
        r = await h.exec(["python3", "-c", CLIENT, "127.0.0.1", str(port), "2"], timeout=20)
        check(r.stdout.startswith("blocked"), f"host loopback reachable: {r.stdout}")
        tag = uuid.uuid4().hex[:8]
        with netns_server(f"rbxc-{tag}", f"c{tag}", [18280]) as server:
            host = server.connect_from(None, 18280)
            check(host == "hello 18280", f"test server unreachable from host: {host}")
            r = await h.exec(["python3", "-c", CLIENT, server.server_ip, "18280", "2"], timeout=20)
            check(r.stdout.startswith("blocked"), f"server reachable from inside: {r.stdout}")
    finally:
        srv.close()


async def no_leftovers(t: Harness) -> None:
    """After destroy the host has no mount, cgroup, netns, veth, chain, process or dir left."""
    before = HostState.capture(t.home.sandboxes)
    h = await t.create()
    await sh(h, "setsid sleep 300 >/dev/null 2>&1 & echo x > /tmp/x")
    await h.destroy()
    await h.destroy()  # idempotent
    t.made.remove(h)
    after = HostState.capture(t.home.sandboxes)
    leaks = scoped_diff(before, after, t.home)
    check(not leaks, f"leftovers after destroy: {leaks}")
    try:
        await h.exec(["true"])
    except SandboxStateError:
        pass
    else:
        raise AssertionError("exec on a destroyed sandbox did not fail")


async def pause_resume(t: Harness) -> None:
    """A paused sandbox runs nothing and refuses exec until resumed."""
    h = await t.create()
    await h.pause()
    try:
        await h.exec(["true"])
    except SandboxStateError:
        pass
    else:
        raise AssertionError("exec on a paused sandbox did not fail")
    await h.resume()
    check((await h.exec(["true"])).exit_code == 0, "exec after resume failed")
    await sh(h, "sleep 300 >/dev/null 2>&1 &")
    await h.pause()
    before = HostState.capture(t.home.sandboxes)
    await h.destroy()  # a paused sandbox must be destroyable (frozen tasks die too)
    t.made.remove(h)
    after = HostState.capture(t.home.sandboxes)
    check(len(after.sandbox_dirs) < len(before.sandbox_dirs), "paused sandbox not removed")


async def snapshot_and_fork(t: Harness) -> None:
    """Snapshot and fork children see the parent's files, then diverge independently."""
    parent = await t.create()
    await sh(parent, "echo v1 > /root/state; rm -f /etc/issue")
    digest = await parent.snapshot(name=f"conformance/{uuid.uuid4().hex[:8]}")
    check(digest != t.baseline.digest, "snapshot returned the parent digest")
    from rollbox.baselines.store import BaselineStore

    snap = BaselineStore(t.home).resolve(digest)
    check(snap.parent == t.baseline.digest, "snapshot does not record its parent")
    child = await Harness(t.backend, snap).create()
    t.made.append(child)
    check(
        await sh(child, "cat /root/state; test ! -e /etc/issue && echo gone") == "v1\ngone\n",
        "snapshot child",
    )
    forks = t.track(await parent.fork(2))
    check(len(forks) == 2, "fork(2) did not give 2 sandboxes")
    for f in forks:
        check(await sh(f, "cat /root/state") == "v1\n", "fork does not see the parent's file")
    await sh(forks[0], "echo v2 > /root/state")
    check(await sh(forks[1], "cat /root/state") == "v1\n", "forks are not independent")
    check(await sh(parent, "cat /root/state") == "v1\n", "a fork changed its parent")
    await sh(parent, "echo v3 > /root/state")
    check(await sh(child, "cat /root/state") == "v1\n", "the parent changed its snapshot child")


EXEC_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The default ``PATH`` of an exec, pinned here (not imported from the helper), so a change
there shows up as a failure."""
BACKEND_ENV_EXTRAS: dict[str, frozenset[str]] = {
    # the statx shim every gVisor exec preloads (gvisor STATX_SHIM: runsc 20221219's statx)
    "gvisor": frozenset({"LD_PRELOAD"}),
}
"""Variables a backend adds for its own plumbing; they are left out of the comparison."""


async def _exec_view(h: SandboxHandle, **kwargs: object) -> tuple[dict[str, str], str, str]:
    """(environment, ``uid gid``, cwd) an exec with ``kwargs`` sees."""
    r = await h.exec(["env", "-0"], **kwargs)  # type: ignore[arg-type]
    check(r.exit_code == 0, f"env exited {r.exit_code}: {r.stderr.strip()[-300:]}")
    env = dict(item.partition("=")[::2] for item in r.stdout.split("\0") if item)
    for key in BACKEND_ENV_EXTRAS.get(h.info.backend, frozenset()):
        env.pop(key, None)
    ids = await sh(h, "echo $(id -u) $(id -g); pwd -P", **kwargs)
    who, _, cwd = ids.strip().partition("\n")
    return env, who, cwd


def _passwd_home(passwd: str, user: str) -> tuple[str, str] | None:
    """(``uid gid``, home) of ``user`` (a name or a uid) in ``passwd``."""
    for line in passwd.splitlines():
        f = line.split(":")
        if len(f) >= 7 and (f[0] == user or f[2] == user):
            return f"{f[2]} {f[3]}", f[5] or "/"
    return None


async def exec_environment(t: Harness) -> None:
    """The environment, user and cwd an exec sees are the same on every backend:
    ``PATH``/``HOME``/``HOSTNAME`` defaults < image ``ENV`` < sandbox env < exec env <
    secrets, nothing else (no ``USER``/``LOGNAME`` unless set); ``HOME`` from the user's
    ``/etc/passwd`` entry (``/root`` for root, ``/`` for an unknown uid); cwd normalised,
    relative to ``/``; ``timeout <= 0`` refused."""
    h = await t.create(hostname="rbx-envcheck", env={"SPEC_ONLY": "s", "OVER": "spec"})
    image = dict(item.partition("=")[::2] for item in t.baseline.config.env if "=" in item)
    expect = {"PATH": EXEC_PATH, "HOME": "/root", "HOSTNAME": "rbx-envcheck", **image}
    expect |= {"SPEC_ONLY": "s", "OVER": "spec"}
    image_cwd = "/" + t.baseline.config.workdir.strip("/") if t.baseline.config.workdir else "/"
    env, who, cwd = await _exec_view(h)
    check(env == expect, f"root's environment: {env} != {expect}")
    check((who, cwd) == ("0 0", image_cwd), f"root: ids/cwd {who!r} {cwd!r}")
    for name in ("USER", "LOGNAME"):
        check(name in image or name not in env, f"{name} set by the backend: {env.get(name)!r}")
    # exec env over sandbox env, secrets over both (and masked in what the exec prints)
    env, _, _ = await _exec_view(
        h, env={"OVER": "exec", "EXEC_ONLY": "e", "SEC": "plain"}, secrets={"SEC": "hidden"}
    )
    want = expect | {"OVER": "exec", "EXEC_ONLY": "e", "SEC": "***"}
    check(env == want, f"exec env/secrets precedence: {env} != {want}")
    env, _, _ = await _exec_view(h, env={"HOSTNAME": "mine", "HOME": "/h", "PATH": "/bin"})
    check(
        (env["HOSTNAME"], env["HOME"], env["PATH"]) == ("mine", "/h", "/bin"),
        f"exec env does not override the defaults: {env}",
    )
    # users: HOME from /etc/passwd; a uid without an entry gets "/"
    passwd = (await h.read_file("/etc/passwd")).decode(errors="replace")
    unknown = next(str(u) for u in range(4242, 5000) if _passwd_home(passwd, str(u)) is None)
    named = next(
        (line.split(":")[0] for line in passwd.splitlines() if line.startswith("nobody:")),
        None,
    )
    cases = [(unknown, (f"{unknown} {unknown}", "/"))]
    if named is not None:
        found = _passwd_home(passwd, named)
        assert found is not None
        cases.append((named, found))
    for user, (ids, home) in cases:
        env, who, _ = await _exec_view(h, user=user)
        check(who == ids, f"user {user!r}: ids {who!r}, expected {ids!r}")
        check(env == expect | {"HOME": home}, f"user {user!r}: {env} != HOME {home!r}")
    # cwd: relative to /, lexically normalised
    for asked, want_cwd in (("/tmp", "/tmp"), ("tmp", "/tmp"), ("/tmp/../var/./", "/var")):
        _, _, cwd = await _exec_view(h, cwd=asked)
        check(cwd == want_cwd, f"cwd {asked!r} -> {cwd!r}, expected {want_cwd!r}")
    for bad in (0, -1.0):
        try:
            await h.exec("true", timeout=bad)
        except InvalidInputError:
            continue
        except RollboxError as exc:  # e.g. run, then "timed out after 0s"
            raise AssertionError(f"timeout={bad} was accepted: {exc}") from exc
        raise AssertionError(f"timeout={bad} was accepted")


CHECKS: dict[str, Callable[[Harness], Awaitable[None]]] = {
    f.__name__: f
    for f in (
        exec_basics,
        exec_environment,
        file_isolation,
        process_isolation,
        env_secret_isolation,
        no_host_files,
        baseline_untouched,
        path_escapes,
        file_copy_links,
        fork_bomb,
        memory_hog,
        disk_filler,
        timeout_no_survivors,
        network_none,
        no_leftovers,
        pause_resume,
        snapshot_and_fork,
    )
}
"""Every conformance check by name."""


async def run_check(name: str, backend: Backend, baseline: BaselineInfo) -> None:
    """Run one check with a fresh harness and reap its sandboxes."""
    t = Harness(backend, baseline)
    try:
        await CHECKS[name](t)
    finally:
        await t.close()


def run_check_sync(name: str, backend: Backend, baseline: BaselineInfo) -> None:
    """Blocking :func:`run_check`."""
    asyncio.run(run_check(name, backend, baseline))
