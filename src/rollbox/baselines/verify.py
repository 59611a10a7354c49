"""``verify``: re-hash stored blobs and unpacked layers; name every corrupted path."""

from __future__ import annotations

from pydantic import BaseModel

from rollbox.baselines import layers as layerlib
from rollbox.baselines import oci
from rollbox.baselines.refs import sha256_file
from rollbox.baselines.store import BaselineStore
from rollbox.errors import StoreError
from rollbox.models import BaselineInfo


class VerifyReport(BaseModel):
    """Outcome of ``verify``."""

    baselines: list[str]
    """Digests checked."""
    blobs_checked: int
    """Blobs re-hashed."""
    layers_checked: int
    """Unpacked layer directories re-hashed."""
    corrupt: list[str]
    """Each corrupt or missing path, with what is wrong."""

    @property
    def ok(self) -> bool:
        return not self.corrupt


def verify(store: BaselineStore, infos: list[BaselineInfo] | None = None) -> VerifyReport:
    """Check the blobs and layer directories of ``infos`` (default: every baseline)."""
    infos = store.all() if infos is None else infos
    corrupt: list[str] = []
    blobs_done: set[str] = set()
    layers_done: set[str] = set()

    def check_blob(digest: str) -> None:
        if digest in blobs_done:
            return
        blobs_done.add(digest)
        path = store.blob_path(digest)
        if not path.is_file():
            corrupt.append(f"{path} (missing blob)")
        elif sha256_file(path) != digest:
            corrupt.append(f"{path} (blob does not match its digest)")

    for info in infos:
        check_blob(info.digest)
        try:
            _doc, _m, cfg, _layers = oci.parse_manifest(store.manifest_bytes(info.digest))
            check_blob(cfg.digest)
        except (OSError, StoreError):
            pass
        for layer in info.layers:
            check_blob(layer.digest)
            if layer.diff_id in layers_done:
                continue
            layers_done.add(layer.diff_id)
            corrupt.extend(
                layerlib.check_layer(
                    store.layer_path(layer.diff_id), store.layer_files_path(layer.diff_id)
                )
            )
    return VerifyReport(
        baselines=[i.digest for i in infos],
        blobs_checked=len(blobs_done),
        layers_checked=len(layers_done),
        corrupt=corrupt,
    )
