"""A rollbox microVM guest with a real cgroup-v2 kernel, holding what rollbox needs.

The guest's init mounts only ``cgroup2`` at ``/sys/fs/cgroup`` (see
``rollbox.backends.microvm.initramfs``). Its baseline is the session's Debian baseline
plus one layer built here on the host (cached in the store by the hash of its inputs):

* ``/usr/bin/bwrap`` and ``/usr/bin/runsc`` (this host's; the guest is the same Debian);
* ``/opt/rbx/site``: rollbox's Python dependencies (the distributions rollbox requires,
  copied from this venv; the guest's python3 is the same 3.11);
* ``/var/lib/rbx-home``: a rollbox home whose store already holds the Debian baseline
  (so sandboxes inside the guest start from the same digest as on the host).

Per run only this checkout's ``src/rollbox``, the guest driver and the C helpers compiled
on the host (the guest has no gcc) are uploaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.metadata as md
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollbox.backends.microvm import MicroVMBackend, MicroVMSandbox
from rollbox.baselines import layers as layerlib
from rollbox.baselines import oci
from rollbox.baselines.refs import hex_of
from rollbox.baselines.store import BaselineStore
from rollbox.config import Home
from rollbox.models import BaselineInfo, ExecResult, ImportSource, Limits, SandboxSpec

REPO = Path(__file__).resolve().parents[2]
GUEST_HOME = "/var/lib/rbx-home"
"""The rollbox home inside the guest: a tmpfs seeded from :data:`GUEST_SEED` at boot.

Not the image itself: the guest's root is an overlayfs, which refuses to create the 0/0
character devices a layer's whiteouts unpack to (snapshots would fail)."""
GUEST_SEED = "/opt/rbx/seed-home"
"""A rollbox home in the image whose store holds the Debian baseline."""
SEED = f"""set -e
H={GUEST_HOME}; S={GUEST_SEED}
mkdir -p $H && mount -t tmpfs -o size=1g,mode=0700 rbx-home $H
mkdir -p $H/layers $H/baselines $H/cache $H/oci/blobs/sha256 $H/bin
for f in $S/layers/*; do ln -s $f $H/layers/; done
for f in $S/oci/blobs/sha256/*; do ln -s $f $H/oci/blobs/sha256/; done
cp $S/baselines/* $H/baselines/; cp $S/cache/* $H/cache/
"""
"""Seeds the home: the big, immutable parts (layers, blobs) by symlink."""
GUEST_SITE = "/opt/rbx/site"
GUEST_SRC = "/opt/rbx/src"
GUEST_NAME = "rollbox-test/cgroup-v2-guest"
LAYOUT_VERSION = "8"
"""Bump when the extra layer's layout changes."""
TOOLS = ("/usr/bin/bwrap", "/usr/bin/runsc", "/usr/bin/ip", "/usr/sbin/iptables")
"""Copied from this host (same Debian); iptables because ``rollbox cleanup`` lists chains
(without nf_tables modules in the guest it finds none, which is right)."""
SKIP_DISTS = {"matplotlib"}
"""Imported lazily by rollbox (plots), not needed in the guest, and large."""


def _dist_closure(root: str = "rollbox") -> list[md.Distribution]:
    """``root``'s installed requirements, recursively (extras and markers not taken)."""
    seen: dict[str, md.Distribution] = {}
    todo = [root]
    while todo:
        name = re.split(r"[ ;<>=!~\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if not name or name in seen or name in SKIP_DISTS:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen[name] = dist
        for req in dist.requires or []:
            if "extra ==" in req:
                continue
            todo.append(req)
    seen.pop(root, None)
    return sorted(seen.values(), key=lambda d: d.metadata["Name"].lower())


def _copy_dists(dists: list[md.Distribution], dest: Path) -> None:
    for dist in dists:
        for f in dist.files or []:
            src = Path(str(dist.locate_file(f)))
            rel = Path(str(f))
            if rel.is_absolute() or ".." in rel.parts or "__pycache__" in rel.parts:
                continue
            if not src.is_file():
                continue
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out)


def _copy_tools(upper: Path, lower: list[Path]) -> None:
    """:data:`TOOLS` and the shared libraries they need that the baseline lacks."""
    for tool in TOOLS:
        out = upper / tool.lstrip("/")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(tool, out)
        ldd = subprocess.run(["ldd", tool], capture_output=True, text=True, check=False)
        for line in ldd.stdout.splitlines():
            parts = line.split()
            if len(parts) < 3 or parts[1] != "=>" or not parts[2].startswith("/"):
                continue
            lib = Path(os.path.realpath(parts[2]))
            rel = Path("usr/lib/x86_64-linux-gnu") / parts[0]
            if any((d / rel).exists() for d in lower):
                continue
            (upper / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib, upper / rel)


