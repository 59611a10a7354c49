"""The rollbox guest agent: runs as PID 1 inside the microVM (stdlib only).

Started straight from the initramfs init (``switch_root`` then ``python3 -I -S agent.py``), it
serves the host over a virtio-serial port named ``rollbox.agent``. The wire format is a
framed, multiplexed protocol shared with :mod:`rollbox.backends.microvm.channel`::

    frame = MAGIC(2) type(1) stream(4, big endian) length(4, big endian) payload(length)

``T_JSON`` frames carry one request or reply (a JSON object with an ``id``); ``T_OUT`` /
``T_ERR`` / ``T_IN`` / ``T_DATA`` carry raw bytes for the stream ``id``; ``T_EOF`` ends one.
One host client is connected at a time (QEMU's chardev socket server); when it goes away
the agent kills the commands that client started and waits for the next one.

This file is imported by the host for its constants; everything else runs in the guest.
"""

from __future__ import annotations

import base64
import errno
import fcntl
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from typing import Any

MAGIC = b"RB"
HEADER = struct.Struct(">2sBII")
T_JSON, T_OUT, T_ERR, T_IN, T_DATA, T_EOF = 1, 2, 3, 4, 5, 6
PORT_NAME = "rollbox.agent"
MAX_FRAME = 1 << 20
CHUNK = 64 * 1024
AGENT_VERSION = 1

RUN = "/run/rollbox"
RW = RUN + "/rw"
UPPER = RW + "/upper"
SPOOL = RW + "/spool"
CGROOT = "/sys/fs/cgroup"
WORKLOAD = CGROOT + "/rbx"

RNDADDENTROPY = 0x40085203
RNDRESEEDCRNG = 0x5207


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


# --------------------------------------------------------------------------- guest side


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _setup_cgroups() -> None:
    # Like a container host: allocations succeed and the memory limit (the cgroup's
    # memory.max, not the guest's RAM size) decides, by OOM-killing inside the cgroup.
    try:
        _write("/proc/sys/vm/overcommit_memory", "1")
    except OSError:
        pass
    # the init mounted cgroup2 at CGROOT before starting us
    try:
        _write(CGROOT + "/cgroup.subtree_control", "+memory +pids")
        os.makedirs(WORKLOAD, exist_ok=True)
        _write(WORKLOAD + "/cgroup.subtree_control", "+memory +pids")
    except OSError as exc:
        print(f"rollbox-agent: cgroups unavailable: {exc}", file=sys.stderr)


