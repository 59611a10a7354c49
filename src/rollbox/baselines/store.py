"""The baseline store: an OCI image layout plus each layer unpacked once.

Identity of a baseline is its manifest digest. Under ``$ROLLBOX_HOME``:

* ``oci/`` — OCI image layout (``oci-layout``, ``index.json`` with one entry per baseline,
  annotated ``org.opencontainers.image.ref.name=<hex>``; ``blobs/sha256/<hex>``);
* ``layers/<diffid-hex>/`` — the layer unpacked, overlay whiteouts; beside it
  ``<diffid-hex>.files.json``, the per-file manifest ``verify`` re-hashes;
* ``baselines/<hex>.json`` — :class:`~rollbox.models.BaselineInfo` per baseline;
* ``cache/`` — build caches (recipe/build-input/import hash → digest);
* ``locks/baselines.lock`` — held while the store is mutated (commit, tag, rm, gc);
* ``tmp/bl-*`` — staging; everything is built there and renamed into place, so a killed
  process leaves nothing partial, and stale staging dirs are removed on the next write.

Why ~600 lines in one module: it is one class, the only writer of the layout above; reading,
committing, naming and removal share its private index/meta helpers and its lock discipline,
and splitting them would spread that discipline over files. What is not the layout lives
elsewhere: builders in ``builders/`` (through :class:`~rollbox.baselines.writer.StoreWriter`),
layers in ``layers.py``, references in ``refs.py``, locks and staging in ``locks.py``,
garbage collection in ``gc.py``, verification in ``verify.py``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rollbox.baselines import layers as layerlib
from rollbox.baselines import oci
from rollbox.baselines.locks import flock, remove_stale_staging, staging_dir
from rollbox.baselines.refs import (
    digest_prefix,
    hex_of,
    looks_like_digest,
    normalize_name,
    sha256_bytes,
    sha256_file,
)
from rollbox.config import Home
from rollbox.errors import (
    BaselineNotFoundError,
    InUseError,
    InvalidDigestError,
    StoreError,
)
from rollbox.models import BaselineInfo, BaselineSource, SandboxInfo, SnapshotSource, utcnow

LIVE_STATES = {"creating", "running", "paused"}
REMOVED_DIR = ".removed"


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class BaselineStore:
    """OCI image layout + unpacked layers under ``home``."""

    def __init__(self, home: Home) -> None:
        self.home = home

    # ------------------------------------------------------------------ paths

    def blob_path(self, digest: str) -> Path:
        """Where blob ``digest`` is stored."""
        return self.home.oci / "blobs" / "sha256" / hex_of(digest)

    def layer_path(self, diff_id: str) -> Path:
        """The unpacked directory of the layer with uncompressed digest ``diff_id``."""
        return self.home.layers / hex_of(diff_id)

    def layer_files_path(self, diff_id: str) -> Path:
        """The per-file manifest of an unpacked layer."""
        return self.home.layers / f"{hex_of(diff_id)}.files.json"

    def meta_path(self, digest: str) -> Path:
        """The metadata file of baseline ``digest``."""
        return self.home.baselines / f"{hex_of(digest)}.json"

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the store's write lock."""
        with flock(self.home.locks / "baselines.lock"):
            yield

    @contextmanager
    def staging(self, label: str = "") -> Iterator[Path]:
        """A private staging dir in ``tmp/`` (stale ones of dead processes are removed)."""
        self.home.ensure()
        remove_stale_staging(self.home.tmp)
        with staging_dir(self.home.tmp, label) as path:
            yield path

    # ------------------------------------------------------------------ reading

    def _read_meta(self, path: Path) -> BaselineInfo | None:
        try:
            return BaselineInfo.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise StoreError(f"baseline metadata {path} is corrupt: {exc}")

    def get(self, digest: str) -> BaselineInfo | None:
        """The baseline with exactly this digest, or ``None``."""
        return self._read_meta(self.meta_path(digest))

    def all(self) -> list[BaselineInfo]:
        """All baselines, oldest first."""
        out: list[BaselineInfo] = []
        if not self.home.baselines.is_dir():
            return out
        for entry in sorted(self.home.baselines.glob("*.json")):
            info = self._read_meta(entry)
            if info is not None:
                out.append(info)
        out.sort(key=lambda b: b.created_at)
        return out

    def find_name(self, name: str) -> BaselineInfo | None:
        """The baseline carrying ``name`` (compared as Docker-normalised image names)."""
        want = normalize_name(name)
        for info in self.all():
            if any(normalize_name(n) == want for n in info.names):
                return info
        return None

    def resolve(self, ref: str) -> BaselineInfo:
        """A baseline by digest, unique digest prefix (>= 8 hex, with or without
        ``sha256:``) or name/tag.

        Raises:
            InvalidDigestError: a malformed or ambiguous digest (prefix).
            BaselineNotFoundError: nothing in the store matches.
        """
        ref = ref.strip()
        if not ref:
            raise InvalidDigestError("empty baseline reference", hint="give a digest or a name")
        if looks_like_digest(ref):
            prefix = digest_prefix(ref)
            matches = (
                sorted(p.stem for p in self.home.baselines.glob(f"{prefix}*.json"))
                if self.home.baselines.is_dir()
                else []
            )
            if len(matches) > 1:
                raise InvalidDigestError(
                    f"digest prefix {ref!r} is ambiguous ({len(matches)} baselines match)",
                    hint="give more hex digits",
                )
            if matches:
                info = self.get("sha256:" + matches[0])
                if info is not None:
                    return info
            if not ref.startswith("sha256:"):
                named = self.find_name(ref)
                if named is not None:
                    return named
            raise BaselineNotFoundError(
                f"no baseline {ref!r} in the store {self.home.root}",
                hint="see `rollbox baseline ls`, or import/build it first",
            )
        named = self.find_name(ref)
        if named is None:
            raise BaselineNotFoundError(
                f"no baseline named {ref!r} in the store {self.home.root}",
                hint="see `rollbox baseline ls`; tag one with `rollbox baseline tag REF NAME`",
            )
        return named

    def layer_dirs(self, digest: str) -> list[Path]:
        """Unpacked, overlay-ready layer directories of a baseline, bottom first.

        Raises:
            BaselineNotFoundError: no such baseline.
            StoreError: a layer directory is missing (run ``rollbox baseline verify``).
        """
        info = self.resolve(digest)
        dirs = [self.layer_path(layer.diff_id) for layer in info.layers]
        for d in dirs:
            if not d.is_dir():
                raise StoreError(
                    f"layer {d} of baseline {info.digest} is missing",
                    hint="run `rollbox baseline verify`",
                )
        return dirs

    def manifest_bytes(self, digest: str) -> bytes:
        """The stored manifest of a baseline."""
        return self.blob_path(digest).read_bytes()

    def config_doc(self, info: BaselineInfo) -> dict[str, Any]:
        """The stored OCI config document of a baseline."""
        _doc, _media, cfg, _layers = oci.parse_manifest(self.manifest_bytes(info.digest))
        data: dict[str, Any] = json.loads(self.blob_path(cfg.digest).read_bytes())
        return data

    def lineage(self, ref: str) -> list[BaselineInfo]:
        """The baseline and its ancestors (child first) as far as the store knows them."""
        chain = [self.resolve(ref)]
        seen = {chain[0].digest}
        while chain[-1].parent is not None and chain[-1].parent not in seen:
            parent = self.get(chain[-1].parent)
            if parent is None:
                break
            seen.add(parent.digest)
            chain.append(parent)
        return chain

    # ------------------------------------------------------------------ writing

    def commit_image(
        self,
        stage: Path,
        source: BaselineSource,
        *,
        names: list[str] | None = None,
        parent: str | None = None,
        trusted: bool = False,
    ) -> BaselineInfo:
        """Add the image in skopeo ``dir:`` layout at ``stage`` to the store.

        Blobs already in the store need not be in ``stage``. Layers are unpacked in
        staging first; everything is renamed into place under the store lock.
        ``trusted``: the staged blobs' digests were just computed by rollbox or skopeo
        (which checks them while copying), so they are not hashed again.

        Returns:
            The baseline (merged with an existing one of the same digest: names added).

        Raises:
            StoreError: the image is malformed or a blob does not match its digest.
        """
        raw = (stage / "manifest.json").read_bytes()
        digest = sha256_bytes(raw)
        _doc, _media, cfg_desc, layer_descs = oci.parse_manifest(raw)
        blobs: dict[str, Path] = {}
        for desc in [cfg_desc, *layer_descs]:
            staged = stage / hex_of(desc.digest)
            if staged.is_file():
                if not trusted and sha256_file(staged) != desc.digest:
                    raise StoreError(f"blob {desc.digest} does not match its digest")
                blobs[desc.digest] = staged
            elif not self.blob_path(desc.digest).is_file():
                raise StoreError(f"blob {desc.digest} is neither staged nor in the store")
        cfg_path = blobs.get(cfg_desc.digest) or self.blob_path(cfg_desc.digest)
        config, diff_ids = oci.parse_config(cfg_path.read_bytes(), len(layer_descs))
        parsed = oci.ParsedImage(_doc, _media, cfg_desc, layer_descs, config, diff_ids)
        unpacked: dict[str, Path] = {}

        def unpack_missing() -> None:
            for desc, diff_id in zip(layer_descs, diff_ids, strict=True):
                if self.layer_path(diff_id).is_dir() or diff_id in unpacked:
                    continue
                blob = blobs.get(desc.digest) or self.blob_path(desc.digest)
                target = stage / f"layer-{hex_of(diff_id)}"
                layerlib.unpack_blob(blob, target)
                layerlib.write_manifest(target, stage / f"layer-{hex_of(diff_id)}.files.json")
                unpacked[diff_id] = target

        unpack_missing()  # the slow part, outside the lock
        if parent is None:
            # snapshots record their parent in the manifest, so lineage survives export/import
            annotated = (_doc.get("annotations") or {}).get(oci.BASE_DIGEST)
            if isinstance(annotated, str) and self.get(annotated) is not None:
                parent = annotated
        info = BaselineInfo(
            digest=digest,
            names=[],
            source=source,
            parent=parent,
            layers=parsed.layer_infos(),
            config=parsed.runtime(),
            size=sum(d.size for d in layer_descs),
            created_at=utcnow(),
        )
        with self.lock():
            # a gc that ran meanwhile may have removed what we found in the store before
            for desc in [cfg_desc, *layer_descs]:
                if desc.digest not in blobs and not self.blob_path(desc.digest).is_file():
                    raise StoreError(
                        f"blob {desc.digest} was removed by a concurrent gc", hint="retry"
                    )
            unpack_missing()
            for d in (self.home.oci / "blobs" / "sha256", self.home.layers, self.home.baselines):
                d.mkdir(parents=True, exist_ok=True)
            layout = self.home.oci / "oci-layout"
            if not layout.exists():
                _atomic_write(layout, b'{"imageLayoutVersion":"1.0.0"}')
            for blob_digest, path in blobs.items():
                if not self.blob_path(blob_digest).exists():
                    os.replace(path, self.blob_path(blob_digest))
            for diff_id, path in unpacked.items():
                final = self.layer_path(diff_id)
                if final.is_dir():
                    continue
                os.replace(
                    stage / f"layer-{hex_of(diff_id)}.files.json", self.layer_files_path(diff_id)
                )
                os.rename(path, final)
            if not self.blob_path(digest).exists():
                _atomic_write(self.blob_path(digest), raw)
            existing = self.get(digest)
            if existing is not None:
                info = existing
            else:
                _atomic_write(self.meta_path(digest), info.model_dump_json(indent=2).encode())
                self._index_add(digest, len(raw), _media)
            removed = self.home.baselines / REMOVED_DIR / f"{hex_of(digest)}.json"
            removed.unlink(missing_ok=True)
            if names:
                info = self._set_names(info, add=names)
        return info

    def _index_add(self, digest: str, size: int, media_type: str) -> None:
        path = self.home.oci / "index.json"
        try:
            index = json.loads(path.read_bytes())
        except FileNotFoundError:
            index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json"}
        manifests = [m for m in index.get("manifests", []) if m.get("digest") != digest]
        manifests.append(
            {
                "mediaType": media_type,
                "digest": digest,
                "size": size,
                "annotations": {oci.REF_NAME: hex_of(digest)},
            }
        )
        index["manifests"] = manifests
        _atomic_write(path, json.dumps(index, indent=2).encode())

    def _index_remove(self, digest: str) -> None:
        path = self.home.oci / "index.json"
        try:
            index = json.loads(path.read_bytes())
        except FileNotFoundError:
            return
        index["manifests"] = [m for m in index.get("manifests", []) if m.get("digest") != digest]
        _atomic_write(path, json.dumps(index, indent=2).encode())

    def add_names(self, info: BaselineInfo, names: list[str]) -> BaselineInfo:
        """Give ``info`` the ``names`` (taking them from any other baseline), under the lock.

        Returns:
            The updated record (``info`` itself when it already carries every name).
        """
        if not names or all(n in info.names for n in names):
            return info
        with self.lock():
            return self._set_names(info, add=names)

    def _set_names(
        self,
        info: BaselineInfo,
        add: tuple[str, ...] | list[str] = (),
        remove: tuple[str, ...] | list[str] = (),
    ) -> BaselineInfo:
        """Under the lock: give ``info`` the names ``add`` (taking them from any other
        baseline) and drop ``remove``."""
        want = {normalize_name(n) for n in add}
        drop = {normalize_name(n) for n in remove}
        for other in self.all():
            if other.digest == info.digest:
                continue
            kept = [n for n in other.names if normalize_name(n) not in want]
            if kept != other.names:
                other.names = kept
                self._write_meta(other)
        current = self.get(info.digest) or info
        names = [n for n in current.names if normalize_name(n) not in drop]
        for n in add:
            if n not in names:
                names.append(n)
        current.names = names
        self._write_meta(current)
        return current

    def _write_meta(self, info: BaselineInfo) -> None:
        _atomic_write(self.meta_path(info.digest), info.model_dump_json(indent=2).encode())

    def tag(self, ref: str, name: str) -> BaselineInfo:
        """Point ``name`` at baseline ``ref`` (moving it from another baseline if needed)."""
        from rollbox.baselines.refs import check_name

        check_name(name)
        info = self.resolve(ref)
        with self.lock():
            return self._set_names(info, add=[name])

    def untag(self, name: str) -> BaselineInfo:
        """Remove ``name`` from the baseline carrying it."""
        info = self.find_name(name)
        if info is None:
            raise BaselineNotFoundError(f"no baseline named {name!r}")
        with self.lock():
            return self._set_names(info, remove=[name])

    def import_layer_tar(
        self,
        tar_path: Path,
        source: BaselineSource,
        *,
        names: list[str] | None = None,
        created_by: str = "rollbox import",
    ) -> BaselineInfo:
        """A one-layer baseline from an uncompressed rootfs tar (used as the layer as-is)."""
        with self.staging("img") as stage:
            diff_id = sha256_file(tar_path)
            size = tar_path.stat().st_size
            blob = stage / hex_of(diff_id)
            # only our own staged files are moved in; a user's file is copied, never shared
            if tar_path.is_relative_to(self.home.tmp):
                os.link(tar_path, blob)
            else:
                shutil.copyfile(tar_path, blob)
            self._write_image(stage, [(oci.OCI_LAYER_TAR, diff_id, size)], created_by)
            return self.commit_image(stage, source, names=names, trusted=True)

    def _write_image(
        self,
        stage: Path,
        new_layers: list[tuple[str, str, int]],
        created_by: str,
        *,
        base: BaselineInfo | None = None,
    ) -> None:
        """Write config + manifest for ``base``'s layers (if any) plus ``new_layers``."""
        descs: list[oci.Descriptor] = []
        diff_ids: list[str] = []
        base_cfg: dict[str, Any] | None = None
        annotations: dict[str, str] = {}
        if base is not None:
            descs = [oci.Descriptor(ly.media_type, ly.digest, ly.size) for ly in base.layers]
            diff_ids = [ly.diff_id for ly in base.layers]
            base_cfg = self.config_doc(base)
            annotations[oci.BASE_DIGEST] = base.digest
        for media, diff_id, size in new_layers:
            descs.append(oci.Descriptor(media, diff_id, size))
            diff_ids.append(diff_id)
        cfg = oci.canonical(oci.make_config(diff_ids, base=base_cfg, created_by=created_by))
        cfg_digest = sha256_bytes(cfg)
        (stage / hex_of(cfg_digest)).write_bytes(cfg)
        manifest = oci.make_manifest(
            oci.Descriptor(oci.OCI_CONFIG, cfg_digest, len(cfg)), descs, annotations
        )
        oci.write_dir_layout(stage, oci.canonical(manifest))

    def import_rootfs(self, path: Path, *, names: list[str] | None = None) -> BaselineInfo:
        """Import a rootfs directory or tarball (plain, gzip, xz or zstd) as a baseline.

        Raises:
            rollbox.errors.InvalidInputError: the path does not exist or is not a tarball.
        """
        from rollbox.baselines.builders.rootfs import import_rootfs

        return import_rootfs(self, path, names=names)

    def commit_snapshot(
        self, parent: str, upper: Path, source: SnapshotSource, name: str | None = None
    ) -> BaselineInfo:
        """A new baseline: ``parent`` plus the overlay upper dir ``upper`` as a top layer.

        Overlay whiteouts (char dev 0/0) and opaque dirs become OCI ``.wh.`` entries; the
        new layer is an uncompressed, deterministic tar; the parent digest is recorded.
        """
        base = self.resolve(parent)
        if name is not None:
            from rollbox.baselines.refs import check_name

            check_name(name)
        with self.staging("snap") as stage:
            tmp_tar = stage / "layer.tar"
            with open(tmp_tar, "wb") as f:
                diff_id, size = layerlib.pack_dir(upper, f, overlay=True)
            os.replace(tmp_tar, stage / hex_of(diff_id))
            self._write_image(
                stage,
                [(oci.OCI_LAYER_TAR, diff_id, size)],
                f"rollbox snapshot of {source.sandbox_id}",
                base=base,
            )
            return self.commit_image(
                stage, source, names=[name] if name else None, parent=base.digest, trusted=True
            )

    # ------------------------------------------------------------------ sandboxes, removal

    def live_sandboxes(self) -> list[SandboxInfo]:
        """States of the home's sandboxes that are not destroyed or crashed."""
        out: list[SandboxInfo] = []
        if not self.home.sandboxes.is_dir():
            return out
        for state in sorted(self.home.sandboxes.glob("*/state.json")):
            try:
                sbx = SandboxInfo.model_validate_json(state.read_bytes())
            except (OSError, ValueError):
                continue
            if sbx.state in LIVE_STATES:
                out.append(sbx)
        return out

    def _layers_of(self, digest: str) -> set[str] | None:
        info = self.get(digest)
        if info is None:
            removed = self.home.baselines / REMOVED_DIR / f"{hex_of(digest)}.json"
            info = self._read_meta(removed)
        return None if info is None else {ly.diff_id for ly in info.layers}

    def in_use(self, digest: str) -> list[str]:
        """Ids of live sandboxes using baseline ``digest``: directly, or through a child
        baseline whose layers include all of this one's."""
        info = self.resolve(digest)
        mine = {ly.diff_id for ly in info.layers}
        users: list[str] = []
        for sbx in self.live_sandboxes():
            if sbx.baseline == info.digest:
                users.append(sbx.id)
                continue
            theirs = self._layers_of(sbx.baseline)
            if theirs is not None and mine and mine <= theirs:
                users.append(sbx.id)
        return users

    def remove(self, ref: str, *, force: bool = False) -> BaselineInfo:
        """Remove a baseline's metadata and names (blobs/layers go at the next ``gc``).

        Raises:
            InUseError: a live sandbox uses it and ``force`` is not set.
        """
        info = self.resolve(ref)
        with self.lock():
            users = self.in_use(info.digest)
            if users and not force:
                raise InUseError(
                    f"baseline {info.digest[:19]} is in use by {', '.join(users)}",
                    hint="destroy those sandboxes first, or pass --force",
                )
            if users:
                # keep its layer list so gc still protects the layers the sandboxes mount
                removed = self.home.baselines / REMOVED_DIR
                removed.mkdir(exist_ok=True)
                _atomic_write(
                    removed / f"{hex_of(info.digest)}.json", info.model_dump_json().encode()
                )
            self.meta_path(info.digest).unlink(missing_ok=True)
            self._index_remove(info.digest)
            for entry in self.home.cache.glob("*.json") if self.home.cache.is_dir() else []:
                try:
                    if json.loads(entry.read_text()).get("digest") == info.digest:
                        entry.unlink(missing_ok=True)
                except (OSError, ValueError):
                    continue
        return info

    # ------------------------------------------------------------------ caches

    def cache_get(self, kind: str, key: str) -> BaselineInfo | None:
        """The baseline cached under ``kind``/``key`` if it is still in the store."""
        path = self.home.cache / f"{kind}-{key}.json"
        try:
            digest = json.loads(path.read_text())["digest"]
        except (OSError, ValueError, KeyError):
            return None
        info = self.get(digest)
        if info is None:
            return None
        if not all(self.layer_path(ly.diff_id).is_dir() for ly in info.layers):
            return None
        return info

    def cache_put(self, kind: str, key: str, digest: str) -> None:
        """Remember that ``kind``/``key`` produced ``digest``."""
        self.home.cache.mkdir(parents=True, exist_ok=True)
        _atomic_write(
            self.home.cache / f"{kind}-{key}.json",
            json.dumps({"digest": digest, "at": utcnow().isoformat()}).encode(),
        )

    # ------------------------------------------------------------------ builders

    def build(
        self,
        context: Path,
        *,
        dockerfile: Path | None = None,
        build_args: dict[str, str] | None = None,
        names: list[str] | None = None,
    ) -> BaselineInfo:
        """Build a Dockerfile with buildah (:func:`rollbox.baselines.builders.buildah.build`)."""
        from rollbox.baselines.builders.buildah import build

        return build(self, context, dockerfile=dockerfile, build_args=build_args, names=names)

    # ------------------------------------------------------------------ default

    def default(self) -> BaselineInfo:
        """The default Debian baseline, bootstrapped on first use (locked, cached)."""
        from rollbox.baselines.builders.bootstrap import DEFAULT_NAMES, DEFAULT_RECIPE, bootstrap

        return bootstrap(self, DEFAULT_RECIPE, names=DEFAULT_NAMES)