GUEST_MODULES = ("drivers/net/veth.ko",)
"""Guest kernel modules the tests load (the initramfs loads only what a sandbox needs):
veth for the conformance suite's network namespaces."""


def _copy_modules(upper: Path, shared: Home) -> None:
    """:data:`GUEST_MODULES` of the guest kernel and busybox (its ``insmod``) to /opt/rbx."""
    from rollbox.backends.microvm.kernel import ensure_kernel

    kernel = ensure_kernel(shared)
    dest = upper / "opt" / "rbx"
    dest.mkdir(parents=True, exist_ok=True)
    for m in GUEST_MODULES:
        shutil.copy2(kernel.modules_dir / m, dest / Path(m).name)
    shutil.copy2(shutil.which("busybox") or "/bin/busybox", dest / "busybox")


def _copy_baseline(src: BaselineStore, dst_home: Home, info: BaselineInfo, key: str) -> None:
    """Put ``info`` into the (empty) store of ``dst_home``: metadata, manifest and config
    blobs, its unpacked layers, and the recipe cache entry that makes ``default()`` find
    it without bootstrapping."""
    dst_home.ensure()
    dst = BaselineStore(dst_home)
    dst.meta_path(info.digest).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src.meta_path(info.digest), dst.meta_path(info.digest))
    blobs = [info.digest]
    manifest = json.loads(src.manifest_bytes(info.digest))
    blobs.append(manifest["config"]["digest"])
    blobs += [ly.digest for ly in info.layers]
    for d in blobs:
        out = dst.blob_path(d)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src.blob_path(d), out)
    (dst.layer_path(info.layers[0].diff_id)).parent.mkdir(parents=True, exist_ok=True)
    for ly in info.layers:
        subprocess.run(
            ["cp", "-a", str(src.layer_path(ly.diff_id)), str(dst.layer_path(ly.diff_id))],
            check=True,
        )
        files = src.layer_files_path(ly.diff_id)
        if files.exists():
            shutil.copy2(files, dst.layer_files_path(ly.diff_id))
    dst.cache_put("recipe", key, info.digest)


def guest_baseline(shared: Home) -> BaselineInfo:
    """The guest's baseline in ``shared``'s store (built once per input hash)."""
    from rollbox.baselines.builders.bootstrap import DEFAULT_RECIPE

    store = BaselineStore(shared)
    default = store.default()
    recipe_key = DEFAULT_RECIPE.hash()
    dists = _dist_closure()
    h = hashlib.sha256(f"{LAYOUT_VERSION} {default.digest} {recipe_key}".encode())
    for d in dists:
        h.update(f" {d.metadata['Name']}=={d.version}".encode())
    for tool in TOOLS:
        st = Path(tool).stat()
        h.update(f" {tool}:{st.st_size}:{st.st_mtime_ns}".encode())
    key = h.hexdigest()
    hit = store.cache_get("v2guest", key)
    if hit is not None:
        return hit
    with store.staging("v2guest") as stage:
        upper = stage / "upper"
        _copy_tools(upper, store.layer_dirs(default.digest))
        _copy_modules(upper, shared)
        _copy_dists(dists, upper / GUEST_SITE.lstrip("/"))
        _compile(upper / GUEST_SITE.lstrip("/"))
        _copy_baseline(store, Home(upper / GUEST_SEED.lstrip("/")), default, recipe_key)
        tar = stage / "layer.tar"
        with open(tar, "wb") as f:
            diff_id, size = layerlib.pack_dir(upper, f)
        os.replace(tar, stage / hex_of(diff_id))
        shutil.rmtree(upper)
        store._write_image(
            stage, [(oci.OCI_LAYER_TAR, diff_id, size)], "rollbox cgroup-v2 guest", base=default
        )
        info = store.commit_image(
            stage,
            ImportSource(path="tests/v2/guest.py", content_hash=diff_id),
            names=[GUEST_NAME],
            parent=default.digest,
            trusted=True,
        )
    store.cache_put("v2guest", key, info.digest)
    return info


