"""Probes on the host side of file transfer and on the baseline store's integrity."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

from rollbox.audit import scripts
from rollbox.audit.context import AuditContext, ProbeError
from rollbox.audit.registry import Outcome, probe, verdict
from rollbox.config import Home
from rollbox.errors import NotFoundError, RollboxError

RACE_DIR = "/root/rbx-race"
ENOUGH_TRANSFERS = 60
"""On the sandbox's root filesystem (not a tmpfs that only the sandbox's kernel sees)."""


def _tree_has(root: Path, needle: bytes) -> list[str]:
    hits = []
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            if p.is_symlink():
                continue
            try:
                if needle in p.read_bytes():
                    hits.append(str(p))
            except OSError:
                continue
    return hits


def links_out(dest: Path) -> list[str]:
    """Host symlinks at or below ``dest`` that point out of it (absolute, or resolving
    outside): the next writer of such a path would write a host file."""
    top = os.path.realpath(dest.parent if dest.is_symlink() else dest)
    found = []
    paths = [str(dest)] if dest.is_symlink() else []
    if dest.is_dir() and not dest.is_symlink():
        for dirpath, dirs, files in os.walk(dest):
            paths += [os.path.join(dirpath, n) for n in dirs + files]
    for p in paths:
        if not os.path.islink(p):
            continue
        text = os.readlink(p)
        real = os.path.realpath(p)
        if dest.is_symlink() or text.startswith("/") or not real.startswith(top + "/"):
            found.append(f"{p} -> {text}")
    return found


@probe("download-symlink-race", "host")
async def symlink_race(ctx: AuditContext) -> Outcome:
    """Downloads racing a symlink swap inside never read a host file outside the root."""
    a, _ = await ctx.shared()
    canary = str(ctx.canary_file)
    depth = "../" * 12
    targets = [canary, depth + canary.lstrip("/"), str(ctx.canary_dir)]
    needle = ctx.canary_token.encode()
    swapper = asyncio.create_task(
        ctx.py(
            a,
            scripts.SYMLINK_SWAPPER,
            # up to 30 s, stopped as soon as enough transfers raced it: a directory
            # download runs a helper process in the guest, slow under TCG (microvm)
            {"targets": targets, "seconds": 30.0, "dir": RACE_DIR},
            timeout=60,
        )
    )
    outcomes: Counter[str] = Counter()
    leaks: list[str] = []
    host_links: list[str] = []
    scratch = Path(tempfile.mkdtemp(prefix=f"rbx-audit-{ctx.home.tag}-dl-"))
    try:
        await asyncio.sleep(0.3)
        # precondition: a transfer works at all while the race runs (a control file the
        # swapper writes once and never touches); the raced transfers may all lose
        control: str | None = None
        deadline = time.monotonic() + 30
        while control != "benign\n" and not swapper.done() and time.monotonic() < deadline:
            try:  # (caught while the swapper is still writing it: empty)
                await a.files.download(RACE_DIR + "/benign", scratch / "control")
                control = (scratch / "control").read_text()
            except NotFoundError:
                pass
            if control != "benign\n":
                await asyncio.sleep(0.2)
        if control != "benign\n":
            raise ProbeError(f"a control download during the race failed (got {control!r})")
        i = 0
        while not swapper.done():
            if sum(outcomes.values()) >= ENOUGH_TRANSFERS:
                await a.files.write(RACE_DIR + "/stop", "stop")
                await swapper
                break
            i += 1
            dest = scratch / f"d{i}"
            try:
                # trees both ways: links out refused, and replaced by what they point to
                if i % 4 == 0:
                    await a.files.download(RACE_DIR, dest)
                elif i % 4 == 3:
                    await a.files.download(RACE_DIR, dest, links="content")
                elif i % 4 == 1:
                    await a.files.download(RACE_DIR + "/f", dest)
                else:
                    data = await a.files.read(RACE_DIR + "/f")
                    dest.write_bytes(data)
                outcomes["ok"] += 1
            except RollboxError as exc:
                outcomes[type(exc).__name__] += 1
            except OSError as exc:
                outcomes[f"OSError:{exc.errno}"] += 1
            if dest.exists() or dest.is_symlink():
                host_links += links_out(dest)
                if dest.is_dir() and not dest.is_symlink():
                    leaks += _tree_has(dest, needle)
                elif dest.is_file() and not dest.is_symlink() and needle in dest.read_bytes():
                    leaks.append(str(dest))
                if dest.is_dir() and not dest.is_symlink():
                    shutil.rmtree(dest, ignore_errors=True)
                else:
                    dest.unlink(missing_ok=True)
        swaps = (await swapper)["swaps"]
    finally:
        if not swapper.done():
            swapper.cancel()
        shutil.rmtree(scratch, ignore_errors=True)
    if swaps == 0 or sum(outcomes.values()) < 10:
        raise ProbeError(f"race did not run ({swaps} swaps, {dict(outcomes)} transfers)")
    breaches = []
    if leaks:
        breaches.append(f"host canary content read through the sandbox: {leaks[:3]}")
    if host_links:
        breaches.append(f"downloads left host symlinks pointing out: {host_links[:3]}")
    out = verdict(
        breaches,
        f"{sum(outcomes.values())} transfers during {swaps} symlink swaps: {dict(outcomes)}; "
        "no host content came out, no host symlink points out of a destination",
    )
    out.evidence = {
        "transfers": dict(outcomes),
        "swaps": swaps,
        "symlink_targets": targets,
        "host_links_out": host_links[:20],
    }
    return out


@probe("baseline-hash-mismatch", "store")
async def hash_mismatch(ctx: AuditContext) -> Outcome:
    """A corrupted layer blob or unpacked layer file in a copy of a store is named by verify."""
    from rollbox.baselines.store import BaselineStore
    from rollbox.baselines.verify import verify

    tmp = Path(tempfile.mkdtemp(prefix=f"rbx-audit-{ctx.home.tag}-store-"))
    try:
        root = tmp / "rootfs"
        (root / "bin").mkdir(parents=True)
        (root / "etc").mkdir()
        (root / "etc" / "data.txt").write_text("rollbox audit layer content\n" * 64)
        (root / "etc" / "other.txt").write_text("other\n")
        store = BaselineStore(Home(tmp / "home").ensure())
        info = await asyncio.to_thread(store.import_rootfs, root, names=["audit/corrupt"])
        clean = await asyncio.to_thread(verify, store, [info])
        if not clean.ok:
            raise ProbeError(f"fresh store copy does not verify: {clean.corrupt}")
        # 1. flip one byte of an unpacked layer file
        layer = store.layer_dirs(info.digest)[-1]
        victim = layer / "etc" / "data.txt"
        _flip(victim)
        r1 = await asyncio.to_thread(verify, store, [info])
        # 2. restore it, flip one byte of the layer blob
        victim.write_text("rollbox audit layer content\n" * 64)
        blob = store.blob_path(info.layers[-1].digest)
        _flip(blob)
        r2 = await asyncio.to_thread(verify, store, [info])
        named1 = any("data.txt" in c for c in r1.corrupt)
        named2 = any(info.layers[-1].digest.split(":")[-1] in c for c in r2.corrupt)
        breaches = []
        if not named1:
            breaches.append(f"corrupted layer file not detected: {r1.corrupt}")
        if not named2:
            breaches.append(f"corrupted layer blob not detected: {r2.corrupt}")
        out = verdict(
            breaches,
            "verify names the flipped byte in the unpacked layer and in the layer blob",
        )
        out.evidence = {"layer_file": r1.corrupt, "layer_blob": r2.corrupt}
        return out
    finally:
        await asyncio.to_thread(_rm_tree, tmp)


def _flip(path: Path) -> None:
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _rm_tree(path: Path) -> None:
    for dirpath, dirs, _files in os.walk(path):
        for d in dirs:
            os.chmod(os.path.join(dirpath, d), 0o755)
    shutil.rmtree(path, ignore_errors=True)
