"""The microVM backend's sizes and limits, and where its derived assets live.

Its switches (boot timeout, boot snapshots, split memory, ...) are fields of
:class:`~rollbox.backends.config.MicroVMConfig`, read through ``backend.vm_config``.
"""

from __future__ import annotations

import os
from pathlib import Path

from rollbox.config import Home

DEFAULT_DISK_MB = 4096
GUEST_OVERHEAD_MB = 160  # kernel, page cache and the agent, on top of the memory limit
MIN_MEMORY_MB = 32
MIN_DISK_MB = 16
PIPE_BYTES = 1 << 20  # fs.pipe-max-size default; larger needs CAP_SYS_RESOURCE


def assets_home(home: Home) -> Home:
    """The home whose ``vm/`` caches derived VM assets (kernel, initramfs, per-digest disk
    images, boot snapshots): the one owning the layer store they derive from, so homes that
    share a store (symlinked ``layers/``) share them too."""
    return Home(Path(os.path.realpath(home.layers)).parent)
