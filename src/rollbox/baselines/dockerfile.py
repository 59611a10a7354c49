"""Just enough Dockerfile parsing for rollbox: the ``FROM`` images, the ``COPY``/``ADD``
sources that must exist in the context, and the build-input hash (the build cache key)."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from rollbox.errors import RecipeError

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass
class Instruction:
    """One logical Dockerfile instruction."""

    line: int
    keyword: str
    args: str


@dataclass
class FromLine:
    """A ``FROM`` instruction: the base image (after ARG substitution) and stage name."""

    index: int
    """Index of the instruction in the parsed list."""
    image: str
    stage: str | None
    flags: list[str]


def parse(text: str) -> list[Instruction]:
    """Logical instructions (continuations joined, comments dropped)."""
    out: list[Instruction] = []
    buf = ""
    start = 0
    for n, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf += stripped[:-1].rstrip() + " "
            continue
        buf += stripped
        keyword, _, args = buf.partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip()))
        buf = ""
    if buf:
        keyword, _, args = buf.partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip()))
    return out


def substitute(text: str, values: dict[str, str]) -> str:
    """Expand ``$VAR``, ``${VAR}`` and ``${VAR:-default}`` from ``values``."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        if name in values:
            return values[name]
        return m.group(2) or ""

    return _VAR.sub(repl, text)


def from_lines(instructions: list[Instruction], build_args: dict[str, str]) -> list[FromLine]:
    """The ``FROM`` lines with global ``ARG`` defaults and ``--build-arg`` values applied.

    Raises:
        RecipeError: no FROM, or a malformed one.
    """
    globals_: dict[str, str] = {}
    out: list[FromLine] = []
    for i, ins in enumerate(instructions):
        if ins.keyword == "ARG" and not out:
            name, _, default = ins.args.partition("=")
            name = name.strip()
            globals_[name] = build_args.get(name, default.strip().strip('"'))
        elif ins.keyword == "FROM":
            words = substitute(ins.args, globals_).split()
            flags = [w for w in words if w.startswith("--")]
            rest = [w for w in words if not w.startswith("--")]
            if len(rest) == 1:
                out.append(FromLine(i, rest[0], None, flags))
            elif len(rest) == 3 and rest[1].lower() == "as":
                out.append(FromLine(i, rest[0], rest[2], flags))
            else:
                raise RecipeError(f"line {ins.line}: malformed FROM {ins.args!r}")
    if not out:
        raise RecipeError("the Dockerfile has no FROM instruction")
    return out


def copy_sources(instructions: list[Instruction]) -> list[tuple[int, str]]:
    """``(line, source)`` of every COPY/ADD source that must come from the build context."""
    out: list[tuple[int, str]] = []
    for ins in instructions:
        if ins.keyword not in {"COPY", "ADD"}:
            continue
        args = ins.args
        words: list[str]
        flags: list[str] = []
        while args.startswith("--"):
            flag, _, args = args.partition(" ")
            flags.append(flag)
            args = args.strip()
        if any(f.startswith("--from") for f in flags):
            continue
        if args.startswith("["):
            try:
                words = [str(w) for w in json.loads(args)]
            except ValueError:
                raise RecipeError(f"line {ins.line}: malformed {ins.keyword} {ins.args!r}")
        else:
            words = args.split()
        if len(words) < 2:
            raise RecipeError(f"line {ins.line}: {ins.keyword} needs a source and a destination")
        for src in words[:-1]:
            if ins.keyword == "ADD" and re.match(r"^[a-z]+://", src):
                continue
            out.append((ins.line, src))
    return out


def check_sources(instructions: list[Instruction], context: Path) -> None:
    """Raise :class:`RecipeError` naming the first COPY/ADD source missing from ``context``."""
    ctx = context.resolve()
    for line, src in copy_sources(instructions):
        rel = src.lstrip("/")
        if any(ch in rel for ch in "*?["):
            entries = [
                os.path.relpath(os.path.join(d, f), ctx)
                for d, ds, fs in os.walk(ctx)
                for f in fs + ds
            ]
            if not fnmatch.filter(entries, os.path.normpath(rel)):
                raise RecipeError(
                    f"line {line}: COPY/ADD source {src!r} matches nothing in {context}"
                )
            continue
        target = (ctx / rel).resolve() if rel not in ("", ".") else ctx
        if not target.is_relative_to(ctx):
            raise RecipeError(f"line {line}: COPY/ADD source {src!r} is outside the context")
        if not os.path.lexists(ctx / rel):
            raise RecipeError(
                f"line {line}: COPY/ADD source {src!r} not found in the build context {context}",
                hint="add the file to the context or fix the path",
            )


def context_hash(context: Path) -> str:
    """Hex sha256 over every entry of ``context``: path, type, mode and content/target."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(context):
        dirnames.sort()
        for name in sorted(filenames + dirnames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, context)
            h.update(f"{rel}\0{stat.S_IFMT(st.st_mode):o}\0{stat.S_IMODE(st.st_mode):o}\0".encode())
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    while block := f.read(1 << 20):
                        h.update(block)
            elif stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(path).encode())
            h.update(b"\0")
    return h.hexdigest()
