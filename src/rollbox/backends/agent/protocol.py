"""Wire format shared with ``agent.c``: ``u8 type, u32 LE length, payload``."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from rollbox.backends.isolation import IsolatedExec

HEADER = struct.Struct("<cI")

# host -> agent
EXEC = b"E"
GO = b"G"
STDIN = b"I"
PING = b"Q"
# agent -> host
PID = b"P"
STDOUT = b"O"
STDERR = b"R"
FAIL = b"F"
EXIT = b"X"
PONG = b"A"
COLLECTED = b"L"
TIMED_OUT = b"T"

FLAG_STDIN = 1
FLAG_USER = 2
FLAG_CGFDS = 4
FLAG_PRIVATE = 8
FLAG_KILLALL = 16

FAIL_STAGES = {
    b"C": "chdir",
    b"U": "user",
    b"E": "exec",
    b"S": "session",
    b"G": "cgroup",
    b"M": "private mounts",
    b"K": "restrict",
}


@dataclass
class ExecRequest:
    """One command for the agent to run."""

    argv: list[str]
    """Program and arguments (the program is searched in ``PATH`` of ``env``)."""
    env: dict[str, str] = field(default_factory=dict)
    """The command's complete environment."""
    cwd: str = ""
    """Working directory inside (empty: the agent's, ``/``)."""
    uid: int | None = None
    """Switch to this uid (and ``gid``) before exec; ``None`` keeps root."""
    gid: int = 0
    """Group id used with ``uid``."""
    nofile: int = 0
    """RLIMIT_NOFILE for the command; 0 leaves it."""
    stdin: bytes | None = None
    """Bytes fed to stdin, then closed; ``None`` connects /dev/null."""
    isolate: IsolatedExec | None = None
    """Private mount namespace / kill-the-rest options (flags 8 and 16)."""


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    """One encoded frame."""
    return HEADER.pack(kind, len(payload)) + payload


def _cstr(text: str, what: str) -> bytes:
    raw = text.encode()
    if b"\0" in raw:
        raise ValueError(f"{what} contains a NUL byte")
    return raw + b"\0"


def encode_exec(req: ExecRequest, *, cgroup_fds: bool = False) -> bytes:
    """The ``E`` frame for ``req`` (``cgroup_fds``: open ``cgroup.procs`` files travel with
    it and the command joins those groups itself, no pid/go handshake).

    Raises:
        ValueError: an argument or variable contains a NUL byte, or argv is empty.
    """
    if not req.argv:
        raise ValueError("empty command")
    flags = (FLAG_STDIN if req.stdin is not None else 0) | (FLAG_USER if req.uid is not None else 0)
    if cgroup_fds:
        flags |= FLAG_CGFDS
    iso = req.isolate
    if iso is not None and iso.kill_others:
        flags |= FLAG_KILLALL
    if iso is not None and iso.fresh:
        flags |= FLAG_PRIVATE
    env_items = [f"{k}={v}" for k, v in req.env.items()]
    for k in req.env:
        if not k or "=" in k:
            raise ValueError(f"bad environment variable name {k!r}")
    body = [
        struct.pack(
            "<6I",
            req.uid or 0,
            req.gid,
            req.nofile,
            flags,
            len(req.argv),
            len(env_items),
        ),
        _cstr(req.cwd, "cwd"),
        *(_cstr(a, "argument") for a in req.argv),
        *(_cstr(e, "environment") for e in env_items),
    ]
    if flags & FLAG_PRIVATE:
        assert iso is not None
        body.append(struct.pack("<2I", len(iso.fresh), len(iso.files)))
        body += [_cstr(d, "directory") for d in iso.fresh]
        for path, (mode, data) in iso.files.items():
            body += [struct.pack("<2I", mode, len(data)), _cstr(path, "path"), data]
        body.append(_cstr(iso.collect or "", "directory"))
        ms = 0 if iso.timeout_s is None else max(1, min(int(iso.timeout_s * 1000), 2**32 - 1))
        body.append(struct.pack("<I", ms))  # the agent's own deadline (0: none)
    return frame(EXEC, b"".join(body))


def decode_collected(payload: bytes) -> tuple[str, int, int, bytes]:
    """An ``L`` frame: (relative path, mode, full size, data)."""
    mode, full = struct.unpack_from("<2I", payload)
    nul = payload.index(b"\0", 8)
    return payload[8:nul].decode("utf-8", "surrogateescape"), mode, full, payload[nul + 1 :]
