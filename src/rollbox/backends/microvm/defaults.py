"""The microVM backend's sizes, limits and switches, and where its derived assets live."""

from __future__ import annotations

import os
from pathlib import Path

from rollbox.config import Home

BOOT_TIMEOUT_S = float(os.environ.get("ROLLBOX_MICROVM_BOOT_TIMEOUT", "120"))
DEFAULT_DISK_MB = 4096
GUEST_OVERHEAD_MB = 160  # kernel, page cache and the agent, on top of the memory limit
MIN_MEMORY_MB = 32
MIN_DISK_MB = 16
PIPE_BYTES = 1 << 20  # fs.pipe-max-size default; larger needs CAP_SYS_RESOURCE
TEMPLATES = os.environ.get("ROLLBOX_MICROVM_BOOT_SNAPSHOTS", "1") != "0"
"""Create by restoring a boot snapshot of the same baseline and VM shape when one exists
(the first create of a shape boots cold and saves it)."""
SPLIT_MEMORY = os.environ.get("ROLLBOX_MICROVM_SPLIT_MEMORY", "1") != "0"
"""Save memory snapshots as a copy-on-write RAM image + device state (lazy restores)."""


def assets_home(home: Home) -> Home:
    """The home whose ``vm/`` caches derived VM assets (kernel, initramfs, per-digest disk
    images, boot snapshots): the one owning the layer store they derive from, so homes that
    share a store (symlinked ``layers/``) share them too."""
    return Home(Path(os.path.realpath(home.layers)).parent)
