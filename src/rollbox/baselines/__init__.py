"""Baselines: the OCI store, its builders (buildah, skopeo, mmdebstrap, import) and gc."""
