"""The public sandbox API: :class:`AsyncSandbox` and its sync mirror :class:`Sandbox`.

Both have the same method names (as E2B's ``Sandbox``/``AsyncSandbox``)::

    from rollbox import Sandbox

    with Sandbox.create(backend="namespace") as sbx:          # default baseline
        r = sbx.exec(["python3", "-c", "print(6*7)"])
        assert r.stdout == "42\\n"
        sbx.files.write("/tmp/x", "hello")

Secrets given to :meth:`AsyncSandbox.create` stay in this process's memory and are
injected into each exec's environment; they are never written to disk.

Optional operations (``fork``, ``pause``, ``snapshot_memory``...) are checked against the
backend's capabilities first and raise :class:`~rollbox.errors.UnsupportedOperationError`
when it lacks them. Every :class:`~rollbox.errors.RollboxError` raised by an operation on a
sandbox carries ``sandbox_id`` and ``backend``. An :class:`AsyncSandbox` belongs to the event
loop it was made in; the sync :class:`Sandbox` runs its own loop in a thread, so to use a
sync sandbox from async code, ``await sbx.to_async()``.
"""

from __future__ import annotations

from rollbox.sandbox.aio import AsyncFiles, AsyncSandbox, parse_network
from rollbox.sandbox.lifecycle import create_handle, finish_or_dispose, read_state
from rollbox.sandbox.sync import CANCEL_WAIT_S, Files, Sandbox

__all__ = [
    "CANCEL_WAIT_S",
    "AsyncFiles",
    "AsyncSandbox",
    "Files",
    "Sandbox",
    "create_handle",
    "finish_or_dispose",
    "parse_network",
    "read_state",
]
