"""``rollbox baseline bootstrap`` flags and files become the right recipe."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rollbox.baselines.builders import bootstrap as bootstrap_mod
from rollbox.baselines.recipe import Recipe
from rollbox.cli.baseline import app
from rollbox.config import Home
from rollbox.models import BaselineInfo, RecipeSource, utcnow


def test_bootstrap_flags_merge_into_recipe(
    home: Home, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def fake_bootstrap(store: object, recipe: Recipe, *, names: list[str] | None = None) -> Any:
        seen["recipe"], seen["names"] = recipe, names
        return BaselineInfo(
            digest="sha256:" + "1" * 64,
            source=RecipeSource(recipe_hash=recipe.hash(), recipe=recipe.canonical()),
            layers=[],
            size=0,
            created_at=utcnow(),
        )

    monkeypatch.setattr(bootstrap_mod, "bootstrap", fake_bootstrap)
    (tmp_path / "motd").write_text("hi\n")
    (tmp_path / "r.toml").write_text('packages = ["git"]\ncommands = ["echo a"]\n')
    result = CliRunner().invoke(
        app,
        [
            "bootstrap", str(tmp_path / "r.toml"), "-p", "python3", "-c", "echo b",
            "--file", f"/etc/motd={tmp_path / 'motd'}", "--suite", "trixie", "-t", "mine:1",
            "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["digest"] == "sha256:" + "1" * 64
    recipe = seen["recipe"]
    assert recipe.packages == ["git", "python3"]
    assert recipe.commands == ["echo a", "echo b"]
    assert recipe.files == {"/etc/motd": "hi\n"}
    assert recipe.suite == "trixie"
    assert seen["names"] == ["mine:1"]