def stage_payload(dest: Path) -> Path:
    """A directory for ``/opt/rbx`` of the guest: this checkout's ``src/rollbox`` and the
    guest driver (uploaded on every run: the code under test)."""
    shutil.copytree(
        REPO / "src" / "rollbox",
        dest / "src" / "rollbox",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy2(Path(__file__).with_name("guest_driver.py"), dest / "guest_driver.py")
    _compile(dest / "src")
    return dest


def _compile(tree: Path) -> None:
    """Byte-compile ``tree`` here: the guest's python3 is 3.11 too, and compiling every
    module on each import under TCG costs tens of seconds."""
    import compileall

    compileall.compile_dir(str(tree), quiet=2, workers=1)


DELEGATE = (
    "{ /opt/rbx/busybox insmod /opt/rbx/veth.ko 2>/dev/null; true; } && "
    "echo '+cpu +io' > /sys/fs/cgroup/cgroup.subtree_control && "
    "echo '+cpu +io' > /sys/fs/cgroup/rbx/cgroup.subtree_control"
)
"""What a service manager does for a unit with ``Delegate=yes``: every controller is
available in the unit's cgroup (the guest agent enables only memory and pids)."""
ENV = f"PYTHONPATH={GUEST_SRC}:{GUEST_SITE} ROLLBOX_HOME={GUEST_HOME}"


@dataclass
class Guest:
    """A running cgroup-v2 guest."""

    handle: MicroVMSandbox
    loop: asyncio.AbstractEventLoop

    def sh(self, script: str, timeout: float = 600) -> ExecResult:
        """Run ``script`` in the guest as root (the VM is the boundary); its stderr is
        passed through as it comes (progress shows in the test log)."""
        return self.loop.run_until_complete(
            self.handle.exec(script, timeout=timeout, on_stderr=_progress)
        )

    def driver(self, *args: str, mode: str = "delegated", timeout: float = 900) -> Any:
        """Run ``guest_driver.py ARGS`` and return its JSON.

        ``mode``: ``delegated`` (rollbox in a unit-like cgroup with every controller,
        moving itself into a leaf), ``root`` (rollbox in the root cgroup of a plain host).
        """
        prelude = DELEGATE if mode == "delegated" else "echo $$ > /sys/fs/cgroup/cgroup.procs"
        cmd = f"{prelude} && {ENV} python3 /opt/rbx/guest_driver.py {shlex.join(args)}"
        r = self.sh(cmd, timeout=timeout)
        for line in r.stdout.splitlines():
            if line.startswith("RBX-JSON "):
                return json.loads(line[len("RBX-JSON ") :])
        raise AssertionError(
            f"guest driver {args} exited {r.exit_code} without a result:\n"
            f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        )

    def rollbox(self, args: str, prelude: str = DELEGATE) -> ExecResult:
        """Run the ``rollbox`` CLI in the guest."""
        cmd = f"{prelude} && {ENV} python3 -c 'from rollbox.cli.main import main; main()' {args}"
        return self.sh(cmd)


def _progress(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def _host_helpers(home: Home) -> Path:
    """Compile the C helpers on the host (the guest has no gcc) into ``home``'s bin/."""
    from rollbox.backends.agent.build import agent_binary
    from rollbox.backends.gvisor.helper import helper_binary, statx_shim
    from rollbox.backends.namespace.seccomp import filter_file

    home.ensure()
    agent_binary(home)
    filter_file(home.root / "bin")
    helper_binary(home)
    statx_shim(home)
    return home.root / "bin"


@contextlib.contextmanager
def boot(shared: Home) -> Iterator[Guest]:
    """Boot a guest from :func:`guest_baseline`, upload this checkout's rollbox and the
    host-compiled helpers, yield it, destroy it (and anything it left) afterwards.

    Raises:
        RollboxError: the guest cannot be built or booted (callers fail, never skip).
    """
    loop = asyncio.new_event_loop()
    baseline = guest_baseline(shared)
    with tempfile.TemporaryDirectory(prefix="rbx-v2-") as tmp:
        home = Home(Path(tmp) / "home")
        home.root.mkdir(parents=True)
        for name in ("oci", "layers", "baselines", "cache", "vm"):
            (home.root / name).symlink_to(shared.root / name)
        home.ensure()
        be = MicroVMBackend(home)
        be.full_command_caps = True  # rollbox in the guest mounts, unshares, makes cgroups
        be.prepare()
        spec = SandboxSpec(
            baseline=baseline.digest,
            backend="microvm",
            limits=Limits(cpus=2, memory_mb=1536, pids=None, disk_mb=4096),
        )
        h = loop.run_until_complete(be.create(spec, baseline))
        assert isinstance(h, MicroVMSandbox)
        try:
            payload = stage_payload(Path(tmp) / "payload")
            loop.run_until_complete(h.upload(payload, "/opt/rbx"))
            bins = _host_helpers(Home(Path(tmp) / "helpers"))
            seeded = loop.run_until_complete(h.exec(SEED))
            if seeded.exit_code != 0:
                raise AssertionError(f"seeding the guest's home failed: {seeded.stderr}")
            loop.run_until_complete(h.upload(bins, f"{GUEST_HOME}/bin"))
            yield Guest(h, loop)
        finally:
            try:
                loop.run_until_complete(h.destroy())
            finally:
                be.cleanup_orphans()
                loop.close()
