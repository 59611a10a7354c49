"""The ``namespace`` backend (bubblewrap, cgroups v1, seccomp, the rollbox agent)."""

from rollbox.backends.namespace.backend import NamespaceBackend, NamespaceSandbox

__all__ = ["NamespaceBackend", "NamespaceSandbox"]
