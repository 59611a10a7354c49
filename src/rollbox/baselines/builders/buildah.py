"""``build DIR [-f Dockerfile]``: buildah ``bud --isolation chroot`` against store baselines.

``FROM`` names resolve to store baselines (``debian:bookworm`` is the default baseline).
A base is exported on demand into buildah's containers-storage (machine-wide, so under
rollbox-prefixed names: ``localhost/rollbox-base:<hex>``); the ``FROM`` lines of a copy of
the Dockerfile are rewritten to those names and the build runs with ``--pull=never``.
The result is copied back (``dir:``, layers uncompressed so base layers keep their blob
digests), its build image removed from containers-storage, and the digest cached under
the hash of Dockerfile + build args + base digests + context files.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path

from rollbox.baselines import dockerfile as df
from rollbox.baselines.builders.proc import run
from rollbox.baselines.builders.skopeo import import_image
from rollbox.baselines.locks import flock, lock_is_held
from rollbox.baselines.recipe import DEFAULT_SOURCE_DATE_EPOCH
from rollbox.baselines.refs import hex_of
from rollbox.baselines.writer import StoreWriter
from rollbox.errors import (
    BaselineNotFoundError,
    BuildError,
    NotFoundError,
    RecipeError,
    StoreError,
    UnknownBaseImageError,
)
from rollbox.models import BaselineInfo, DockerfileSource

BASE_REPO = "localhost/rollbox-base"
BUILD_REPO = "localhost/rollbox-build"


def _find_dockerfile(context: Path, dockerfile: Path | None) -> Path:
    if dockerfile is not None:
        path = dockerfile if dockerfile.is_absolute() else Path.cwd() / dockerfile
        if not path.is_file():
            raise RecipeError(f"Dockerfile {dockerfile} does not exist")
        return path
    for name in ("Dockerfile", "Containerfile"):
        if (context / name).is_file():
            return context / name
    raise RecipeError(f"no Dockerfile or Containerfile in {context}", hint="pass -f FILE")


def resolve_base(store: StoreWriter, image: str) -> BaselineInfo:
    """The store baseline a ``FROM`` image names; an image on an explicit registry
    (``host:port/…``, ``registry.example/…``) is imported on first use.

    Raises:
        UnknownBaseImageError: neither in the store nor pullable.
    """
    name, _, digest = image.partition("@")
    if digest:
        try:
            return store.resolve(digest)
        except BaselineNotFoundError:
            pass
    found = store.find_name(name) if not digest else None
    if found is not None:
        return found
    ref = "docker://" + image
    first = name.split("/", 1)[0] if "/" in name else ""
    if first and ("." in first or ":" in first or first == "localhost"):
        # an explicit registry: pull it (Docker Hub short names are never tried, so
        # a build without network access fails at once, with the hint below)
        try:
            return import_image(store, ref, command_timeout=120)
        except (NotFoundError, StoreError) as exc:
            raise UnknownBaseImageError(
                f"FROM {image}: not in the store and cannot be pulled: {exc.message}",
                hint="check the registry, or import the image and tag it with that name",
            )
    raise UnknownBaseImageError(
        f"FROM {image}: no baseline named {image!r} in the store",
        hint=(
            f"provide it with `rollbox baseline import docker://REGISTRY/IMAGE --name {name}` "
            f"(or `rollbox baseline tag DIGEST {name}`)"
        ),
    )


def _ensure_in_containers_storage(store: StoreWriter, info: BaselineInfo) -> str:
    target = f"{BASE_REPO}:{hex_of(info.digest)}"
    if run(["buildah", "inspect", "--type", "image", target]).returncode == 0:
        return target
    with flock(store.home.locks / f"cstorage-{hex_of(info.digest)[:32]}.lock"):
        if run(["buildah", "inspect", "--type", "image", target]).returncode == 0:
            return target
        src = f"oci:{store.home.oci}:{hex_of(info.digest)}"
        with store.lock():
            proc = run(["skopeo", "copy", "--quiet", src, f"containers-storage:{target}"])
        if proc.returncode != 0:
            raise BuildError(f"cannot hand base {info.digest} to buildah", output=proc.stdout)
    return target


def input_hash(
    dockerfile_text: bytes, build_args: dict[str, str], bases: list[str], context: Path
) -> str:
    """Hex sha256 of everything a build depends on (the build cache key)."""
    doc = {
        "dockerfile": hashlib.sha256(dockerfile_text).hexdigest(),
        "args": dict(sorted(build_args.items())),
        "bases": bases,
        "context": df.context_hash(context),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def build(
    store: StoreWriter,
    context: Path,
    *,
    dockerfile: Path | None = None,
    build_args: dict[str, str] | None = None,
    names: list[str] | None = None,
) -> BaselineInfo:
    """Build a Dockerfile into a baseline (cached by input hash).

    Raises:
        RecipeError: missing context/Dockerfile/COPY source, malformed FROM.
        UnknownBaseImageError: a FROM image the store cannot provide.
        BuildError: a build step failed (``output`` holds buildah's output).
    """
    build_args = dict(build_args or {})
    names = names or []
    if not context.is_dir():
        raise RecipeError(f"build context {context} is not a directory")
    context = context.absolute()
    dfile = _find_dockerfile(context, dockerfile)
    text = dfile.read_bytes()
    instructions = df.parse(text.decode("utf-8", "replace"))
    froms = df.from_lines(instructions, build_args)
    df.check_sources(instructions, context)
    stages = {f.stage.lower() for f in froms if f.stage}
    bases: dict[str, BaselineInfo] = {}
    for f in froms:
        if f.image.lower() in stages or f.image == "scratch" or f.image in bases:
            continue
        bases[f.image] = resolve_base(store, f.image)
    key = input_hash(text, build_args, [b.digest for b in bases.values()], context)
    hit = store.cache_get("build", key)
    if hit is not None:
        return store.add_names(hit, names)
    store.home.ensure()
    with flock(store.home.locks / f"build-{key[:32]}.lock"):
        hit = store.cache_get("build", key)
        if hit is not None:
            return store.add_names(hit, names)
        info = _build_uncached(store, context, dfile, instructions, froms, bases, build_args, key)
        store.cache_put("build", key, info.digest)
        return store.add_names(info, names)


def remove_stale_build_images(store: StoreWriter) -> list[str]:
    """Remove this home's ``rollbox-build`` images whose build is no longer running (left
    by a build killed after buildah tagged its result); return their names."""
    out = run(["buildah", "images", "--format", "{{.Name}}:{{.Tag}}"]).stdout
    prefix = f"{BUILD_REPO}:{store.home.tag}-"
    removed: list[str] = []
    for image in out.split():
        if not image.startswith(prefix):
            continue
        key16 = image[len(prefix) :].split("-", 1)[0]
        for lock in store.home.locks.glob(f"build-{key16}*.lock"):
            if lock_is_held(lock):
                break
        else:
            run(["buildah", "rmi", "--force", image])
            removed.append(image)
    return removed


def _build_uncached(
    store: StoreWriter,
    context: Path,
    dfile: Path,
    instructions: list[df.Instruction],
    froms: list[df.FromLine],
    bases: dict[str, BaselineInfo],
    build_args: dict[str, str],
    key: str,
) -> BaselineInfo:
    remove_stale_build_images(store)
    local = {img: _ensure_in_containers_storage(store, b) for img, b in bases.items()}
    # a copy of the Dockerfile whose FROM lines name the containers-storage images
    lines: list[str] = []
    by_index = {f.index: f for f in froms}
    for i, ins in enumerate(instructions):
        f = by_index.get(i)
        if f is None:
            lines.append(f"{ins.keyword} {ins.args}")
            continue
        image = local.get(f.image, f.image)
        as_name = f" AS {f.stage}" if f.stage else ""
        lines.append(f"FROM {' '.join(f.flags)} {image}{as_name}".replace("  ", " "))
    tag = f"{BUILD_REPO}:{store.home.tag}-{key[:16]}-{secrets.token_hex(4)}"
    with store.staging("build") as stage:
        (stage / "Dockerfile").write_text("\n".join(lines) + "\n")
        cmd = [
            "buildah",
            "bud",
            "--isolation",
            "chroot",
            "--pull=never",
            "--force-rm",
            "--layers=false",
            "--format",
            "oci",
            # same Dockerfile + context + bases -> same digest on any machine: fixed created
            # time and file times in the new layers, no buildah-version label
            f"--timestamp={DEFAULT_SOURCE_DATE_EPOCH}",
            "--identity-label=false",
            "-f",
            str(stage / "Dockerfile"),
            "--iidfile",
            str(stage / "iid"),
            "-t",
            tag,
        ]
        for k, v in sorted(build_args.items()):
            cmd += ["--build-arg", f"{k}={v}"]
        proc = run([*cmd, str(context)], timeout=3600)
        try:
            if proc.returncode != 0:
                step = _failed_step(proc.stdout)
                raise BuildError(
                    f"build of {dfile} failed{': ' + step if step else ''}", output=proc.stdout
                )
            img = _copy_out(store, tag, stage, list(bases.values()))
            final = froms[-1]
            parent = bases.get(final.image)
            source = DockerfileSource(input_hash=key, dockerfile=str(dfile), context=str(context))
            return store.commit_image(
                img, source, parent=parent.digest if parent is not None else None, trusted=True
            )
        finally:
            run(["buildah", "rmi", "--force", tag])


def _copy_out(store: StoreWriter, tag: str, stage: Path, bases: list[BaselineInfo]) -> Path:
    """Copy the built image out of containers-storage into a ``dir:`` layout in ``stage``.

    Goes through an OCI layout pre-seeded with hard links to the bases' layer blobs:
    skopeo then reuses them instead of re-reading the base layers out of
    containers-storage, so only the new layers are copied.
    """
    layout = stage / "oci"
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    for base in bases:
        for layer in base.layers:
            src, dst = store.blob_path(layer.digest), blobs / hex_of(layer.digest)
            if src.is_file() and not dst.exists():
                os.link(src, dst)
    copy = run(["skopeo", "copy", "--quiet", f"containers-storage:{tag}", f"oci:{layout}:img"])
    if copy.returncode != 0:
        raise BuildError("cannot copy the built image out of buildah", output=copy.stdout)
    (manifest_desc,) = json.loads((layout / "index.json").read_bytes())["manifests"]
    img = stage / "img"
    img.mkdir()
    os.link(blobs / hex_of(manifest_desc["digest"]), img / "manifest.json")
    for blob in blobs.iterdir():
        if not store.blob_path("sha256:" + blob.name).exists():
            os.link(blob, img / blob.name)
    return img


def _failed_step(output: str) -> str:
    for line in reversed(output.splitlines()):
        if line.startswith(("error building", "Error:", "error ")):
            return line.strip()[:300]
    return ""
