"""Digest/prefix parsing, name normalisation and bootstrap recipe parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbox.baselines.builders.bootstrap import DEFAULT_RECIPE, mmdebstrap_command
from rollbox.baselines.recipe import Recipe, load_recipe, recipe_from_data
from rollbox.baselines.refs import (
    check_name,
    digest_prefix,
    hex_of,
    looks_like_digest,
    normalize_name,
    sha256_bytes,
)
from rollbox.errors import InvalidDigestError, InvalidInputError, RecipeError

HEX = "ab" * 32


def test_hex_of_full_digest() -> None:
    assert hex_of(f"sha256:{HEX}") == HEX
    assert sha256_bytes(b"") == (
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )


@pytest.mark.parametrize("bad", [HEX, f"sha512:{HEX}", "sha256:" + "AB" * 32, "sha256:abc"])
def test_hex_of_rejects_malformed(bad: str) -> None:
    with pytest.raises(InvalidDigestError, match="malformed digest"):
        hex_of(bad)


@pytest.mark.parametrize(
    ("ref", "prefix"),
    [("sha256:abababab", "abababab"), ("abababab", "abababab"), (f"sha256:{HEX}", HEX)],
)
def test_digest_prefix_ok(ref: str, prefix: str) -> None:
    assert looks_like_digest(ref)
    assert digest_prefix(ref) == prefix


@pytest.mark.parametrize(
    ("ref", "msg"),
    [("sha256:abc", "too short"), ("sha256:xyz12345", "malformed"), ("sha256:", "malformed"),
     ("sha256:" + "a" * 65, "malformed")],
)  # fmt: skip
def test_digest_prefix_errors(ref: str, msg: str) -> None:
    with pytest.raises(InvalidDigestError, match=msg):
        digest_prefix(ref)


def test_names_are_not_digests() -> None:
    assert not looks_like_digest("debian:bookworm")
    assert not looks_like_digest("abc")  # too short to be a prefix: a name


@pytest.mark.parametrize(
    ("name", "norm"),
    [
        ("debian:bookworm", "docker.io/library/debian:bookworm"),
        ("docker.io/library/debian:bookworm", "docker.io/library/debian:bookworm"),
        ("library/debian:bookworm", "docker.io/library/debian:bookworm"),
        ("ubuntu", "docker.io/library/ubuntu:latest"),
        ("127.0.0.1:5000/x/y", "127.0.0.1:5000/x/y:latest"),
        ("localhost/rollbox-base:1", "localhost/rollbox-base:1"),
        ("rollbox/default", "docker.io/rollbox/default:latest"),
    ],
)
def test_normalize_name(name: str, norm: str) -> None:
    assert normalize_name(name) == norm


@pytest.mark.parametrize("bad", ["", "has space", "deadbeefcafe", "-x"])
def test_check_name_rejects(bad: str) -> None:
    with pytest.raises(InvalidInputError):
        check_name(bad)


def test_recipe_unknown_field_is_named() -> None:
    with pytest.raises(RecipeError, match="unknown field 'pakages'") as exc:
        recipe_from_data({"pakages": ["git"]})
    assert exc.value.exit_code == 2
    assert "allowed: suite, variant, packages" in exc.value.one_line()


@pytest.mark.parametrize(
    ("data", "msg"),
    [
        ({"packages": ["Not A Package"]}, "not a Debian package name"),
        ({"suite": "Bookworm!"}, "not a Debian suite name"),
        ({"variant": "tiny"}, "variant"),
        ({"files": {"etc/motd": "x"}}, "must be absolute"),
        ({"commands": "echo hi"}, "commands"),
    ],
)
def test_recipe_bad_values(data: dict[str, object], msg: str) -> None:
    with pytest.raises(RecipeError, match=msg):
        recipe_from_data(data)


def test_recipe_hash_ignores_package_order_and_duplicates() -> None:
    a = Recipe(packages=["git", "python3"])
    b = Recipe(packages=["python3", "git", "git"])
    assert a.hash() == b.hash()
    assert a.hash() != Recipe(packages=["python3"]).hash()
    assert a.hash() != Recipe(packages=["git", "python3"], commands=["true"]).hash()


def test_load_recipe_json_and_toml(tmp_path: Path) -> None:
    (tmp_path / "r.toml").write_text(
        'suite = "bookworm"\npackages = ["git"]\ncommands = ["echo hi > /hi"]\n'
        '[files]\n"/etc/motd" = "hello"\n'
    )
    (tmp_path / "r.json").write_text(
        '{"packages": ["git"], "commands": ["echo hi > /hi"], "files": {"/etc/motd": "hello"}}'
    )
    assert load_recipe(tmp_path / "r.toml").hash() == load_recipe(tmp_path / "r.json").hash()
    (tmp_path / "bad.toml").write_text("packages = [")
    with pytest.raises(RecipeError, match="not valid TOML"):
        load_recipe(tmp_path / "bad.toml")
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(tmp_path / "missing.json")


def test_mmdebstrap_command_carries_recipe() -> None:
    r = Recipe(packages=["git"], files={"/etc/motd": "hi"}, commands=["echo 'a b' > /x"])
    cmd = mmdebstrap_command(r, "/out.tar", "/files")
    assert cmd[:3] == ["mmdebstrap", "--variant=minbase", "--format=tar"]
    assert "--include=git" in cmd
    assert "--customize-hook=upload /files/0 /etc/motd" in cmd
    assert any(c.startswith('--customize-hook=chroot "$1"') and "a b" in c for c in cmd)
    assert cmd[-2:] == ["bookworm", "/out.tar"]
    assert set(DEFAULT_RECIPE.packages) == {
        "python3", "bash", "coreutils", "git", "ca-certificates", "procps"
    }  # fmt: skip


def test_recipe_hash_covers_the_bootstrap_procedure(monkeypatch: pytest.MonkeyPatch) -> None:
    # a new way of running mmdebstrap must not answer from a cache the old way filled
    from rollbox.baselines import recipe as recipe_mod

    before = DEFAULT_RECIPE.hash()
    monkeypatch.setattr(recipe_mod, "BOOTSTRAP_PROCEDURE", recipe_mod.BOOTSTRAP_PROCEDURE + 1)
    assert DEFAULT_RECIPE.hash() != before
    assert Recipe(source_date_epoch=1).hash() != Recipe().hash()
