"""The base of every rollbox model, the schema version and UTC time."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION = 1
"""Version of the on-disk/record schema written by this rollbox."""

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def utcnow() -> datetime:
    """Now, timezone-aware UTC."""
    return datetime.now(UTC)


class Model(BaseModel):
    """Base: unknown fields are an error, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
