"""Builders that produce baselines: bootstrap (mmdebstrap), buildah, skopeo, rootfs import."""
