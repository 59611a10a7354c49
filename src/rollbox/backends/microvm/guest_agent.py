"""The guest agent's wire protocol, and its file-tree helper (stdlib only).

The agent itself is C: ``guest_agent.h`` and the units ``guest_agent.c`` (protocol),
``guest_agent_json.c``, ``guest_agent_exec.c`` and ``guest_agent_files.c``, built into one
static binary (PID 1 inside the microVM, started straight from the initramfs init).
It serves the host over a virtio-serial port named
``rollbox.agent``. The wire format is a framed, multiplexed protocol shared with
:mod:`rollbox.backends.microvm.channel`::

    frame = MAGIC(2) type(1) stream(4, big endian) length(4, big endian) payload(length)

``T_JSON`` frames carry one request or reply (a JSON object with an ``id``); ``T_OUT`` /
``T_ERR`` / ``T_IN`` / ``T_DATA`` carry raw bytes for the stream ``id``; ``T_EOF`` ends one.
One host client is connected at a time (QEMU's chardev socket server); when it goes away
the agent kills the commands that client started and waits for the next one.

The host imports this file for the constants and the frame helpers. In the guest it is a
one-shot tool for what the C agent does not reimplement (tar): ``python3 -I -S agent.py tool
OP JSON`` runs ``get_tar`` / ``fs_diff`` (tar on stdout) or ``put_tar`` (tar on stdin); on
failure its last stderr line is ``{"error": {"type": ..., "message": ...}}`` and it exits 1.
The agent relays the data as ``T_DATA`` frames, so these ops need python3 in the baseline.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import sys
import tarfile
import time
from typing import Any, BinaryIO

MAGIC = b"RB"
HEADER = struct.Struct(">2sBII")
T_JSON, T_OUT, T_ERR, T_IN, T_DATA, T_EOF = 1, 2, 3, 4, 5, 6
PORT_NAME = "rollbox.agent"
MAX_FRAME = 1 << 20
CHUNK = 64 * 1024
AGENT_VERSION = 2  # keys the boot snapshots: bump when the guest side changes

RUN = "/run/rollbox"
RW = RUN + "/rw"
UPPER = RW + "/upper"
SPOOL = RW + "/spool"


def frame(kind: int, stream: int, payload: bytes) -> bytes:
    """One wire frame."""
    return HEADER.pack(MAGIC, kind, stream, len(payload)) + payload


def jframe(obj: dict[str, Any]) -> bytes:
    """A ``T_JSON`` frame of ``obj``."""
    return frame(T_JSON, int(obj.get("id", 0)), json.dumps(obj).encode())


class Parser:
    """Incremental frame parser that resynchronises on the magic after garbage."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        self.buf += data
        out: list[tuple[int, int, bytes]] = []
        while True:
            if len(self.buf) < HEADER.size:
                return out
            if self.buf[:2] != MAGIC:
                i = self.buf.find(MAGIC, 1)
                del self.buf[: (i if i >= 0 else len(self.buf) - 1)]
                continue
            _, kind, stream, length = HEADER.unpack_from(self.buf)
            if length > MAX_FRAME or not T_JSON <= kind <= T_EOF:  # not a real header
                del self.buf[:2]
                continue
            if len(self.buf) < HEADER.size + length:
                return out
            payload = bytes(self.buf[HEADER.size : HEADER.size + length])
            del self.buf[: HEADER.size + length]
            out.append((kind, stream, payload))


class Escape(Exception):
    """A path that would resolve outside the root."""


_SYS_OPENAT2 = 437
_RESOLVE = 0x10 | 0x02  # RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS (chroot semantics)
_libc: Any = None


def open_beneath(path: str, flags: int, mode: int = 0) -> int:
    """``openat2(/, path, RESOLVE_IN_ROOT)``: chroot semantics (links resolve inside)."""
    global _libc
    import ctypes

    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long

    class How(ctypes.Structure):
        _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                    ("resolve", ctypes.c_uint64)]  # fmt: skip

    rel = path.lstrip("/") or "."
    how = How(flags | os.O_CLOEXEC, mode, _RESOLVE)
    root = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        for _ in range(16):  # EAGAIN: a rename raced a ".." lookup; retry (man openat2)
            fd = _libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(root),
                               ctypes.c_char_p(rel.encode()), ctypes.byref(how),
                               ctypes.c_size_t(ctypes.sizeof(how)))  # fmt: skip
            if fd >= 0 or ctypes.get_errno() != errno.EAGAIN:
                break
    finally:
        os.close(root)
    if fd < 0:
        err = ctypes.get_errno()
        if err == errno.EXDEV:
            raise Escape(path)
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def makedirs_beneath(path: str) -> int:
    """Create ``path``'s directories (never through an escaping symlink); an O_PATH fd."""
    parts = [p for p in path.split("/") if p]
    done = ""
    for part in parts:
        nxt = done + "/" + part
        try:
            fd = open_beneath(nxt, os.O_PATH | os.O_DIRECTORY)
        except FileNotFoundError:
            parent = open_beneath(done or "/", os.O_PATH | os.O_DIRECTORY)
            try:
                os.mkdir(part, 0o755, dir_fd=parent)
            except FileExistsError:
                pass
            finally:
                os.close(parent)
            fd = open_beneath(nxt, os.O_PATH | os.O_DIRECTORY)
        os.close(fd)
        done = nxt
    return open_beneath(done or "/", os.O_PATH | os.O_DIRECTORY)