class Exec:
    """One running command."""

    def __init__(self, agent: Agent, rid: int, req: dict[str, Any]) -> None:
        self.agent = agent
        self.rid = rid
        self.cap = int(req.get("output_bytes", 1 << 20))
        self.sent = {T_OUT: 0, T_ERR: 0}
        self.truncated = False
        self.exit_code: int | None = None
        self.timed_out = False
        self.cg = f"{WORKLOAD}/e{rid}-{os.getpid()}-{time.monotonic_ns()}"
        timeout = req.get("timeout")
        self.deadline = time.monotonic() + float(timeout) if timeout else None
        self.stdin_buf = bytearray()
        self.stdin_eof = not req.get("stdin", False)
        try:
            os.mkdir(self.cg)
        except OSError:
            self.cg = ""
        in_r, self.stdin = os.pipe()
        self.stdout, out_w = os.pipe()
        self.stderr, err_w = os.pipe()
        err_r, err_wp = os.pipe()
        for fd in (self.stdin, self.stdout, self.stderr, err_r, err_wp):
            fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # child
            try:
                os.setsid()
                if self.cg:
                    _write(self.cg + "/cgroup.procs", str(os.getpid()))
                os.dup2(in_r, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                for s in (signal.SIGPIPE, signal.SIGCHLD, signal.SIGIO, signal.SIGTERM):
                    signal.signal(s, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                nofile = req.get("nofile")
                if nofile:
                    import resource

                    resource.setrlimit(resource.RLIMIT_NOFILE, (int(nofile), int(nofile)))
                uid, gid, groups = req.get("uid", 0), req.get("gid", 0), req.get("groups", [])
                if uid or gid:
                    os.setgroups(groups or [gid])
                    os.setgid(gid)
                    os.setuid(uid)
                os.chdir(req.get("cwd") or "/")
                argv = req["argv"]
                os.execvpe(argv[0], argv, req.get("env", {}))
            except BaseException as exc:  # report why exec failed, like subprocess does
                code = 127 if isinstance(exc, FileNotFoundError) else 126
                try:
                    msg = f"{code} rollbox: cannot run {req['argv'][0]!r}: {exc}"
                    os.write(err_wp, msg.encode())
                finally:
                    os._exit(code)
        self.pid = pid
        for fd in (in_r, out_w, err_w, err_wp):
            os.close(fd)
        failure = os.read(err_r, 4096)
        os.close(err_r)
        self.start_error = failure.decode(errors="replace") if failure else ""
        for fd in (self.stdin, self.stdout, self.stderr):
            os.set_blocking(fd, False)
        if self.stdin_eof:
            os.close(self.stdin)
            self.stdin = -1

    def on_output(self, fd: int, kind: int) -> bool:
        """Read what is there; False at EOF."""
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            return False
        room = self.cap - self.sent[kind]
        if room <= 0:
            self.truncated = True
            return True
        if len(data) > room:
            data = data[:room]
            self.truncated = True
        self.sent[kind] += len(data)
        self.agent.send(frame(kind, self.rid, data))
        return True

    def feed_stdin(self, data: bytes | None) -> None:
        if self.stdin < 0:
            return
        if data is None:
            self.stdin_eof = True
        else:
            self.stdin_buf += data
        self.flush_stdin()

    def flush_stdin(self) -> None:
        if self.stdin < 0:
            return
        try:
            while self.stdin_buf:
                n = os.write(self.stdin, self.stdin_buf[:CHUNK])
                del self.stdin_buf[:n]
        except BlockingIOError:
            return
        except OSError:
            self.stdin_buf.clear()
        if self.stdin_eof and not self.stdin_buf:
            os.close(self.stdin)
            self.stdin = -1

    def kill(self) -> None:
        """Kill the whole tree: everything in the command's cgroup (setsid daemons too)."""
        if self.cg:
            try:
                _write(self.cg + "/cgroup.kill", "1")
                return
            except OSError:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass

    def oom_killed(self) -> bool:
        if not self.cg:
            return False
        try:
            with open(self.cg + "/memory.events") as f:
                for line in f:
                    key, _, val = line.partition(" ")
                    if key == "oom_kill" and int(val) > 0:
                        return True
        except OSError:
            pass
        return False


class Agent:
    """The single-threaded event loop serving one host client at a time."""

    def __init__(self) -> None:
        self.port = -1
        self.connected = False
        self.out = bytearray()
        self.parser = Parser()
        self.execs: dict[int, Exec] = {}
        self.statuses: dict[int, int] = {}
        self.writes: dict[int, tuple[int, str, str, int]] = {}
        self.sends: list[tuple[int, Any, str]] = []
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGIO, lambda *_: None)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)

    # -- transport
    def open_port(self) -> None:
        base = "/sys/class/virtio-ports"
        while self.port < 0:
            try:
                for name in os.listdir(base):
                    with open(f"{base}/{name}/name") as f:
                        if f.read().strip() == PORT_NAME:
                            self.port = os.open(f"/dev/{name}", os.O_RDWR | os.O_NONBLOCK)
                            break
            except OSError:
                pass
            if self.port < 0:
                time.sleep(0.01)
        # SIGIO when the host (dis)connects, so we need not poll while nobody is there.
        fcntl.fcntl(self.port, fcntl.F_SETOWN, os.getpid())
        flags = fcntl.fcntl(self.port, fcntl.F_GETFL)
        fcntl.fcntl(self.port, fcntl.F_SETFL, flags | os.O_ASYNC)

    def send(self, data: bytes) -> None:
        if self.connected:
            self.out += data

    def reply(self, obj: dict[str, Any]) -> None:
        self.send(jframe(obj))

    def disconnected(self) -> None:
        self.connected = False
        # Keep pending output: the "host connected" event and the first data of a new
        # client travel on different virtqueues, so a hello can be read (and answered)
        # before the guest learns the old client left; dropping output here would lose
        # that answer. Stale frames are skipped by the next client (it waits for its nonce).
        if len(self.out) > 16 << 20:
            self.out.clear()
        self.parser = Parser()
        for ex in list(self.execs.values()):
            ex.kill()
        for fd, path, _tmp, _mode in self.writes.values():
            os.close(fd)
            try:
                os.unlink(path)
            except OSError:
                pass
        self.writes.clear()
        for _rid, _f, path in self.sends:
            _close_spool(_f, path)
        self.sends.clear()

    # -- main loop
    def run(self) -> None:
        _setup_cgroups()
        self.open_port()
        while True:
            try:
                self.step()
            except Exception as exc:  # PID 1 must never exit; one bad step is survivable
                print(f"rollbox-agent: {exc!r}", file=sys.stderr)
                time.sleep(0.05)

    def step(self) -> None:
        rfds = [self.wake_r]
        wfds = []
        rfds.append(self.port)
        if self.out:
            wfds.append(self.port)
        for ex in self.execs.values():
            if ex.stdout >= 0:
                rfds.append(ex.stdout)
            if ex.stderr >= 0:
                rfds.append(ex.stderr)
            if ex.stdin >= 0 and ex.stdin_buf:
                wfds.append(ex.stdin)
        timeout = self.next_timeout()
        if not self.connected:
            # host absent: a read returns EOF at once, so wait for SIGIO (or poll slowly)
            rfds.remove(self.port)
            timeout = 0.5 if timeout is None else min(timeout, 0.5)
        if self.sends and len(self.out) < CHUNK * 4:
            timeout = 0
        try:
            r, w, _ = select.select(rfds, wfds, [], timeout)
        except InterruptedError:
            r, w = [], []
        if self.wake_r in r:
            try:
                os.read(self.wake_r, 512)
            except BlockingIOError:
                pass
        self.reap()
        if self.port in w or self.out:
            self.flush()
        if self.port in r or not self.connected:
            self.read_port()
        for ex in list(self.execs.values()):
            if ex.stdout in r and not ex.on_output(ex.stdout, T_OUT):
                os.close(ex.stdout)
                ex.stdout = -1
            if ex.stderr in r and not ex.on_output(ex.stderr, T_ERR):
                os.close(ex.stderr)
                ex.stderr = -1
            if ex.stdin in w:
                ex.flush_stdin()
            self.check_exec(ex)
        self.pump_sends()

    def next_timeout(self) -> float | None:
        deadlines = [ex.deadline for ex in self.execs.values() if ex.deadline]
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def flush(self) -> None:
        while self.out:
            try:
                n = os.write(self.port, self.out[:CHUNK])
            except BlockingIOError:
                return
            except OSError:
                self.disconnected()
                return
            del self.out[:n]

    def read_port(self) -> None:
        try:
            data = os.read(self.port, CHUNK)
        except BlockingIOError:
            if not self.connected:
                self.connected = True
            return
        except OSError:
            data = b""
        if not data:
            if self.connected:
                self.disconnected()
            return
        self.connected = True
        for kind, stream, payload in self.parser.feed(data):
            try:
                self.handle(kind, stream, payload)
            except Exception as exc:  # one bad request must not take the agent down
                self.reply({"id": stream, "error": {"type": "agent", "message": repr(exc)}})

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.statuses[pid] = os.waitstatus_to_exitcode(status)

    def check_exec(self, ex: Exec) -> None:
        if ex.exit_code is None and ex.pid in self.statuses:
            code = self.statuses.pop(ex.pid)
            ex.exit_code = 128 - code if code < 0 else code
        if ex.deadline and ex.exit_code is None and time.monotonic() >= ex.deadline:
            ex.timed_out = True
            ex.kill()
        if ex.exit_code is None:
            return
        # the command is gone: take what is left in the pipes, do not wait for daemons
        for attr, kind in (("stdout", T_OUT), ("stderr", T_ERR)):
            fd = getattr(ex, attr)
            if fd >= 0:
                while ex.on_output(fd, kind):
                    try:
                        if not select.select([fd], [], [], 0)[0]:
                            break
                    except OSError:
                        break
                os.close(fd)
                setattr(ex, attr, -1)
        if ex.stdin >= 0:
            os.close(ex.stdin)
            ex.stdin = -1
        if ex.timed_out:
            ex.kill()
        code = ex.exit_code
        if ex.start_error:
            code_s, _, msg = ex.start_error.partition(" ")
            self.send(frame(T_ERR, ex.rid, (msg + "\n").encode()))
            code = int(code_s)
        self.reply(
            {
                "id": ex.rid,
                "exit_code": code,
                "timed_out": ex.timed_out,
                "oom_killed": ex.oom_killed(),
                "truncated": ex.truncated,
            }
        )
        del self.execs[ex.rid]
        if ex.cg:
            try:
                os.rmdir(ex.cg)
            except OSError:
                pass  # daemons still in it; collected by the next sweep
        self.sweep_cgroups()

    def sweep_cgroups(self) -> None:
        live = {ex.cg for ex in self.execs.values()}
        try:
            names = os.listdir(WORKLOAD)
        except OSError:
            return
        for name in names:
            path = f"{WORKLOAD}/{name}"
            if name.startswith("e") and path not in live and os.path.isdir(path):
                try:
                    os.rmdir(path)
                except OSError:
                    pass

    # -- requests
    def handle(self, kind: int, stream: int, payload: bytes) -> None:
        if kind == T_JSON:
            req = json.loads(payload)
            getattr(self, "op_" + req["op"])(int(req.get("id", 0)), req)
        elif kind in (T_IN, T_EOF) and stream in self.execs:
            self.execs[stream].feed_stdin(payload if kind == T_IN else None)
        elif kind == T_DATA and stream in self.writes:
            fd = self.writes[stream][0]
            view = memoryview(payload)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        elif kind == T_EOF and stream in self.writes:
            self.finish_write(stream)

    def op_hello(self, rid: int, req: dict[str, Any]) -> None:
        for ex in list(self.execs.values()):
            ex.kill()
        self.reply(
            {
                "id": rid,
                "nonce": req.get("nonce"),
                "agent_version": AGENT_VERSION,
                "python": sys.version.split()[0],
                "uptime": time.clock_gettime(time.CLOCK_BOOTTIME),
            }
        )

    def op_ping(self, rid: int, req: dict[str, Any]) -> None:
        self.reply({"id": rid})

    def op_configure(self, rid: int, req: dict[str, Any]) -> None:
        if req.get("hostname"):
            socket.sethostname(req["hostname"])
        for key, fname in (("memory_max", "memory.max"), ("pids_max", "pids.max")):
            val = req.get(key)
            try:
                _write(f"{WORKLOAD}/{fname}", str(val) if val else "max")
            except OSError:
                pass
        if req.get("memory_max"):
            try:
                _write(WORKLOAD + "/memory.swap.max", "0")
            except OSError:
                pass
        self.reply({"id": rid})

    def op_exec(self, rid: int, req: dict[str, Any]) -> None:
        try:
            uid, gid, groups, home = resolve_user(req.get("user") or "root")
        except ValueError as exc:
            self.reply({"id": rid, "error": {"type": "user", "message": str(exc)}})
            return
        req.update(uid=uid, gid=gid, groups=groups)
        req.setdefault("env", {}).setdefault("HOME", home)
        self.execs[rid] = Exec(self, rid, req)

    def op_kill(self, rid: int, req: dict[str, Any]) -> None:
        ex = self.execs.get(int(req["target"]))
        if ex is not None:
            ex.kill()
        self.reply({"id": rid})

    def op_restored(self, rid: int, req: dict[str, Any]) -> None:
        """After a memory restore: host time and fresh host randomness."""
        time.clock_settime(time.CLOCK_REALTIME, int(req["time_ns"]) / 1e9)
        seed = base64.b64decode(req["entropy"])
        with open("/dev/urandom", "wb") as f:
            info = struct.pack("ii", len(seed) * 8, len(seed)) + seed
            fcntl.ioctl(f.fileno(), RNDADDENTROPY, info)
            try:
                fcntl.ioctl(f.fileno(), RNDRESEEDCRNG)
            except OSError:
                pass
        self.reply({"id": rid, "time_ns": time.time_ns()})

    def op_quiesce(self, rid: int, req: dict[str, Any]) -> None:
        """Before a snapshot: flush the disks; optionally drop clean caches (smaller image)."""
        os.sync()
        if req.get("drop_caches"):
            try:
                _write("/proc/sys/vm/drop_caches", "3")
            except OSError:
                pass
        self.reply({"id": rid})

    def op_stat(self, rid: int, req: dict[str, Any]) -> None:
        path = req["path"]
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            self.reply({"id": rid, "exists": False})
            return
        import stat as stmod

        self.reply(
            {
                "id": rid,
                "exists": True,
                "dir": stmod.S_ISDIR(st.st_mode),
                "link": stmod.S_ISLNK(st.st_mode),
                "realpath": os.path.realpath(path),
            }
        )

    def op_read_file(self, rid: int, req: dict[str, Any]) -> None:
        import stat as stmod

        try:
            fd = open_beneath(req["path"], os.O_RDONLY | os.O_NONBLOCK)
            if not stmod.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise IsADirectoryError(errno.EISDIR, "not a regular file", req["path"])
            os.set_blocking(fd, True)
        except Escape:
            self.reply({"id": rid, "error": {"type": "escape", "message": req["path"]}})
            return
        except OSError as exc:
            self.reply({"id": rid, "error": _oserror(exc)})
            return
        self.sends.append((rid, os.fdopen(fd, "rb"), ""))

    def op_write_file(self, rid: int, req: dict[str, Any]) -> None:
        path = req["path"]
        parent = os.path.dirname(path) or "/"
        try:
            pfd = makedirs_beneath(parent)
            # resolve the parent as a real directory path (it was checked to stay beneath)
            real_parent = os.readlink(f"/proc/self/fd/{pfd}")
            os.close(pfd)
            tmp = f"{real_parent.rstrip('/')}/.rbx-{rid}-{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except (OSError, Escape) as exc:
            err = {"type": "escape", "message": path} if isinstance(exc, Escape) else _oserror(exc)
            self.reply({"id": rid, "error": err})
            self.writes[rid] = (os.open("/dev/null", os.O_WRONLY), "/nonexistent", "", -1)
            return
        final = f"{real_parent.rstrip('/')}/{os.path.basename(path)}"
        self.writes[rid] = (fd, tmp, final, int(req.get("mode", 0o644)))

    def finish_write(self, rid: int) -> None:
        fd, tmp, path, mode = self.writes.pop(rid)
        os.close(fd)
        if mode < 0:
            return
        try:
            os.chmod(tmp, mode)
            os.rename(tmp, path)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            self.reply({"id": rid, "error": _oserror(exc)})
            return
        self.reply({"id": rid})

    def op_get_tar(self, rid: int, req: dict[str, Any]) -> None:
        """Stream a tar of ``path`` (symlinks kept as symlinks)."""
        import tarfile

        path = req["path"]
        try:
            os.close(open_beneath(path, os.O_PATH | os.O_NOFOLLOW))
        except Escape:
            self.reply({"id": rid, "error": {"type": "escape", "message": path}})
            return
        except OSError as exc:
            self.reply({"id": rid, "error": _oserror(exc)})
            return
        spool = _spool_path(rid)
        with tarfile.open(spool, "w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(path, arcname=os.path.basename(path.rstrip("/")) or ".", recursive=True)
        self.sends.append((rid, open(spool, "rb"), spool))  # noqa: SIM115

    def op_put_tar(self, rid: int, req: dict[str, Any]) -> None:
        """Receive a tar (data frames) and unpack it into ``dest``."""
        spool = _spool_path(rid)
        try:
            os.close(makedirs_beneath(req["dest"]))
        except (OSError, Escape) as exc:
            err = {"type": "escape"} if isinstance(exc, Escape) else _oserror(exc)
            err["message"] = req["dest"]
            self.reply({"id": rid, "error": err})
            self.writes[rid] = (os.open("/dev/null", os.O_WRONLY), "/nonexistent", "", -1)
            return
        fd = os.open(spool, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self.writes[rid] = (fd, spool, "\0tar:" + req["dest"], 0)

    def op_fs_diff(self, rid: int, req: dict[str, Any]) -> None:
        """Stream the overlay upper dir as an OCI layer tar (whiteouts as ``.wh.`` files)."""
        os.sync()
        spool = _spool_path(rid)
        _write_layer_tar(UPPER, spool)
        self.sends.append((rid, open(spool, "rb"), spool))  # noqa: SIM115

    def pump_sends(self) -> None:
        while self.sends and len(self.out) < CHUNK * 4:
            rid, f, spool = self.sends[0]
            data = f.read(CHUNK)
            if data:
                self.send(frame(T_DATA, rid, data))
                continue
            self.sends.pop(0)
            _close_spool(f, spool)
            self.send(frame(T_EOF, rid, b""))
            self.reply({"id": rid})


def _spool_path(rid: int) -> str:
    os.makedirs(SPOOL, exist_ok=True)
    return f"{SPOOL}/{rid}-{time.monotonic_ns()}"


def _close_spool(f: Any, path: str) -> None:
    f.close()
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


class Escape(Exception):
    """A path that would resolve outside the root."""


_SYS_OPENAT2 = 437
_RESOLVE = 0x08 | 0x02  # RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS
_libc: Any = None


def open_beneath(path: str, flags: int, mode: int = 0) -> int:
    """``openat2(/, path, RESOLVE_BENEATH)``: absolute or escaping symlinks are refused."""
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
        fd = _libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(root),
                           ctypes.c_char_p(rel.encode()), ctypes.byref(how),
                           ctypes.c_size_t(ctypes.sizeof(how)))  # fmt: skip
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


def resolve_user(spec: str) -> tuple[int, int, list[int], str]:
    """``root`` / ``uid[:gid]`` / ``name[:group]`` -> (uid, gid, groups, home)."""
    import grp
    import pwd

    name, _, group = (spec or "root").partition(":")
    try:
        pw = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        uid, gid, home = pw.pw_uid, pw.pw_gid, pw.pw_dir
        groups = os.getgrouplist(pw.pw_name, gid)
    except KeyError:
        if not name.isdigit():
            raise ValueError(f"no user {name!r} inside the sandbox") from None
        uid, gid, home, groups = int(name), int(name), "/", []
    if group:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise ValueError(f"no group {group!r} inside the sandbox") from None
        groups = [gid]
    return uid, gid, groups or [gid], home


def _oserror(exc: OSError) -> dict[str, str]:
    kinds = {errno.ENOENT: "not_found", errno.EISDIR: "is_dir", errno.ENOTDIR: "not_dir"}
    return {"type": kinds.get(exc.errno or 0, "os"), "message": str(exc)}


def _write_layer_tar(upper: str, out: str) -> None:
    import stat as stmod
    import tarfile

    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
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
    import tarfile

    os.makedirs(dest, exist_ok=True)
    with tarfile.open(spool) as tar:
        for m in tar.getmembers():
            parts = m.name.split("/")
            if m.name.startswith("/") or ".." in parts:
                raise ValueError(f"unsafe member {m.name!r}")
        tar.extractall(dest)


def main() -> None:
    """Entry point in the guest."""
    os.environ.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    agent = Agent()
    orig_finish = agent.finish_write

    def finish(rid: int) -> None:
        fd, spool, target, _mode = agent.writes[rid]
        if target.startswith("\0tar:"):
            agent.writes.pop(rid)
            os.close(fd)
            try:
                _untar(spool, target[5:])
            except (OSError, ValueError, EOFError) as exc:
                err = _oserror(exc) if isinstance(exc, OSError) else {"type": "os"}
                err["message"] = str(exc)
                agent.reply({"id": rid, "error": err})
            else:
                agent.reply({"id": rid})
            finally:
                os.unlink(spool)
            return
        orig_finish(rid)

    agent.finish_write = finish  # type: ignore[method-assign]
    agent.run()


if __name__ == "__main__":
    main()
