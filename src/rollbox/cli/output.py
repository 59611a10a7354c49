"""Output conventions shared by every command: ``--json`` and one-line errors.

Every command takes ``--json``; with it, the command prints exactly one JSON document
(the same pydantic models the library returns) on stdout, and errors become
``{"error": "...", "type": "...", "exit_code": N}`` on stdout as well.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, TextIO

import typer
from pydantic import BaseModel
from rich.console import Console

JSON_OPTION = typer.Option(False, "--json", help="Print one JSON document instead of text.")

PIPE_WIDTH = 120
"""Width of tables written to a pipe or file when ``COLUMNS`` does not say otherwise."""


def output_width(stream: TextIO, environ: Mapping[str, str] | None = None) -> int | None:
    """The width to lay tables out for on ``stream``: None on a terminal (rich asks it),
    else ``COLUMNS`` when set to a sane number, else :data:`PIPE_WIDTH`.

    rich falls back to 80 columns off a terminal; a report piped to a file or ``less`` is
    then as cramped as the narrowest terminal for no reason.
    """
    env = os.environ if environ is None else environ
    try:
        if stream.isatty():
            return None
    except (AttributeError, ValueError):
        pass  # closed or not a real stream: lay out as for a pipe
    cols = env.get("COLUMNS", "")
    if cols.isdigit() and 20 <= int(cols) <= 1000:
        return int(cols)
    return PIPE_WIDTH


# soft_wrap: plain lines (ids, paths, digests) are never folded by rich; the terminal wraps
# them, so copying an id keeps it whole. Tables lay themselves out for the width.
console = Console(highlight=False, soft_wrap=True, width=output_width(sys.stdout))
err_console = Console(stderr=True, highlight=False, soft_wrap=True, width=output_width(sys.stderr))


def to_jsonable(obj: Any) -> Any:
    """Turn models (and lists/dicts of them) into plain JSON-able data."""
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    return obj


def emit(data: Any, json_mode: bool, human: Callable[[], None] | str | None = None) -> None:
    """Print ``data`` as JSON when ``json_mode``, else run/print ``human``."""
    if json_mode:
        sys.stdout.write(json.dumps(to_jsonable(data), indent=2, sort_keys=False) + "\n")
        sys.stdout.flush()
        return
    if human is None:
        console.print(json.dumps(to_jsonable(data), indent=2))
    elif isinstance(human, str):
        console.print(human)
    else:
        human()


def fail(message: str, exit_code: int = 2, json_mode: bool | None = None) -> typer.Exit:
    """Print one error line (or JSON) and return the ``typer.Exit`` to raise."""
    if json_mode is None:
        json_mode = "--json" in sys.argv
    if json_mode:
        doc = {"error": message, "type": "UsageError", "exit_code": exit_code}
        sys.stdout.write(json.dumps(doc) + "\n")
    else:
        sys.stderr.write(f"error: {message}\n")
    return typer.Exit(exit_code)
