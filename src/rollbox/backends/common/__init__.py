"""Host building blocks shared by the container-style backends (namespace, gvisor):
cgroup v1 groups, overlay root filesystems, allow-list networking and OCI bundles."""
