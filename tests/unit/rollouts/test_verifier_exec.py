"""The pieces of the shared-mode verifier's private exec that need no sandbox: the request
checks, the wire encoding the C agents parse, the packing of ``tests/`` and
``suspicious_changes``."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from rollbox.backends.agent import protocol as p
from rollbox.backends.isolation import IsolatedExec
from rollbox.errors import InvalidInputError
from rollbox.models import FsChange
from rollbox.rollouts.tasks import RollboxSection
from rollbox.rollouts.verifier_exec import (
    TESTS_MAX,
    isolated_request,
    pack_tests,
    suspicious,
    unisolated_stop,
)


def test_suspicious_lists_system_paths_only() -> None:
    paths = [
        "/usr/local/bin/x",
        "/bin/sh",
        "/sbin/init",
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/ld-linux-x86-64.so.2",
        "/libexec/helper",
        "/etc/motd",
        "/opt/app/run",
        "/usrlocal/not-usr",
        "/tmp/answer",
        "/app/src/main.c",
        "/root/.bashrc",
        "/srv/hello.txt",
    ]
    changes = [FsChange(path=x, kind="added") for x in paths]
    assert suspicious(changes) == sorted(paths[:8])
    assert suspicious([]) == []


def test_stop_agent_before_verify_is_a_strict_bool() -> None:
    assert RollboxSection().stop_agent_before_verify is False
    assert RollboxSection(stop_agent_before_verify=True).stop_agent_before_verify is True
    with pytest.raises(ValueError):
        RollboxSection(stop_agent_before_verify="maybe")  # type: ignore[arg-type]


def test_isolated_exec_refuses_paths_outside_its_fresh_dirs() -> None:
    ok = IsolatedExec(fresh=("/tests", "/logs/verifier"), files={"/tests/a/b.sh": (0o755, b"x")})
    ok.check()
    for bad in [
        IsolatedExec(fresh=("tests",)),
        IsolatedExec(fresh=("/",)),
        IsolatedExec(fresh=("/tests/../etc",)),
        IsolatedExec(fresh=("/tests",), files={"/etc/passwd": (0o644, b"")}),
        IsolatedExec(fresh=("/tests",), files={"/tests/../etc/passwd": (0o644, b"")}),
        IsolatedExec(fresh=("/tests",), files={"/testsx/a": (0o644, b"")}),
        IsolatedExec(fresh=("/tests",), collect="/logs/verifier"),
    ]:
        with pytest.raises(InvalidInputError):
            bad.check()


def test_collected_names_stay_inside_and_cuts_are_flagged() -> None:
    iso = IsolatedExec(fresh=("/logs/verifier",), collect="/logs/verifier")
    iso.add_collected("reward.txt", b"1\n", 2)
    iso.add_collected("sub/../../etc/passwd", b"x", 1)
    iso.add_collected("/abs", b"x", 1)
    assert iso.collected == {"reward.txt": b"1\n"} and not iso.truncated
    iso.add_collected("big.log", b"abc", 10)
    assert iso.truncated


def test_private_exec_wire_layout() -> None:
    """The layout agent.c parses: after env, u32 ndirs, u32 nfiles, dirs, files as
    (u32 mode, u32 size, path NUL, data), collect dir NUL."""
    iso = IsolatedExec(
        fresh=("/tests", "/logs/verifier"),
        files={"/tests/test.sh": (0o755, b"echo 1\n")},
        collect="/logs/verifier",
        kill_others=True,
    )
    raw = p.encode_exec(p.ExecRequest(argv=["bash"], env={"A": "b"}, isolate=iso))
    kind, length = p.HEADER.unpack_from(raw)
    body = raw[p.HEADER.size :]
    assert kind == p.EXEC and length == len(body)
    *_ids, flags, argc, envc = struct.unpack_from("<6I", body)
    assert flags == p.FLAG_PRIVATE | p.FLAG_KILLALL and (argc, envc) == (1, 1)
    rest = body[24:].split(b"\0", 3)  # cwd, argv[0], env[0], private part
    assert rest[:3] == [b"", b"bash", b"A=b"]
    priv = rest[3]
    assert struct.unpack_from("<2I", priv) == (2, 1)
    dirs_and_files = priv[8:]
    assert dirs_and_files.startswith(b"/tests\0/logs/verifier\0")
    f = dirs_and_files[len(b"/tests\0/logs/verifier\0") :]
    assert struct.unpack_from("<2I", f) == (0o755, 7)
    assert f[8:] == b"/tests/test.sh\0echo 1\n/logs/verifier\0" + struct.pack("<I", 0)
    # the agent's own deadline, in ms, closes the private part
    iso.timeout_s = 2.5
    raw = p.encode_exec(p.ExecRequest(argv=["bash"], isolate=iso))
    assert raw.endswith(b"/logs/verifier\0" + struct.pack("<I", 2500))
    # kill_others alone: no private part at all
    only_kill = p.encode_exec(p.ExecRequest(argv=["true"], isolate=IsolatedExec(kill_others=True)))
    assert struct.unpack_from("<6I", only_kill[p.HEADER.size :])[3] == p.FLAG_KILLALL
    assert only_kill.endswith(b"\0true\0")


def test_collected_frame_decodes() -> None:
    payload = struct.pack("<2I", 0o644, 10) + b"sub/reward.txt\0" + b"1\n"
    assert p.decode_collected(payload) == ("sub/reward.txt", 0o644, 10, b"1\n")


def test_pack_tests_follows_links_inside_and_refuses_links_out(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    (tests / "data").mkdir(parents=True)
    (tests / "test.sh").write_text("bash /tests/data/check.sh\n")
    (tests / "test.sh").chmod(0o755)
    (tests / "data" / "check.sh").write_text("echo 1\n")
    (tests / "alias.sh").symlink_to("data/check.sh")
    (tests / "datalink").symlink_to("data")
    files = pack_tests(tests)
    assert files["/tests/test.sh"] == (0o755, b"bash /tests/data/check.sh\n")
    assert files["/tests/alias.sh"][1] == b"echo 1\n"
    assert set(files) == {"/tests/test.sh", "/tests/data/check.sh", "/tests/alias.sh"}
    req = isolated_request(tests, stop_agent=False)
    assert req.fresh == ("/tests", "/logs/verifier") and req.collect == "/logs/verifier"
    assert not req.kill_others
    req.check()
    (tmp_path / "secret").write_text("host only")
    (tests / "leak").symlink_to(tmp_path / "secret")
    with pytest.raises(InvalidInputError, match="links outside tests/"):
        pack_tests(tests)


def test_pack_tests_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rollbox.rollouts import verifier_exec

    (tmp_path / "big").write_bytes(b"x" * 2048)
    monkeypatch.setattr(verifier_exec, "TESTS_MAX", 1024)
    with pytest.raises(InvalidInputError, match="larger than"):
        pack_tests(tmp_path)
    assert TESTS_MAX == 48 << 20


def test_microvm_request_too_big_for_one_frame_takes_the_weaker_path() -> None:
    from rollbox.backends.microvm.backend import PRIVATE_FILES_MAX, _private_request
    from rollbox.errors import CapabilityError
    from rollbox.rollouts.verifier_exec import is_unsupported

    small = IsolatedExec(fresh=("/tests",), files={"/tests/t.sh": (0o755, b"\x00\xff")})
    req = _private_request(small)
    assert req == {
        "fresh": ["/tests"],
        "files": [["/tests/t.sh", 0o755, "AP8="]],
        "collect": "",
        "kill_others": False,
    }
    big = IsolatedExec(
        fresh=("/tests",), files={"/tests/big": (0o644, b"x" * (PRIVATE_FILES_MAX + 1))}
    )
    with pytest.raises(CapabilityError) as info:
        _private_request(big)
    assert is_unsupported(info.value)


def test_unisolated_backends_stop_the_agent_unless_the_task_opts_out() -> None:
    """Without a private exec (gVisor), shared mode stops the agent's processes first unless
    the task says ``stop_agent_before_verify = false`` itself; separate mode never does."""
    unset = RollboxSection()
    assert unisolated_stop(unset, "shared") == (True, "stopped-agent")
    assert unisolated_stop(RollboxSection(stop_agent_before_verify=True), "shared") == (
        True,
        "stopped-agent",
    )
    optout = RollboxSection.model_validate({"stop_agent_before_verify": False})
    assert unisolated_stop(optout, "shared") == (False, "none")
    assert unisolated_stop(unset, "separate") == (False, "none")
    assert unisolated_stop(optout, "separate") == (False, "none")
