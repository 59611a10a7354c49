"""Import from a real loopback docker-registry and export/import round trips."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rollbox.baselines.builders.skopeo import export_image, import_image
from rollbox.baselines.store import BaselineStore
from rollbox.config import Home
from rollbox.errors import InvalidInputError, NotFoundError
from rollbox.models import BaselineInfo, SnapshotSource

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_registry_import_keeps_pushed_digest(
    store: BaselineStore, tiny: BaselineInfo, registry: str, tmp_path: Path
) -> None:
    # push with plain skopeo (not rollbox) and note the digest the registry serves
    archive = tmp_path / "tiny.tar"
    export_image(store, tiny.digest, f"oci-archive:{archive}")
    digest_file = tmp_path / "pushed.digest"
    subprocess.run(
        [
            "skopeo", "copy", "--quiet", "--dest-tls-verify=false", "--digestfile",
            str(digest_file), f"oci-archive:{archive}", f"docker://{registry}/rbx/tiny:1",
        ],
        check=True,
    )  # fmt: skip
    pushed = digest_file.read_text().strip()
    other = BaselineStore(Home(tmp_path / "other").ensure())
    info = import_image(other, f"docker://{registry}/rbx/tiny:1", names=["pulled:1"])
    assert info.digest == pushed
    assert set(info.names) == {"pulled:1", f"{registry}/rbx/tiny:1"}
    # plain skopeo gzip-compressed the layer on push: a new digest, but the same content
    assert info.layers[0].media_type.endswith("tar+gzip")
    assert info.layers[0].diff_id == tiny.layers[0].diff_id
    assert info.source.type == "image"
    assert (other.layer_dirs(info.digest)[0] / "bin" / "busybox").is_file()
    with pytest.raises(NotFoundError):
        import_image(other, f"docker://{registry}/rbx/absent:1")


def test_export_import_round_trip_keeps_digest_and_lineage(
    store: BaselineStore, tiny: BaselineInfo, registry: str, tmp_path: Path
) -> None:
    upper = tmp_path / "upper"
    (upper / "root").mkdir(parents=True)
    (upper / "root" / "note").write_text("snap")
    snap = store.commit_snapshot(
        tiny.digest, upper, SnapshotSource(sandbox_id="sbx-t", backend="namespace")
    )
    archive = tmp_path / "snap.tar"
    assert export_image(store, snap.digest, f"oci-archive:{archive}") == snap.digest
    assert export_image(store, snap.digest, f"docker://{registry}/rbx/snap:1") == snap.digest

    other = BaselineStore(Home(tmp_path / "other").ensure())
    base = import_image(other, f"oci-archive:{export_tiny(store, tiny, tmp_path)}")
    assert base.digest == tiny.digest
    back = import_image(other, f"oci-archive:{archive}")
    assert back.digest == snap.digest
    assert back.parent == tiny.digest  # lineage travels in the manifest annotation
    third = BaselineStore(Home(tmp_path / "third").ensure())
    assert import_image(third, f"docker://{registry}/rbx/snap:1").digest == snap.digest
    assert (third.layer_dirs(snap.digest)[-1] / "root" / "note").read_text() == "snap"


def export_tiny(store: BaselineStore, tiny: BaselineInfo, tmp_path: Path) -> Path:
    path = tmp_path / "tiny-export.tar"
    export_image(store, tiny.digest, f"oci-archive:{path}")
    return path


def test_bad_references(store: BaselineStore, tiny: BaselineInfo, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="unknown image reference"):
        import_image(store, "ftp://x/y")
    with pytest.raises(InvalidInputError, match="does not exist"):
        import_image(store, f"oci-archive:{tmp_path / 'missing.tar'}")
    with pytest.raises(InvalidInputError, match="unknown export destination"):
        export_image(store, tiny.digest, "/tmp/plain-path")
    with pytest.raises(InvalidInputError, match="does not exist"):
        export_image(store, tiny.digest, f"oci-archive:{tmp_path / 'no' / 'dir.tar'}")


def test_from_loopback_registry_is_imported_on_demand(
    store: BaselineStore, tiny: BaselineInfo, registry: str, tmp_path: Path
) -> None:
    from rollbox.baselines.builders.buildah import build

    export_image(store, tiny.digest, f"docker://{registry}/rbx/tiny:2")
    other = BaselineStore(Home(tmp_path / "other").ensure())
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {registry}/rbx/tiny:2\nRUN echo ok > /ok\n")
    info = build(other, ctx)
    assert info.parent == tiny.digest
    assert other.resolve(f"{registry}/rbx/tiny:2").digest == tiny.digest
    assert (other.layer_dirs(info.digest)[-1] / "ok").read_text() == "ok\n"


def test_docker_archive_export_and_import(
    store: BaselineStore, tiny: BaselineInfo, tmp_path: Path
) -> None:
    archive = tmp_path / "tiny.docker.tar"
    export_image(store, tiny.digest, f"docker-archive:{archive}:rbx/tiny:1")
    other = BaselineStore(Home(tmp_path / "other").ensure())
    info = import_image(other, f"docker-archive:{archive}")
    # docker-archive keeps no manifest digest, but the layer content is the same
    assert info.layers[0].diff_id == tiny.layers[0].diff_id
    assert (other.layer_dirs(info.digest)[0] / "bin" / "busybox").is_file()
