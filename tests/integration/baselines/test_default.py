"""The default baseline and bootstrap recipes (mmdebstrap), in the session-wide home so
the ~25 s bootstrap is paid once per machine."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from rollbox.baselines.builders.bootstrap import bootstrap
from rollbox.baselines.recipe import Recipe
from rollbox.baselines.store import BaselineStore
from rollbox.config import Home
from rollbox.errors import BuildError
from rollbox.models import DIGEST_RE

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_default_baseline_is_bootstrapped_once_and_cached(shared_home: Home) -> None:
    store = BaselineStore(shared_home)
    info = store.default()
    assert DIGEST_RE.match(info.digest)
    assert {"rollbox/default", "debian:bookworm"} <= set(info.names)
    assert info.source.type == "recipe"
    (layer,) = store.layer_dirs(info.digest)
    for tool in ("usr/bin/python3", "usr/bin/bash", "usr/bin/git", "usr/bin/ps", "usr/bin/ls"):
        assert (layer / tool).exists(), tool
    assert (layer / "etc" / "ssl" / "certs").is_dir()
    assert "bookworm" in (layer / "etc" / "os-release").read_text()
    t0 = time.monotonic()
    assert store.default().digest == info.digest
    assert time.monotonic() - t0 < 1.0
    assert store.resolve("debian:bookworm").digest == info.digest
    assert store.resolve("docker.io/library/debian:bookworm").digest == info.digest
    out = subprocess.run(
        [sys.executable, "-m", "rollbox.cli.main", "baseline", "default", "--json"],
        capture_output=True,
        text=True,
        env={"ROLLBOX_HOME": str(shared_home.root), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        check=True,
    )
    assert json.loads(out.stdout)["digest"] == info.digest


def test_recipe_files_and_commands(shared_home: Home) -> None:
    store = BaselineStore(shared_home)
    recipe = Recipe(
        variant="essential",
        files={"/etc/rbx/motd": "hello from a recipe\n"},
        commands=["cat /etc/rbx/motd > /etc/rbx/copied", "echo $((6*7)) > /etc/rbx/answer"],
    )
    info = bootstrap(store, recipe, names=["rbxtest/essential:1"])
    assert info.source.type == "recipe" and info.source.recipe_hash == recipe.hash()
    (layer,) = store.layer_dirs(info.digest)
    assert (layer / "etc" / "rbx" / "copied").read_text() == "hello from a recipe\n"
    assert (layer / "etc" / "rbx" / "answer").read_text() == "42\n"
    assert bootstrap(store, recipe).digest == info.digest


def test_failed_bootstrap_is_build_error(home: Home) -> None:
    store = BaselineStore(home)
    with pytest.raises(BuildError) as exc:
        # an unknown suite fails at apt-get update, in seconds
        bootstrap(store, Recipe(variant="essential", suite="rbx-no-such-suite"))
    assert exc.value.exit_code == 1
    assert "rbx-no-such-suite" in exc.value.output
    assert store.all() == []
    assert list(home.tmp.iterdir()) == []
