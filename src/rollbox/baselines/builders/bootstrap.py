"""``bootstrap``: a Debian rootfs from a recipe with mmdebstrap, cached by recipe hash."""

from __future__ import annotations

import shlex

from rollbox.baselines.builders.proc import run
from rollbox.baselines.locks import flock
from rollbox.baselines.recipe import Recipe
from rollbox.baselines.writer import StoreWriter
from rollbox.errors import BuildError
from rollbox.models import BaselineInfo, RecipeSource

DEFAULT_RECIPE = Recipe(
    suite="bookworm",
    variant="minbase",
    packages=["python3", "bash", "coreutils", "git", "ca-certificates", "procps"],
)
"""The default baseline: Debian bookworm minbase with python3, bash, coreutils, git,
ca-certificates and procps."""

DEFAULT_NAMES = ["rollbox/default", "debian:bookworm", "docker.io/library/debian:bookworm"]
"""Names the default baseline carries (Dockerfiles' ``FROM debian:bookworm`` resolves to it)."""


MACHINE_NEUTRAL_HOOKS = (
    'echo rollbox > "$1"/etc/hostname',
    ': > "$1"/etc/resolv.conf',
    # the copies keep the host files' modes (0755 on some hosts)
    'chmod 0644 "$1"/etc/hostname "$1"/etc/resolv.conf',
)
"""Hooks that replace the files mmdebstrap copies from the host with fixed content and mode."""


def mmdebstrap_env(recipe: Recipe) -> dict[str, str]:
    """Environment of the mmdebstrap run: ``SOURCE_DATE_EPOCH`` makes it clamp every file
    time, sort the tar, drop logs and caches, and (in the chroot) write hash-checked .pyc."""
    return {"SOURCE_DATE_EPOCH": str(recipe.source_date_epoch)}


def mmdebstrap_command(recipe: Recipe, out: str, files_dir: str) -> list[str]:
    """The mmdebstrap command line that builds ``recipe`` into the tarball ``out``."""
    cmd = ["mmdebstrap", f"--variant={recipe.variant}", "--format=tar"]
    if recipe.packages:
        cmd.append("--include=" + ",".join(recipe.packages))
    for i, path in enumerate(recipe.files):
        parent = path.rsplit("/", 1)[0] or "/"
        cmd.append(f'--customize-hook=mkdir -p "$1"{shlex.quote(parent)}')
        cmd.append(f"--customize-hook=upload {files_dir}/{i} {shlex.quote(path)}")
    for command in recipe.commands:
        cmd.append(f'--customize-hook=chroot "$1" /bin/sh -ec {shlex.quote(command)}')
    # mmdebstrap copies the host's hostname and resolv.conf in: give every machine the same
    # (after the recipe's commands, which may still need the host's DNS)
    cmd += [f"--customize-hook={hook}" for hook in MACHINE_NEUTRAL_HOOKS]
    cmd += [recipe.suite, out]
    if recipe.mirror:
        cmd.append(recipe.mirror)
    return cmd


def bootstrap(
    store: StoreWriter, recipe: Recipe, *, names: list[str] | None = None
) -> BaselineInfo:
    """The baseline for ``recipe``: from the cache, or built with mmdebstrap.

    Two processes bootstrapping the same recipe at once build it once (flock on the
    recipe hash); the tarball is staged in ``tmp/`` and only a finished image is committed.

    Raises:
        BuildError: mmdebstrap failed (its output attached).
    """
    key = recipe.hash()
    names = names or []
    hit = store.cache_get("recipe", key)
    if hit is not None:
        return store.add_names(hit, names)
    store.home.ensure()
    with flock(store.home.locks / f"recipe-{key[:32]}.lock"):
        hit = store.cache_get("recipe", key)
        if hit is not None:
            return store.add_names(hit, names)
        with store.staging("boot") as stage:
            files_dir = stage / "files"
            files_dir.mkdir()
            for i, content in enumerate(recipe.files.values()):
                (files_dir / str(i)).write_text(content)
            out = stage / "rootfs.tar"
            proc = run(
                mmdebstrap_command(recipe, str(out), str(files_dir)), env=mmdebstrap_env(recipe)
            )
            if proc.returncode != 0 or not out.is_file():
                raise BuildError(
                    f"mmdebstrap failed for recipe {key[:12]} (exit {proc.returncode})",
                    output=proc.stdout,
                )
            source = RecipeSource(recipe_hash=key, recipe=recipe.canonical())
            info = store.import_layer_tar(
                out, source, names=names, created_by=f"rollbox bootstrap recipe {key[:12]}"
            )
        store.cache_put("recipe", key, info.digest)
        return info
