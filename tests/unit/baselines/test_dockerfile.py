"""Dockerfile parsing: FROM with ARG, COPY sources, context hashing."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbox.baselines import dockerfile as df
from rollbox.errors import RecipeError

TEXT = """\
# syntax comment
ARG BASE=debian:bookworm
FROM ${BASE} AS build
RUN echo a \\
    && echo b
COPY --chown=1:1 a.txt /a
FROM --platform=linux/amd64 build
COPY --from=build /a /b
ADD https://example.invalid/x /x
COPY ["dir/b.txt", "c.txt", "/dst/"]
"""


def test_parse_joins_continuations_and_drops_comments() -> None:
    ins = df.parse(TEXT)
    assert [i.keyword for i in ins] == ["ARG", "FROM", "RUN", "COPY", "FROM", "COPY", "ADD", "COPY"]
    assert ins[2].args == "echo a && echo b"
    assert ins[2].line == 4


def test_from_lines_apply_args_and_stages() -> None:
    ins = df.parse(TEXT)
    froms = df.from_lines(ins, {})
    assert [(f.image, f.stage) for f in froms] == [("debian:bookworm", "build"), ("build", None)]
    assert froms[1].flags == ["--platform=linux/amd64"]
    assert df.from_lines(ins, {"BASE": "x:1"})[0].image == "x:1"


def test_from_errors() -> None:
    with pytest.raises(RecipeError, match="no FROM"):
        df.from_lines(df.parse("RUN true\n"), {})
    with pytest.raises(RecipeError, match="malformed FROM"):
        df.from_lines(df.parse("FROM a b c d\n"), {})


def test_copy_sources_skip_from_and_urls() -> None:
    assert [s for _, s in df.copy_sources(df.parse(TEXT))] == ["a.txt", "dir/b.txt", "c.txt"]


def test_check_sources(tmp_path: Path) -> None:
    ins = df.parse("FROM x\nCOPY a.txt *.py /dst/\n")
    (tmp_path / "a.txt").write_text("a")
    with pytest.raises(RecipeError, match=r"'\*\.py' matches nothing"):
        df.check_sources(ins, tmp_path)
    (tmp_path / "m.py").write_text("")
    df.check_sources(ins, tmp_path)
    with pytest.raises(RecipeError, match="line 2: COPY/ADD source 'nope' not found"):
        df.check_sources(df.parse("FROM x\nCOPY nope /\n"), tmp_path)
    with pytest.raises(RecipeError, match="outside the context"):
        df.check_sources(df.parse("FROM x\nCOPY ../etc /\n"), tmp_path)


def test_context_hash_tracks_content_and_mode(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("1")
    h1 = df.context_hash(tmp_path)
    assert df.context_hash(tmp_path) == h1
    (tmp_path / "f").write_text("2")
    h2 = df.context_hash(tmp_path)
    assert h2 != h1
    (tmp_path / "f").chmod(0o755)
    assert df.context_hash(tmp_path) != h2


def test_substitute() -> None:
    vals = {"A": "1"}
    assert df.substitute("$A ${A} ${B:-d} ${B}", vals) == "1 1 d "
