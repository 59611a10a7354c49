"""The ``gvisor`` backend (runsc around the namespace backend's sandbox)."""

from rollbox.backends.gvisor.backend import GVisorBackend, GVisorSandbox

__all__ = ["GVisorBackend", "GVisorSandbox"]