def _oserror(exc: OSError) -> dict[str, str]:
    kinds = {errno.ENOENT: "not_found", errno.EISDIR: "is_dir", errno.ENOTDIR: "not_dir"}
    return {"type": kinds.get(exc.errno or 0, "os"), "message": str(exc)}


def _write_layer_tar(upper: str, out: BinaryIO) -> None:
    import stat as stmod

    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for root, dirs, files in os.walk(upper):
            rel_root = os.path.relpath(root, upper)
            for name in sorted(dirs) + sorted(files):
                full = os.path.join(root, name)
                rel = os.path.normpath(os.path.join(rel_root, name))
                st = os.lstat(full)
                if stmod.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                    info = tarfile.TarInfo(os.path.join(os.path.dirname(rel), ".wh." + name))
                    tar.addfile(info)
                    continue
                tar.add(full, arcname=rel, recursive=False)
                if stmod.S_ISDIR(st.st_mode):
                    try:
                        opaque = os.getxattr(full, "trusted.overlay.opaque", follow_symlinks=False)
                    except OSError:
                        opaque = b""
                    if opaque == b"y":
                        tar.addfile(tarfile.TarInfo(os.path.join(rel, ".wh..wh..opq")))


def _untar(spool: str, dest: str) -> None:
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(spool) as tar:
        for m in tar.getmembers():
            parts = m.name.split("/")
            if m.name.startswith("/") or ".." in parts:
                raise ValueError(f"unsafe member {m.name!r}")
        for m in tar.getmembers():
            # a link at a file's path is replaced, not written through (as write_file)
            target = os.path.join(dest, m.name)
            if not m.isdir() and os.path.islink(target):
                os.unlink(target)
            tar.extract(m, dest)


def _spool_path(name: str) -> str:
    os.makedirs(SPOOL, exist_ok=True)
    return f"{SPOOL}/{name}-{os.getpid()}-{time.monotonic_ns()}"


def tool(op: str, req: dict[str, Any]) -> dict[str, Any] | None:
    """Run one tar op with stdin/stdout as its data; the error object, or None."""
    out = sys.stdout.buffer
    if op == "get_tar":
        path = req["path"]
        try:
            os.close(open_beneath(path, os.O_PATH | os.O_NOFOLLOW))
        except Escape:
            return {"type": "escape", "message": path}
        except OSError as exc:
            return _oserror(exc)
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            tar.add(path, arcname=os.path.basename(path.rstrip("/")) or ".", recursive=True)
    elif op == "fs_diff":  # the overlay upper dir as an OCI layer tar
        os.sync()
        _write_layer_tar(UPPER, out)
    elif op == "put_tar":
        dest = req["dest"]
        try:
            os.close(makedirs_beneath(dest))
        except (OSError, Escape) as exc:
            err = {"type": "escape"} if isinstance(exc, Escape) else _oserror(exc)
            err["message"] = dest
            return err
        spool = _spool_path("put")
        try:
            with open(spool, "wb") as f:
                shutil.copyfileobj(sys.stdin.buffer, f, CHUNK)
            _untar(spool, dest)
        except (OSError, ValueError, EOFError, tarfile.TarError) as exc:
            err = _oserror(exc) if isinstance(exc, OSError) else {"type": "os"}
            err["message"] = str(exc)
            return err
        finally:
            os.unlink(spool)
    else:
        return {"type": "agent", "message": f"unknown tool op {op!r}"}
    out.flush()
    return None


def main() -> None:
    """``agent.py tool OP JSON`` in the guest (see the module docstring)."""
    if len(sys.argv) != 4 or sys.argv[1] != "tool":
        sys.exit("usage: agent.py tool OP JSON")
    try:
        err = tool(sys.argv[2], json.loads(sys.argv[3]))
    except Exception as exc:  # reported to the host as one error line
        err = {"type": "os", "message": f"{type(exc).__name__}: {exc}"}
    if err is not None:
        sys.stderr.write("\n" + json.dumps({"error": err}) + "\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
