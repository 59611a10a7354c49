"""Bootstrap recipes: a Debian suite + variant + packages + files + commands."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rollbox.errors import RecipeError

_PKG_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(:[a-z0-9]+)?$")
_SUITE_RE = re.compile(r"^[a-z][a-z0-9-]*$")

BOOTSTRAP_PROCEDURE = 2
"""Version of how rollbox runs mmdebstrap (environment, fixed hooks), part of every recipe
hash: bumped when the procedure changes, so no cache filled by an older one answers.
2: SOURCE_DATE_EPOCH, fixed /etc/hostname and /etc/resolv.conf (mode 0644)."""

DEFAULT_SOURCE_DATE_EPOCH = 1686355200
"""2023-06-10T00:00:00Z, the day bookworm was released: the default clamp of file times."""


class Recipe(BaseModel):
    """What ``rollbox baseline bootstrap`` builds with mmdebstrap."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    suite: str = "bookworm"
    """Debian suite, e.g. ``bookworm``."""
    variant: Literal["extract", "custom", "essential", "apt", "required", "minbase", "buildd",
                     "important", "debootstrap", "standard"] = "minbase"  # fmt: skip
    """mmdebstrap variant."""
    packages: list[str] = []
    """Packages to install on top of the variant (order does not matter)."""
    files: dict[str, str] = {}
    """Files to write into the image: absolute path inside → text content."""
    commands: list[str] = []
    """Shell commands run in the image (chroot) after packages and files, in order."""
    mirror: str | None = None
    """Debian mirror URL (default: mmdebstrap's, i.e. the host's apt sources)."""
    source_date_epoch: int = Field(DEFAULT_SOURCE_DATE_EPOCH, ge=0, le=(1 << 33) - 1)
    """``SOURCE_DATE_EPOCH`` of the build: every file time later than it is clamped to it
    (and Python byte code is hash-checked), so the same recipe and the same Debian snapshot
    give the same digest on any machine."""

    @field_validator("suite")
    @classmethod
    def _suite_ok(cls, v: str) -> str:
        if not _SUITE_RE.match(v):
            raise ValueError(f"not a Debian suite name: {v!r}")
        return v

    @field_validator("packages")
    @classmethod
    def _packages_ok(cls, v: list[str]) -> list[str]:
        for p in v:
            if not _PKG_RE.match(p):
                raise ValueError(f"not a Debian package name: {p!r}")
        return sorted(set(v))

    @field_validator("files")
    @classmethod
    def _files_ok(cls, v: dict[str, str]) -> dict[str, str]:
        for path in v:
            if not path.startswith("/") or ".." in path.split("/"):
                raise ValueError(f"file path must be absolute without '..': {path!r}")
        return dict(sorted(v.items()))

    def canonical(self) -> dict[str, Any]:
        """The recipe as canonical JSON-able data (sorted packages and files)."""
        return self.model_dump(mode="json")

    def hash(self) -> str:
        """Hex sha256 of the canonical recipe and ``BOOTSTRAP_PROCEDURE``: the bootstrap
        cache key."""
        doc = {**self.canonical(), "_procedure": BOOTSTRAP_PROCEDURE}
        data = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(data.encode()).hexdigest()


def recipe_from_data(data: Any, where: str = "recipe") -> Recipe:
    """Validate recipe data.

    Raises:
        RecipeError: unknown field or bad value, named in one line.
    """
    if not isinstance(data, dict):
        raise RecipeError(f"{where}: expected a table/object of recipe fields")
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "recipe"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(Recipe.model_fields)
            raise RecipeError(f"{where}: unknown field {loc!r}", hint=f"allowed: {allowed}")
        raise RecipeError(f"{where}: field {loc!r}: {err['msg']}")


def load_recipe(path: Path) -> Recipe:
    """Read a recipe from a ``.json`` or ``.toml`` file.

    Raises:
        RecipeError: missing file, unparsable file or invalid recipe.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RecipeError(f"recipe file {path} does not exist")
    except (IsADirectoryError, UnicodeDecodeError):
        raise RecipeError(f"recipe {path} is not a text file")
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        kind = "TOML" if path.suffix == ".toml" else "JSON"
        raise RecipeError(f"recipe {path} is not valid {kind}: {exc}".splitlines()[0])
    return recipe_from_data(data, str(path))
