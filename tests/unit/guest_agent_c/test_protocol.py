"""The C guest agent on the host (``rbx-agent --fd N`` over a socketpair, no cgroups, no
host-wide changes): the JSON parser and serializer, bad input, exec semantics, stdin, the
output cap, timeouts, path safety and disconnects. Milliseconds each, no VM."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from requirebackends import backend_unavailable
from rollbox.backends.microvm.guest_agent import (
    T_DATA,
    T_EOF,
    T_ERR,
    T_IN,
    T_JSON,
    T_OUT,
    Parser,
    frame,
    jframe,
)
from rollbox.backends.microvm.initramfs import agent_binary
from rollbox.config import Home
from rollbox.errors import BackendUnavailableError

ENV = {"PATH": "/usr/bin:/bin"}


class Agent:
    """A running agent and the host end of its socket."""

    def __init__(self, binary: Path) -> None:
        self.sock, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [str(binary), "--fd", str(theirs.fileno())], pass_fds=[theirs.fileno()]
        )
        theirs.close()
        self.sock.settimeout(10)
        self.parser = Parser()
        self.pending: list[tuple[int, int, bytes]] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frames(self, rid: int) -> list[tuple[int, bytes]]:
        """Frames of stream ``rid`` up to and including its JSON reply."""
        got: list[tuple[int, bytes]] = []
        while True:
            for kind, stream, payload in self.pending:
                if stream == rid:
                    got.append((kind, payload))
            self.pending = [f for f in self.pending if f[1] != rid]
            if got and got[-1][0] == T_JSON:
                return got
            data = self.sock.recv(1 << 20)
            assert data, "agent closed the connection"
            self.pending += self.parser.feed(data)

    def call(self, extra: bytes = b"", **req: Any) -> dict[str, Any]:
        self.send(jframe(req) + extra)
        reply: dict[str, Any] = json.loads(self.frames(int(req["id"]))[-1][1])
        return reply

    def run(self, rid: int, extra: bytes = b"", **req: Any) -> tuple[bytes, bytes, Any]:
        """An exec: (stdout, stderr, reply)."""
        self.send(jframe({"id": rid, "op": "exec", "env": ENV, **req}) + extra)
        fr = self.frames(rid)
        out = b"".join(p for k, p in fr if k == T_OUT)
        err = b"".join(p for k, p in fr if k == T_ERR)
        return out, err, json.loads(fr[-1][1])


@pytest.fixture(scope="module")
def binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = Home(tmp_path_factory.mktemp("agent-home")).ensure()
    try:
        return agent_binary(home)
    except BackendUnavailableError as exc:
        backend_unavailable("microvm", exc)


@pytest.fixture
def agent(binary: Path) -> Iterator[Agent]:
    a = Agent(binary)
    yield a
    a.sock.close()
    a.proc.kill()
    a.proc.wait()


def test_json_round_trips_escapes_surrogates_and_numbers(agent: Agent) -> None:
    nonce = {
        "s": 'q"b\\s/\b\f\n\r\t\x01 é € 😀 \U0010ffff',
        "n": [0, -1, 2**63 - 1, -(2**63), 1.5, -2.5e-3, 1e300],
        "b": [True, False, None],
        "nested": {"": [[], {}]},
    }
    reply = agent.call(id=3, op="hello", nonce=nonce)
    assert reply["nonce"] == nonce
    assert reply["agent"] == "c" and reply["agent_version"] >= 2 and reply["uptime"] > 0
    # escapes written by hand, as another client might
    raw = rb'{"id": 4, "op": "hello", "nonce": "\u00e9\ud83d\ude00\u0041\/"}'
    agent.send(frame(T_JSON, 4, raw))
    assert json.loads(agent.frames(4)[-1][1])["nonce"] == "é😀A/"


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"{",
        b"[1, 2]",
        b'"just a string"',
        b'{"id": 1, "op": }',
        b'{"id": 1, "op": "ping"} trailing',
        b'{"id": 1, "op": "ping",}',
        b'{"a": "\\x"}',
        b'{"a": "\\u12"}',
        b'{"a": "tab\tinside"}',
        b'{"a": 01}',
        b'{"a": 1.}',
        b'{"a": -}',
        b'{"a": tru}',
        b"[" * 5000,
        b'{"id": 1}',
        b'{"id": 1, "op": 5}',
    ],
)
def test_malformed_requests_get_an_error_and_the_agent_keeps_serving(
    agent: Agent, payload: bytes
) -> None:
    agent.send(b"garbage before the frame" + frame(T_JSON, 77, payload))
    reply = json.loads(agent.frames(77)[-1][1])
    assert reply["id"] == 77 and reply["error"]["type"] == "agent"
    assert agent.call(id=78, op="ping") == {"id": 78}
    assert agent.proc.poll() is None


def test_mutated_requests_never_take_the_agent_down(agent: Agent) -> None:
    rng = random.Random(1234)
    bases = [
        {"id": 40, "op": "ping"},
        {"id": 41, "op": "hello", "nonce": ["\u00e9\ud83d\ude00", 1.5, {"k": None}]},
        {"id": 42, "op": "stat", "path": "/nonexistent/rbx"},
        {"id": 43, "op": "exec", "argv": ["true"], "env": ENV, "timeout": 5},
    ]
    alphabet = b'{}[]",:\\u0123456789abcdefnulltrue-+.eE \x00\xff\xc3\xa9'
    for _ in range(400):
        data = bytearray(json.dumps(rng.choice(bases)).encode())
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(data) + 1)
            action = rng.random()
            if action < 0.4 and pos < len(data):
                data[pos] = rng.choice(alphabet)
            elif action < 0.7:
                data.insert(pos, rng.choice(alphabet))
            elif pos < len(data):
                del data[pos]
        agent.send(frame(T_JSON, 40, bytes(data)))
    assert agent.call(id=999, op="ping") == {"id": 999}
    assert agent.proc.poll() is None


def test_unknown_op_and_missing_fields(agent: Agent) -> None:
    assert "unknown op" in agent.call(id=5, op="frobnicate")["error"]["message"]
    assert agent.call(id=6, op="exec")["error"]["type"] == "agent"
    assert agent.call(id=7, op="exec", argv=[])["error"]["type"] == "agent"
    assert agent.call(id=8, op="exec", argv=["true", 3])["error"]["type"] == "agent"
    assert agent.call(id=9, op="kill")["error"]["type"] == "agent"
    assert agent.call(id=10, op="read_file")["error"]["type"] == "agent"
    assert agent.call(id=12, op="read_file", path="/etc/host\u0000name")["error"]["type"] == "agent"
    assert agent.call(id=11, op="ping") == {"id": 11}


def test_exec_exit_codes_signals_and_start_errors(agent: Agent, tmp_path: Path) -> None:
    out, err, rep = agent.run(1, argv=["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (out, err, rep["exit_code"]) == (b"out\n", b"err\n", 3)
    assert rep.pop("disk_total") >= rep.pop("disk_free") >= 0  # statvfs of the root
    assert rep == {"id": 1, "exit_code": 3, "timed_out": False, "oom_killed": False,
                   "pids_exhausted": False, "truncated": False}  # fmt: skip
    assert agent.run(2, argv=["sh", "-c", "kill -9 $$"])[2]["exit_code"] == 137
    _, err, rep = agent.run(3, argv=["no-such-prog"])
    assert rep["exit_code"] == 127
    assert err.startswith(b"rollbox: cannot run 'no-such-prog': [Errno 2] No such file")
    _, err, rep = agent.run(4, argv=["true"], cwd=str(tmp_path / "missing"))
    assert rep["exit_code"] == 127 and str(tmp_path / "missing").encode() in err
    script = tmp_path / "noexec"
    script.write_text("#!/bin/sh\n")
    _, err, rep = agent.run(5, argv=[str(script)])
    assert rep["exit_code"] == 126 and b"Permission denied" in err
    out, _, _ = agent.run(6, argv=["sh", "-c", 'echo "$HOME|$A|$(pwd)"'], cwd=str(tmp_path),
                          env={**ENV, "A": "é 😀"})  # fmt: skip
    assert out.decode() == f"/root|é 😀|{tmp_path}\n"
    assert agent.run(7, argv=["sh", "-c", "ulimit -n"], nofile=77)[0] == b"77\n"


def test_exec_as_another_user(agent: Agent) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to switch users")
    out, _, rep = agent.run(1, argv=["id", "-u"], user="65534")
    assert (out, rep["exit_code"]) == (b"65534\n", 0)
    rep = agent.call(id=2, op="exec", argv=["id"], user="no-such-user")
    assert rep["error"] == {"type": "user", "message": "no user 'no-such-user' inside the sandbox"}


def test_stdin_streams_and_output_is_capped(agent: Agent) -> None:
    data = os.urandom(200 * 1024)
    chunks = b"".join(frame(T_IN, 1, data[i : i + 65536]) for i in range(0, len(data), 65536))
    out, _, rep = agent.run(1, chunks + frame(T_EOF, 1, b""), argv=["cat"], stdin=True)
    assert out == data and rep["exit_code"] == 0 and not rep["truncated"]
    argv = ["head", "-c", str(1 << 20), "/dev/zero"]
    out, _, rep = agent.run(2, argv=argv, output_bytes=1000)
    assert out == b"\0" * 1000 and rep["truncated"] is True
    # without stdin the command reads EOF at once
    assert agent.run(3, argv=["cat"])[0] == b""


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    pytest.fail(f"process {pid} outlived its command")


def test_timeout_kills_the_command_tree(agent: Agent) -> None:
    t0 = time.monotonic()
    out, _, rep = agent.run(1, argv=["sh", "-c", "sleep 30 & echo $!; wait"], timeout=0.5)
    assert rep["timed_out"] is True and rep["exit_code"] == 137
    assert time.monotonic() - t0 < 10
    _wait_gone(int(out))  # the background child too: the whole tree was killed (and reaped)


def test_files_stay_beneath_the_root(agent: Agent, tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "f.txt"
    rid = 20
    agent.send(jframe({"id": rid, "op": "write_file", "path": str(target), "mode": 0o640}))
    agent.send(
        frame(T_DATA, rid, b"hello ") + frame(T_DATA, rid, b"world") + frame(T_EOF, rid, b"")
    )
    assert json.loads(agent.frames(rid)[-1][1]) == {"id": rid}
    assert target.read_bytes() == b"hello world" and target.stat().st_mode & 0o777 == 0o640
    agent.send(jframe({"id": 21, "op": "read_file", "path": str(target)}))
    fr = agent.frames(21)
    assert b"".join(p for k, p in fr if k == T_DATA) == b"hello world"
    assert [k for k, _ in fr[-2:]] == [T_EOF, T_JSON] and json.loads(fr[-1][1]) == {"id": 21}
    # chroot semantics (RESOLVE_IN_ROOT): an absolute link starts at the agent's root and
    # ".." stops there (this agent's root is the host's /; in a guest, the guest's)
    (tmp_path / "abs").symlink_to("/etc")
    (tmp_path / "up").symlink_to("../" * 40 + "etc")
    hostname = Path("/etc/hostname").read_bytes()
    for rid, link in ((22, "abs"), (28, "up")):
        path = str(tmp_path / link / "hostname")
        agent.send(jframe({"id": rid, "op": "read_file", "path": path}))
        assert b"".join(p for k, p in agent.frames(rid) if k == T_DATA) == hostname
    (tmp_path / "real").mkdir()
    (tmp_path / "abs2").symlink_to(tmp_path / "real")
    agent.send(jframe({"id": 23, "op": "write_file", "path": str(tmp_path / "abs2" / "x" / "y")}))
    agent.send(frame(T_DATA, 23, b"data") + frame(T_EOF, 23, b""))
    assert json.loads(agent.frames(23)[-1][1]) == {"id": 23}
    assert (tmp_path / "real" / "x" / "y").read_bytes() == b"data"
    missing = agent.call(id=24, op="read_file", path=str(tmp_path / "nope"))
    assert missing["error"]["type"] == "not_found"
    assert agent.call(id=25, op="read_file", path=str(tmp_path))["error"]["type"] == "is_dir"
    st = agent.call(id=26, op="stat", path=str(tmp_path / "abs"))
    assert st == {
        "id": 26, "exists": True, "dir": False, "link": True, "reg": False, "mode": 0o777,
        "realpath": "/etc",
    }  # fmt: skip
    st = agent.call(id=29, op="stat", path=str(target))
    assert st["reg"] is True and st["mode"] == 0o640 and not st["link"]
    assert agent.call(id=27, op="stat", path=str(tmp_path / "nope")) == {"id": 27, "exists": False}


def test_disconnect_kills_running_commands_and_the_agent_lives_on(agent: Agent) -> None:
    agent.send(
        jframe({"id": 1, "op": "exec", "env": ENV, "argv": ["sh", "-c", "echo $$; sleep 60"]})
    )
    while not any(k == T_OUT for k, s, _ in agent.pending if s == 1):
        agent.pending += agent.parser.feed(agent.sock.recv(65536))
    pid = int(next(p for k, s, p in agent.pending if k == T_OUT and s == 1))
    agent.sock.close()
    _wait_gone(pid)
    assert agent.proc.poll() is None  # PID 1 must never exit
