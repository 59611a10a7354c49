"""``build``: buildah bud against store baselines, the build cache, bad input."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from rollbox.baselines.builders.buildah import BUILD_REPO, build
from rollbox.baselines.store import BaselineStore
from rollbox.errors import BuildError, RecipeError, UnknownBaseImageError
from rollbox.models import BaselineInfo

from .conftest import TINY_NAME

pytestmark = [pytest.mark.root, pytest.mark.slow]

DOCKERFILE = f"""\
ARG BASE={TINY_NAME}
FROM $BASE
ARG FLAVOR=plain
ENV APP_HOME=/opt/app GREETING_FLAVOR=$FLAVOR
WORKDIR /opt/app
COPY greeting.txt ./greeting.txt
RUN echo "$FLAVOR" > flavor.txt && chown 1234 /opt/app && id -u > /opt/app/builder-uid
USER 1234
RUN touch /opt/app/made-by-user
"""


def _context(tmp_path: Path, dockerfile: str = DOCKERFILE) -> Path:
    ctx = tmp_path / "ctx"
    ctx.mkdir(exist_ok=True)
    (ctx / "Dockerfile").write_text(dockerfile)
    (ctx / "greeting.txt").write_text("hello from context\n")
    return ctx


def _leftover_build_images(store: BaselineStore) -> list[str]:
    """This home's build images still in containers-storage (others build concurrently)."""
    out = subprocess.run(
        ["buildah", "images", "--format", "{{.Name}}:{{.Tag}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if line.startswith(f"{BUILD_REPO}:{store.home.tag}-")]


def test_build_env_arg_workdir_copy_run_user(
    store: BaselineStore, tiny: BaselineInfo, tmp_path: Path
) -> None:
    ctx = _context(tmp_path)
    info = build(store, ctx, build_args={"FLAVOR": "spicy"}, names=["built:1"])
    assert info.parent == tiny.digest
    assert info.source.type == "dockerfile"
    assert "APP_HOME=/opt/app" in info.config.env
    assert "GREETING_FLAVOR=spicy" in info.config.env
    assert info.config.workdir == "/opt/app"
    assert info.config.user == "1234"
    # base layers are shared with the base baseline, byte for byte
    assert info.layers[0].digest == tiny.layers[0].digest
    top = store.layer_dirs(info.digest)[-1]
    app = top / "opt" / "app"
    assert (app / "greeting.txt").read_text() == "hello from context\n"
    assert (app / "flavor.txt").read_text() == "spicy\n"
    assert (app / "builder-uid").read_text() == "0\n"
    assert (app / "made-by-user").stat().st_uid == 1234
    assert store.resolve("built:1").digest == info.digest

    # second build of the same input: same digest, from the cache, well under 1 s
    t0 = time.monotonic()
    again = build(store, ctx, build_args={"FLAVOR": "spicy"})
    assert time.monotonic() - t0 < 1.0
    assert again.digest == info.digest
    # a changed build arg or context file is a different input
    (ctx / "greeting.txt").write_text("changed\n")
    changed = build(store, ctx, build_args={"FLAVOR": "spicy"})
    assert changed.digest != info.digest
    assert _leftover_build_images(store) == []
    assert list(store.home.tmp.iterdir()) == []


def test_unknown_from_names_the_image(store: BaselineStore, tmp_path: Path) -> None:
    ctx = _context(tmp_path, "FROM ubuntu:24.04\nRUN true\n")
    with pytest.raises(UnknownBaseImageError, match=r"FROM ubuntu:24\.04") as exc:
        build(store, ctx)
    assert exc.value.exit_code == 2
    assert "rollbox baseline import" in exc.value.one_line()
    assert store.all() == []


def test_missing_context_file(store: BaselineStore, tiny: BaselineInfo, tmp_path: Path) -> None:
    ctx = _context(tmp_path, f"FROM {TINY_NAME}\nCOPY missing.txt /x\n")
    with pytest.raises(RecipeError, match=r"'missing\.txt' not found in the build context"):
        build(store, ctx)
    with pytest.raises(RecipeError, match="is not a directory"):
        build(store, tmp_path / "nope")


def test_failing_step_is_build_error_with_output(
    store: BaselineStore, tiny: BaselineInfo, tmp_path: Path
) -> None:
    ctx = _context(tmp_path, f"FROM {TINY_NAME}\nRUN echo step-output-marker && exit 3\n")
    with pytest.raises(BuildError) as exc:
        build(store, ctx)
    assert exc.value.exit_code == 1
    assert "step-output-marker" in exc.value.output
    assert [b.digest for b in store.all()] == [tiny.digest]
    assert _leftover_build_images(store) == []


def test_from_unreachable_registry_is_unknown_base(store: BaselineStore, tmp_path: Path) -> None:
    from .conftest import free_port

    image = f"127.0.0.1:{free_port()}/rbx/absent:1"  # nothing listens there
    ctx = _context(tmp_path, f"FROM {image}\nRUN true\n")
    with pytest.raises(UnknownBaseImageError, match="cannot be pulled") as exc:
        build(store, ctx)
    assert image in exc.value.one_line()
    assert store.all() == []
