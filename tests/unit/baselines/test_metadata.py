"""Resolution, lineage and in-use accounting over metadata files alone (no root)."""

from __future__ import annotations

import pytest

from rollbox.baselines.store import BaselineStore
from rollbox.config import Home
from rollbox.errors import BaselineNotFoundError, InvalidDigestError
from rollbox.models import (
    BaselineInfo,
    ImportSource,
    LayerInfo,
    SandboxInfo,
    SandboxSpec,
    SnapshotSource,
    utcnow,
)


def _layer(n: int) -> LayerInfo:
    d = f"sha256:{n:064x}"
    return LayerInfo(
        digest=d, diff_id=d, size=10, media_type="application/vnd.oci.image.layer.v1.tar"
    )


def _put(store: BaselineStore, hexd: str, layers: list[int], parent: str | None = None,
         names: list[str] | None = None) -> BaselineInfo:  # fmt: skip
    source = (
        SnapshotSource(sandbox_id="sbx-x", backend="namespace")
        if parent
        else ImportSource(path="/x", content_hash="sha256:" + "0" * 64)
    )
    info = BaselineInfo(
        digest="sha256:" + hexd,
        names=names or [],
        source=source,
        parent=parent,
        layers=[_layer(n) for n in layers],
        size=10 * len(layers),
        created_at=utcnow(),
    )
    store.home.baselines.mkdir(parents=True, exist_ok=True)
    store.meta_path(info.digest).write_text(info.model_dump_json())
    return info


@pytest.fixture
def chain(home: Home) -> tuple[BaselineStore, list[BaselineInfo]]:
    store = BaselineStore(home)
    a = _put(store, "aa" * 32, [1], names=["base:1"])
    b = _put(store, "aaaaaaaa" + "bb" * 28, [1, 2], parent=a.digest)
    c = _put(store, "cc" * 32, [1, 2, 3], parent=b.digest, names=["top:1"])
    return store, [a, b, c]


def test_resolve_by_digest_prefix_and_name(chain: tuple[BaselineStore, list[BaselineInfo]]) -> None:
    store, (a, _b, c) = chain
    assert store.resolve("cccccccc").digest == c.digest
    assert store.resolve("sha256:" + "cc" * 32).digest == c.digest
    assert store.resolve("top:1").digest == c.digest
    assert store.resolve("docker.io/library/base:1").digest == a.digest
    with pytest.raises(InvalidDigestError, match="ambiguous"):
        store.resolve("sha256:aaaaaaaa")
    assert store.resolve("aaaaaaaab").digest == _b.digest
    with pytest.raises(InvalidDigestError, match="too short"):
        store.resolve("sha256:aaaa")
    with pytest.raises(BaselineNotFoundError):
        store.resolve("dddddddd")


def test_lineage_walks_parents(chain: tuple[BaselineStore, list[BaselineInfo]]) -> None:
    store, (a, b, c) = chain
    assert [x.digest for x in store.lineage("top:1")] == [c.digest, b.digest, a.digest]
    assert [x.digest for x in store.lineage(a.digest)] == [a.digest]
    # a parent unknown to this store ends the chain instead of failing
    store.meta_path(a.digest).unlink()
    assert [x.digest for x in store.lineage("top:1")] == [c.digest, b.digest]


def test_in_use_counts_children(
    chain: tuple[BaselineStore, list[BaselineInfo]], home: Home
) -> None:
    store, (a, b, c) = chain
    assert store.in_use(a.digest) == []
    sbx = SandboxInfo(
        id="sbx-01bbbbbbbbbbbbbbbbbbbbbbbb",
        backend="namespace",
        baseline=b.digest,
        spec=SandboxSpec(baseline=b.digest),
        state="running",
        created_at=utcnow(),
    )
    (home.sandboxes / sbx.id).mkdir(parents=True)
    (home.sandboxes / sbx.id / "state.json").write_text(sbx.model_dump_json())
    assert store.in_use(b.digest) == [sbx.id]
    assert store.in_use(a.digest) == [sbx.id]  # a's layers are all in b
    assert store.in_use(c.digest) == []  # c has a layer b lacks
    sbx.state = "destroyed"
    (home.sandboxes / sbx.id / "state.json").write_text(sbx.model_dump_json())
    assert store.in_use(a.digest) == []
