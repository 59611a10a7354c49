"""Agent wire format and sandbox state helpers."""

from __future__ import annotations

import os
import struct
from datetime import timedelta

import pytest

from rollbox.backends.agent import protocol as p
from rollbox.backends.state import (
    expired,
    list_states,
    owner_fields,
    owner_gone,
    process_alive,
    process_start_time,
    read_state,
    write_state,
)
from rollbox.config import Home
from rollbox.errors import SandboxNotFoundError
from rollbox.models import SandboxInfo, SandboxSpec, utcnow


def test_encode_exec_layout() -> None:
    req = p.ExecRequest(argv=["echo", "hi"], env={"A": "1"}, cwd="/tmp", uid=5, gid=6, nofile=9)
    data = p.encode_exec(req)
    kind, length = p.HEADER.unpack(data[:5])
    assert kind == p.EXEC and length == len(data) - 5
    uid, gid, nofile, flags, argc, envc = struct.unpack("<6I", data[5:29])
    assert (uid, gid, nofile, argc, envc) == (5, 6, 9, 2, 1)
    assert flags == p.FLAG_USER
    assert data[29:].split(b"\0")[:-1] == [b"/tmp", b"echo", b"hi", b"A=1"]


@pytest.mark.parametrize(
    "req",
    [
        p.ExecRequest(argv=[]),
        p.ExecRequest(argv=["a\0b"]),
        p.ExecRequest(argv=["x"], env={"A=B": "1"}),
    ],
)
def test_encode_exec_refuses_bad(req: p.ExecRequest) -> None:
    with pytest.raises(ValueError):
        p.encode_exec(req)


def _info(sid: str, **kw: object) -> SandboxInfo:
    return SandboxInfo(
        id=sid,
        backend="namespace",
        baseline="sha256:" + "a" * 64,
        spec=SandboxSpec(baseline="sha256:" + "a" * 64),
        created_at=utcnow(),
        **kw,  # type: ignore[arg-type]
    )


def test_state_roundtrip(home: Home) -> None:
    info = _info("sbx-01abc")
    (home.sandboxes / info.id).mkdir(parents=True)
    write_state(home, info)
    assert read_state(home, info.id) == info
    assert [i.id for i in list_states(home)] == [info.id]
    with pytest.raises(SandboxNotFoundError):
        read_state(home, "sbx-nope")


def test_owner_and_expiry() -> None:
    pid, extra = owner_fields(detached=False)
    me = _info("sbx-x", owner_pid=pid, extra=extra)
    assert pid == os.getpid() and not owner_gone(me)
    assert process_alive(os.getpid(), process_start_time(os.getpid()))
    reused = _info("sbx-y", owner_pid=os.getpid(), extra={"owner_start": 1})
    assert owner_gone(reused)  # same pid, other start time: a different process
    detached = _info("sbx-z", owner_pid=None, extra=owner_fields(detached=True)[1])
    assert not owner_gone(detached)
    past = _info("sbx-t", expires_at=utcnow() - timedelta(seconds=1))
    assert expired(past) and not expired(_info("sbx-u"))
