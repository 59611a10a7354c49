"""Audit pieces that need no sandbox: the registry, the repro comparison, the probe programs
(run here with the host's python3 on harmless inputs) and the mountinfo definition."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rollbox.audit import scripts
from rollbox.audit.context import MARK, AuditContext
from rollbox.audit.probes_kernel import host_path_markers
from rollbox.audit.repro import compare, write_builtin_task
from rollbox.audit.runner import probe_names, select
from rollbox.config import Home
from rollbox.errors import InvalidInputError
from rollbox.models import FsChange, RolloutRecord, VerifierOutcome

REQUIRED = {
    "cross-sandbox-files", "cross-sandbox-processes", "cross-sandbox-env-secrets",
    "host-files-invisible", "baseline-immutable", "pids-limit", "memory-limit", "disk-limit",
    "timeout-no-survivors", "network-none-no-route", "proc-environ", "mountinfo-host-paths",
    "inherited-fds", "rollbox-home-and-sockets", "host-loopback-service",
    "netns-server-allowlist", "kill-all", "ptrace", "proc-sys-write", "sys-write", "mknod",
    "mount", "keyctl", "bpf", "tiocsti", "download-symlink-race", "baseline-hash-mismatch",
    "residue-cycles",
}  # fmt: skip


def test_registry_has_every_required_probe_once() -> None:
    names = probe_names()
    assert len(names) == len(set(names))
    assert set(names) >= REQUIRED, REQUIRED - set(names)


def test_select() -> None:
    assert [p.name for p in select(["bpf", "mount"], None)] == ["mount", "bpf"]  # run order
    assert "bpf" not in [p.name for p in select(None, ["bpf"])]
    with pytest.raises(InvalidInputError, match="unknown probe 'nope'"):
        select(["nope"], None)


def _run_script(src: str, args: dict[str, object]) -> dict[str, object]:
    r = subprocess.run(
        [sys.executable, "-c", src],
        input=json.dumps(args),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    line = [ln for ln in r.stdout.splitlines() if ln.startswith(MARK)][-1]
    out: dict[str, object] = json.loads(line[len(MARK) :])
    return out


def test_scripts_parse() -> None:
    import ast

    progs = [v for k, v in vars(scripts).items() if k.isupper() and isinstance(v, str)]
    assert len(progs) > 15
    for src in progs:
        ast.parse(src)


def test_fds_script_sees_an_inherited_fd(tmp_path: Path) -> None:
    f = (tmp_path / "x").open("w")
    fd = f.fileno()
    try:
        r = subprocess.run(
            [sys.executable, "-c", scripts.FDS],
            input="{}",
            capture_output=True,
            text=True,
            pass_fds=(fd,),
            check=True,
        )
    finally:
        f.close()
    doc = json.loads(r.stdout.split(MARK, 1)[1])
    assert str(fd) in doc["fds"] and doc["fds"][str(fd)].endswith("/x")


def test_exists_and_connect_scripts(tmp_path: Path) -> None:
    (tmp_path / "here").write_text("x")
    doc = _run_script(scripts.EXISTS, {"paths": [str(tmp_path / "here"), str(tmp_path / "gone")]})
    assert doc["exists"] == {str(tmp_path / "here"): True, str(tmp_path / "gone"): False}

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def serve() -> None:
        c, _ = srv.accept()
        c.sendall(b"hello-token\n")
        c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    doc = _run_script(scripts.CONNECT, {"tcp": [["127.0.0.1", port]]})
    t.join(5)
    srv.close()
    assert doc["connect"] == {f"127.0.0.1:{port}": "CONNECTED hello-token"}
    closed = _run_script(scripts.CONNECT, {"tcp": [["127.0.0.1", port]]})
    assert closed["connect"][f"127.0.0.1:{port}"] == "ECONNREFUSED"


def test_scan_procs_finds_a_token_in_another_process_env() -> None:
    tok = "rbxaudit-unit-token-42"
    p = subprocess.Popen(["sleep", "30"], env={"PATH": "/usr/bin:/bin", "X": tok})
    try:
        doc = _run_script(scripts.SCAN_PROCS, {"tokens": [tok]})
    finally:
        p.kill()
        p.wait()
    assert p.pid in doc["environ_hits"]  # type: ignore[operator]
    assert doc["self_env_has"] == []  # the token came on stdin, not in the env


def test_host_path_markers(tmp_path: Path) -> None:
    home = Home(tmp_path / "h")
    ctx = AuditContext(
        home=home, backend="namespace", baseline="sha256:" + "0" * 64,
        layer_dirs=[tmp_path / "h" / "layers" / "abc"], canary_dir=tmp_path / "canary",
    )  # fmt: skip
    marks = host_path_markers(ctx)
    assert str(home.root) in marks and str(home.sandboxes) in marks
    assert str(tmp_path / "h" / "layers" / "abc") in marks and str(tmp_path / "canary") in marks
    assert "/" not in marks


def _rec(
    rid: str, sha: str, reward: float = 1.0, extra: list[FsChange] | None = None
) -> RolloutRecord:
    return RolloutRecord(
        id=rid,
        run_id="run-x",
        task_name="t",
        task_digest="sha256:" + "1" * 64,
        agent="oracle",
        status="done",
        exit_codes={"agent": 0, "verifier": 0},
        verifier=VerifierOutcome(reward=reward, passed=reward == 1.0),
        fs_diff=[FsChange(path="/app/out", kind="added", size=3, sha256=sha), *(extra or [])],
    )


def test_compare_identical_and_different() -> None:
    a, b = _rec("ro-a", "sha256:aa"), _rec("ro-b", "sha256:aa")
    assert compare([a, b]) == []
    c = _rec("ro-c", "sha256:cc", reward=0.0, extra=[FsChange(path="/tmp/r", kind="added")])
    diffs = {d.what: d.values for d in compare([a, b, c])}
    assert diffs["fs:/app/out"]["ro-c"].endswith("sha256:cc")
    assert diffs["fs:/tmp/r"]["ro-a"] == "absent"
    assert diffs["outcome:reward"] == {"ro-a": 1.0, "ro-b": 1.0, "ro-c": 0.0}
    assert "outcome:status" not in diffs


def test_builtin_repro_task_loads(tmp_path: Path) -> None:
    from rollbox.rollouts.tasks import load_task

    task = load_task(write_builtin_task(tmp_path / "t"))
    assert task.name == "rollbox-audit-repro"
