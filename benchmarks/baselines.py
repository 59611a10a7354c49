"""Baselines: bootstrap and Dockerfile builds, side by side with the raw tools.

* cold bootstrap — ``bootstrap(default recipe)`` in a fresh home vs raw
  ``mmdebstrap --variant=minbase --include=… bookworm OUT.tar`` (same packages);
* cached bootstrap — ``BaselineStore.default()`` again (library) and
  ``rollbox baseline default --json`` (CLI process, includes Python start-up);
* cold build — a small Dockerfile (ENV/WORKDIR/COPY/RUN) on the default baseline, a new
  context file each run so nothing is cached, vs raw ``buildah bud --isolation chroot
  --pull=never --layers=false`` of the same Dockerfile on the same base image;
* cached build — the same input again (library and CLI) vs raw ``buildah bud --layers``
  re-run on an unchanged input (buildah's own layer cache);
* snapshot — ``commit_snapshot`` of a small overlay upper dir (20 files, a whiteout, an
  opaque dir) onto a 274 MB baseline vs raw ``tar --sort=name -cf`` of the same dir.

Runs alternate rollbox/raw so both see the same machine load.
Usage: ``python benchmarks/baselines.py [-n N] [--cold-n N] [--only snapshot]`` (root);
writes (``--only``: updates) benchmarks/results/baselines.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _rootfs import debian_rootfs_tar  # benchmarks/_rootfs.py
from _stats import stats_ms  # benchmarks/_stats.py (scripts run from benchmarks/)
from rollbox.baselines.builders.bootstrap import DEFAULT_NAMES, DEFAULT_RECIPE, bootstrap
from rollbox.baselines.builders.buildah import BASE_REPO, build
from rollbox.baselines.refs import hex_of
from rollbox.baselines.store import BaselineStore
from rollbox.config import Home
from rollbox.models import BaselineInfo, RecipeSource, SnapshotSource

RESULTS = Path(__file__).with_name("results") / "baselines.json"
DOCKERFILE = """\
FROM debian:bookworm
ENV APP=/opt/app
WORKDIR /opt/app
COPY nonce.txt ./
RUN echo built > built.txt && python3 -c 'print(6*7)' > answer.txt
"""


def stats(xs: list[float]) -> dict[str, float]:
    """Median, p99 (nearest rank) and mean in milliseconds."""
    return stats_ms(xs)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(cmd: list[str], **kw: object) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]


def dangling() -> set[str]:
    out = subprocess.run(
        ["buildah", "images", "-q", "--filter", "dangling=true"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return set(out.split())


def pair(name: str, ours: list[float], raw: list[float], raw_cmd: str) -> dict[str, object]:
    a, b = stats(ours), stats(raw)
    return {
        "rollbox": a,
        "raw": b,
        "raw_command": raw_cmd,
        "ratio_p50": round(a["p50_ms"] / b["p50_ms"], 3) if b["p50_ms"] else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=10, help="runs of the cheap cases")
    ap.add_argument("--cold-n", type=int, default=1, help="runs of cold bootstrap (~25 s each)")
    ap.add_argument("--build-n", type=int, default=5, help="runs of cold builds")
    ap.add_argument("--only", choices=["snapshot"], help="run one case, update the JSON")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rbx-bench-baselines-", dir="/var/tmp"))
    results: dict[str, object] = {}
    if args.only == "snapshot":
        try:
            results = json.loads(RESULTS.read_text())["results"]
        except (OSError, ValueError, KeyError):
            results = {}
        try:
            results["snapshot"] = bench_snapshot(work, max(args.n, 20))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        write(results)
        return
    try:
        # ---------------------------------------------------------------- bootstrap
        ours, raw = [], []
        store = BaselineStore(Home(work / "home-0").ensure())
        raw_cmd = [
            "mmdebstrap", "--variant=minbase", "--format=tar",
            "--include=" + ",".join(DEFAULT_RECIPE.packages), "bookworm",
        ]  # fmt: skip
        post = []
        for i in range(args.cold_n):
            # the mirror/proxy warms up on the first download: alternate who goes first
            store = BaselineStore(Home(work / f"home-{i}").ensure())
            out = work / f"raw-{i}.tar"
            steps = [
                (ours, lambda s=store: bootstrap(s, DEFAULT_RECIPE, names=DEFAULT_NAMES)),
                (raw, lambda o=out: run([*raw_cmd, str(o)])),
            ]
            for acc, fn in steps if i % 2 else reversed(steps):
                acc.append(timed(fn))
            # rollbox's own share: turning mmdebstrap's tar into a stored, unpacked baseline
            other = BaselineStore(Home(work / f"post-{i}").ensure())
            src = RecipeSource(recipe_hash="0" * 64, recipe={})
            post.append(timed(lambda o=other, t=out, r=src: o.import_layer_tar(t, r)))
            out.unlink()
            shutil.rmtree(work / f"post-{i}")
        results["bootstrap_cold"] = {
            **pair("bootstrap_cold", ours, raw, " ".join(raw_cmd) + " OUT"),
            "rollbox_post_processing": stats(post),
            "note": "post_processing = hash + unpack + per-file manifest of mmdebstrap's tar; "
            "the rest of the difference is download variance (one run each, alternating)",
        }
        info = store.default()

        lib = [timed(store.default) for _ in range(args.n * 5)]
        env = {**os.environ, "ROLLBOX_HOME": str(store.home.root)}
        cli_cmd = [sys.executable, "-m", "rollbox.cli.main", "baseline", "default", "--json"]
        cli = [timed(lambda: run(cli_cmd, env=env)) for _ in range(args.n)]
        ver_cmd = [sys.executable, "-m", "rollbox.cli.main", "version"]
        noop = [timed(lambda: run(ver_cmd, env=env)) for _ in range(args.n)]
        results["bootstrap_cached"] = {
            "rollbox_library": stats(lib),
            "rollbox_cli": stats(cli),
            "cli_startup_only": stats(noop),
            "note": "cached: recipe hash -> digest lookup; no raw tool equivalent (mmdebstrap "
            "has no cache, its cold time is above)",
        }

        # ---------------------------------------------------------------- build
        ctx = work / "ctx"
        ctx.mkdir()
        (ctx / "Dockerfile").write_text(DOCKERFILE)
        (ctx / "nonce.txt").write_text("warm-up")
        build(store, ctx)  # hands the base to containers-storage once
        base = f"{BASE_REPO}:{hex_of(info.digest)}"
        raw_df = work / "raw.Dockerfile"
        raw_df.write_text(DOCKERFILE.replace("FROM debian:bookworm", f"FROM {base}"))
        raw_build = [
            "buildah", "bud", "--isolation", "chroot", "--pull=never", "--layers=false",
            "-f", str(raw_df), "-t", "localhost/rollbox-bench-raw:1", str(ctx),
        ]  # fmt: skip
        ours, raw = [], []
        for i in range(args.build_n):
            (ctx / "nonce.txt").write_text(f"run {i} {time.time()}")
            ours.append(timed(lambda: build(store, ctx)))
            raw.append(timed(lambda: run(raw_build)))
        results["build_cold"] = pair(
            "build_cold", ours, raw, " ".join(raw_build[:-6]) + " -f Dockerfile CTX"
        )
        lib = [timed(lambda: build(store, ctx)) for _ in range(args.n * 5)]
        cli_build = [sys.executable, "-m", "rollbox.cli.main", "baseline", "build", str(ctx)]
        cli = [timed(lambda: run(cli_build, env=env)) for _ in range(args.n)]
        raw_cached_cmd = [c if c != "--layers=false" else "--layers" for c in raw_build]
        dangling_before = dangling()
        run(raw_cached_cmd)
        raw = [timed(lambda: run(raw_cached_cmd)) for _ in range(args.n)]
        results["build_cached"] = {
            **pair("build_cached", lib, raw, "buildah bud --layers (re-run, unchanged input)"),
            "rollbox_cli": stats(cli),
        }
        run(["buildah", "rmi", "--force", "localhost/rollbox-bench-raw:1"])
        for image in dangling() - dangling_before:  # only the raw --layers cache we made
            subprocess.run(["buildah", "rmi", image], capture_output=True, check=False)
        results["snapshot"] = bench_snapshot(work, max(args.n, 20), store, info)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write(results)


def bench_snapshot(
    work: Path, n: int, store: BaselineStore | None = None, base: BaselineInfo | None = None
) -> dict[str, object]:
    """``commit_snapshot`` of a small upper dir vs raw ``tar -cf`` of it."""
    if store is None or base is None:
        store = BaselineStore(Home(work / "snap-home").ensure())
        base = store.import_rootfs(debian_rootfs_tar())
    upper = work / "upper"
    (upper / "etc").mkdir(parents=True)
    (upper / "work").mkdir()
    for i in range(20):
        (upper / "work" / f"f{i}.txt").write_text(f"file {i}\n" * 50)
    os.mknod(upper / "etc" / "hostname", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    (upper / "usr").mkdir()
    os.setxattr(upper / "usr", "trusted.overlay.opaque", b"y")
    ours, raw = [], []
    for i in range(n):
        (upper / "nonce").write_text(f"{i} {time.time()}")  # a new layer every time
        src = SnapshotSource(sandbox_id=f"sbx-bench{i}", backend="namespace")
        ours.append(timed(lambda s=src: store.commit_snapshot(base.digest, upper, s)))
        out = work / "raw-snap.tar"
        raw.append(
            timed(lambda o=out: run(["tar", "--sort=name", "-cf", str(o), "-C", str(upper), "."]))
        )
    return pair("snapshot", ours, raw, "tar --sort=name -cf OUT -C UPPER .")


def write(results: dict[str, object]) -> None:
    doc = {
        "benchmark": "baselines",
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "load_avg_at_end": os.getloadavg(),
        "results": results,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
