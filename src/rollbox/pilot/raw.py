"""The raw tools doing the same bare start as a sandbox, timed in the same run.

Each timer starts ``true`` in a fresh isolated environment made straight by the tool, with
the command line the backend itself builds on (see FIELD-NOTES / the backends):

* ``namespace`` → ``bwrap --ro-bind ROOT / --dev /dev --proc /proc --unshare-all
  --die-with-parent true``
* ``gvisor`` → ``runsc --network=none run -bundle BUNDLE ID`` (config.json from ``runc spec``)
* ``runc`` (reference) → ``runc run -b BUNDLE ID``
* ``microvm`` → a QEMU ``microvm`` boot (TCG) of the backend's guest kernel with a busybox
  initramfs whose init runs ``true`` and powers off

ROOT is the baseline's root filesystem: its single layer directory, or a read-only
overlay of its layers mounted for the duration of the timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from rollbox.config import Home
from rollbox.errors import BackendUnavailableError
from rollbox.ids import ulid

RAW_TOOL = {"namespace": "bwrap", "gvisor": "runsc", "microvm": "qemu"}
"""The raw tool each backend is compared with."""


@contextlib.contextmanager
def rootfs_of(layer_dirs: list[Path], scratch: Path) -> Iterator[Path]:
    """A read-only root filesystem made of ``layer_dirs`` (bottom first).

    One layer is used as it is; several are stacked in a read-only overlay (no upper dir)
    at ``scratch/root``, unmounted on exit.
    """
    if not layer_dirs:
        raise BackendUnavailableError("baseline has no layers to start the raw tool on")
    if len(layer_dirs) == 1:
        yield layer_dirs[0]
        return
    mnt = scratch / "root"
    mnt.mkdir(parents=True, exist_ok=True)
    lower = ":".join(str(p) for p in reversed(layer_dirs))
    subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", f"ro,lowerdir={lower}", str(mnt)],
        check=True,
        capture_output=True,
    )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)


class RawTimer:
    """Times one raw start of ``true``; subclasses give the command line."""

    tool: str = ""

    def __init__(self, root: Path, scratch: Path, tag: str) -> None:
        self.root = root
        self.scratch = scratch
        self.tag = tag

    def available(self) -> str | None:
        """``None`` when the tool can run here, else the reason it cannot."""
        if shutil.which(self.tool) is None:
            return f"{self.tool} is not installed"
        return None

    def setup(self) -> None:
        """Prepare shared assets (bundle directories...)."""

    def command(self, run_id: str) -> list[str]:
        """The argv of one bare start."""
        raise NotImplementedError

    def after(self, run_id: str) -> None:
        """Remove what one start left (runtime state)."""

    def teardown(self) -> None:
        """Remove the shared assets."""

    async def once(self) -> float:
        """Start ``true`` once; return the wall time in seconds.

        Raises:
            BackendUnavailableError: the tool failed (its stderr is in the message).
        """
        run_id = f"rbxraw-{self.tag}-{ulid()[-10:]}"
        argv = self.command(run_id)
        t0 = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
        dt = time.perf_counter() - t0
        await asyncio.to_thread(self.after, run_id)
        if proc.returncode != 0:
            raise BackendUnavailableError(
                f"raw {self.tool} start failed (exit {proc.returncode}): "
                + err.decode(errors="replace").strip()[-300:]
            )
        return dt


class BwrapTimer(RawTimer):
    """``bwrap --unshare-all`` start of ``true`` (the namespace backend's tool)."""

    tool = "bwrap"

    def command(self, run_id: str) -> list[str]:
        return [
            "bwrap",
            "--ro-bind",
            str(self.root),
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--unshare-all",
            "--die-with-parent",
            "true",
        ]


class _BundleTimer(RawTimer):
    """An OCI runtime run of a bundle whose config comes from ``runc spec``."""

    def setup(self) -> None:
        self.bundle = self.scratch / f"bundle-{self.tool}"
        self.state = self.scratch / f"state-{self.tool}"
        self.bundle.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)
        cfg_path = self.bundle / "config.json"
        cfg_path.unlink(missing_ok=True)
        subprocess.run(
            ["runc", "spec", "--bundle", str(self.bundle)], check=True, capture_output=True
        )
        cfg = json.loads(cfg_path.read_text())
        cfg["root"] = {"path": str(self.root), "readonly": True}
        cfg["process"]["args"] = ["true"]
        cfg["process"]["terminal"] = False
        cfg_path.write_text(json.dumps(cfg))

    def teardown(self) -> None:
        shutil.rmtree(self.bundle, ignore_errors=True)
        shutil.rmtree(self.state, ignore_errors=True)


