"""Moved to :mod:`rollbox.backends.common.capture` (shared by every backend); re-exported."""

from rollbox.backends.common.capture import MASK, StreamCapture, mask

__all__ = ["MASK", "StreamCapture", "mask"]
