"""``rollbox cleanup [--dry-run]``: remove what dead, expired or crashed sandboxes left.

Runs ``cleanup_orphans`` of every registered backend whose tools are available, marks runs
whose ``rollbox run`` process died as ``interrupted`` in the metadata store, then removes
stale entries of ``$ROLLBOX_HOME/tmp``. Prints one line per removed resource, one
``error:`` line per resource it could not remove (exit 1), and the failures the TTL reaper
logged since the last cleanup.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time

import typer

from rollbox.backends.registry import get_backend, names
from rollbox.cli.output import JSON_OPTION, emit
from rollbox.config import Home
from rollbox.errors import BackendUnavailableError, RollboxError, TeardownError

TMP_STALE_S = 3600.0


def cleanup(home: Home, dry_run: bool = False, problems: list[str] | None = None) -> list[str]:
    """Every backend's orphans, then stale ``tmp/`` entries; one line each.

    A backend that cannot be loaded or fails is skipped (the others still run); its error
    goes to ``problems`` when given.
    """
    lines: list[str] = []
    for name in names():
        try:
            be = get_backend(name, home)
        except (SyntaxError, RollboxError) as exc:  # a declared backend that cannot load
            if problems is not None:
                problems.append(f"backend {name} not loaded: {exc}")
            continue
        try:
            lines += be.cleanup_orphans(dry_run=dry_run)
        except BackendUnavailableError:
            continue
        except TeardownError as exc:  # it went on with the rest: both lists count
            lines += exc.removed
            if problems is not None:
                problems += [f"backend {name}: {e}" for e in exc.errors]
        except (RollboxError, OSError) as exc:
            if problems is not None:
                problems.append(f"backend {name}: {exc}")
    try:
        lines += _reap_runs(home, dry_run)
    except (RollboxError, OSError) as exc:
        if problems is not None:
            problems.append(f"metadata store: {exc}")
    try:  # canaries, netns and scratch dirs of a killed `rollbox audit`
        from rollbox.audit.leftovers import sweep

        lines += sweep(home, dry_run)
    except OSError as exc:
        if problems is not None:
            problems.append(f"audit leftovers: {exc}")
    if home.tmp.is_dir():
        now = time.time()
        for entry in sorted(home.tmp.iterdir()):
            with contextlib.suppress(FileNotFoundError):
                if now - entry.lstat().st_mtime < TMP_STALE_S:
                    continue
                if not dry_run:
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink()
                lines.append(f"tmp {entry}")
    return lines


def _reap_runs(home: Home, dry_run: bool) -> list[str]:
    """Runs whose ``rollbox run`` process is gone become ``interrupted`` (records sealed)."""
    url = os.environ.get("ROLLBOX_DB")
    if url is None and not home.db_path.exists():
        return []  # no store yet: nothing ran here
    from rollbox.rollouts.runs import reap_stale_runs, stale_runs
    from rollbox.store.blobs import BlobStore
    from rollbox.store.metadata import MetaStore

    with MetaStore(url, home=home) as meta:
        ids = stale_runs(meta) if dry_run else reap_stale_runs(meta, BlobStore(home))
    return [f"run {i}: its rollbox run process is gone; marked interrupted" for i in ids]


def register(app: typer.Typer) -> None:
    """Add the top-level ``cleanup`` command."""

    @app.command("cleanup")
    def cleanup_cmd(
        dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would go."),
        json_: bool = JSON_OPTION,
    ) -> None:
        """Remove leftovers of sandboxes whose owner died, whose TTL passed or that crashed."""
        from rollbox.backends import reaper

        home = Home.from_env()
        problems: list[str] = []
        lines = cleanup(home, dry_run, problems)
        reaped = reaper.read_failures(home)
        verb = "would remove" if dry_run else "removed"
        human = "\n".join(f"{verb} {line}" for line in lines) or "nothing to clean up"
        for f in reaped:
            human += f"\nreaper failed at {f.get('at', '?')}: {f.get('sandbox', '?')}: "
            human += str(f.get("error", ""))
        emit(
            {
                "dry_run": dry_run,
                "removed": lines,
                "problems": problems,
                "reaper_failures": reaped,
            },
            json_,
            human,
        )
        for problem in problems:
            sys.stderr.write(f"error: {problem}\n")
        if reaped and not dry_run:
            reaper.clear_failures(home)  # shown once; kept in reaper-failures.seen.jsonl
        if problems:
            raise typer.Exit(1)