class RuncTimer(_BundleTimer):
    """``runc run`` of ``true`` (reference figure)."""

    tool = "runc"

    def command(self, run_id: str) -> list[str]:
        return ["runc", "--root", str(self.state), "run", "-b", str(self.bundle), run_id]

    def after(self, run_id: str) -> None:
        subprocess.run(
            ["runc", "--root", str(self.state), "delete", "--force", run_id],
            check=False,
            capture_output=True,
        )


class RunscTimer(_BundleTimer):
    """``runsc --network=none run`` of ``true`` (the gvisor backend's tool)."""

    tool = "runsc"

    def available(self) -> str | None:
        return super().available() or (None if shutil.which("runc") else "runc is needed for spec")

    def command(self, run_id: str) -> list[str]:
        return [
            "runsc",
            "--root",
            str(self.state),
            "--network=none",
            "run",
            "-bundle",
            str(self.bundle),
            run_id,
        ]

    def after(self, run_id: str) -> None:
        subprocess.run(
            ["runsc", "--root", str(self.state), "delete", "--force", run_id],
            check=False,
            capture_output=True,
        )


class QemuTimer(RawTimer):
    """A QEMU ``microvm`` boot (TCG, as the backend uses on this host) of the microvm
    backend's guest kernel with a busybox initramfs whose init runs ``true`` and powers off."""

    tool = "qemu-system-x86_64"

    def __init__(self, root: Path, scratch: Path, tag: str, home: Home) -> None:
        super().__init__(root, scratch, tag)
        self.home = home
        self._argv: list[str] | None = None

    def available(self) -> str | None:
        reason = super().available()
        if reason:
            return reason
        busybox = shutil.which("busybox")
        if busybox is None:
            return "busybox (busybox-static) is not installed"
        try:
            from rollbox.backends.microvm import qemu as vmq
            from rollbox.backends.microvm.kernel import ensure_kernel

            kernel = ensure_kernel(self.home)
            append = f"{vmq.BASE_APPEND} {vmq.TCG_APPEND} tsc_early_khz={vmq.host_tsc_khz()}"
        except Exception as exc:  # the backend's own failure is reported, not raised
            return f"microvm guest kernel unavailable: {type(exc).__name__}: {exc}"
        initrd = self.scratch / "raw-initrd.cpio"
        tree = self.scratch / "raw-initrd"
        (tree / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(busybox, tree / "bin" / "busybox")
        init = tree / "init"
        init.write_text("#!/bin/busybox sh\n/bin/busybox true\n/bin/busybox poweroff -f\n")
        init.chmod(0o755)
        names = subprocess.run(
            ["find", ".", "-print"], cwd=tree, capture_output=True, check=True
        ).stdout
        with initrd.open("wb") as out:
            subprocess.run(
                ["cpio", "-o", "-H", "newc", "--quiet"], cwd=tree, input=names, stdout=out,
                check=True,
            )  # fmt: skip
        self._argv = [
            "qemu-system-x86_64",
            "-M", "microvm,x-option-roms=off,rtc=on,isa-serial=on",
            "-accel", "tcg,thread=multi,tb-size=32", "-cpu", "max",
            "-m", "256", "-smp", "1",
            "-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-serial", "none",
            "-kernel", str(kernel.vmlinuz), "-initrd", str(initrd),
            "-append", f"{append} rdinit=/init",
        ]  # fmt: skip
        return None

    def command(self, run_id: str) -> list[str]:
        assert self._argv is not None
        return self._argv


def make_timer(backend: str, root: Path, scratch: Path, home: Home) -> RawTimer:
    """The raw timer that goes with ``backend``."""
    if backend == "namespace":
        return BwrapTimer(root, scratch, home.tag)
    if backend == "gvisor":
        return RunscTimer(root, scratch, home.tag)
    if backend == "runc":
        return RuncTimer(root, scratch, home.tag)
    if backend == "microvm":
        return QemuTimer(root, scratch, home.tag, home)
    raise BackendUnavailableError(f"no raw tool known for backend {backend!r}")


async def time_raw(timer: RawTimer, samples: int, concurrency: int) -> list[float]:
    """``samples`` bare starts, at most ``concurrency`` at once; durations in seconds."""
    sem = asyncio.Semaphore(max(1, concurrency))
    out: list[float] = []

    async def one() -> None:
        async with sem:
            out.append(await timer.once())

    async with asyncio.TaskGroup() as tg:
        for _ in range(samples):
            tg.create_task(one())
    return out


def raw_scratch(home: Home) -> Path:
    """A fresh scratch directory for raw timers under the home's ``tmp/``."""
    path = home.tmp / f"pilot-raw-{os.getpid()}-{ulid()[-8:]}"
    path.mkdir(parents=True, exist_ok=True)
    return path
