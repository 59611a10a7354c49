"""Conformance check of the file-copy contract (links in trees, chroot semantics)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from rollbox.backends.conformance.harness import Harness, check, sh
from rollbox.errors import (
    NotFoundError,
    PathEscapeError,
)


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
