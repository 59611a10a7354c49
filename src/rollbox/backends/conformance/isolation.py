"""Conformance checks of isolation: files, processes, env and secrets, host files, the
baseline, path escapes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import stat
import uuid
from pathlib import Path

from rollbox.backends.conformance.harness import Harness, check, sh
from rollbox.errors import (
    NotFoundError,
    PathEscapeError,
)


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
