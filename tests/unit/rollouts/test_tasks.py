"""Harbor task loader: fields, defaults, errors and the directory digest."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rollbox.errors import TaskError
from rollbox.rollouts.tasks import load_task, task_digest, task_tar


def make_task(root: Path, toml: str | None = "", instruction: str | None = "Do it.\n") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if instruction is not None:
        (root / "instruction.md").write_text(instruction)
    if toml is not None:
        (root / "task.toml").write_text(toml)
    (root / "tests").mkdir(exist_ok=True)
    (root / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    return root


FULL = """
version = "1.0"
artifacts = ["/app/out.txt"]

[task]
name = "full"

[metadata]
difficulty = "easy"
tags = ["x"]

[agent]
timeout_sec = 30

[verifier]
timeout_sec = 20
environment_mode = "separate"
env = { MODE = "strict" }

[environment]
cpus = 0.5
memory = "2G"
storage_mb = 300
network_mode = "allow"
allowed_hosts = ["127.0.0.1:8080"]
env = { A = "1" }
workdir = "/app"
build_timeout_sec = 600

[rollbox]
attempts = 3
group_mode = "snapshot"
pass_threshold = 0.5
"""


def test_full_task_loads(tmp_path: Path) -> None:
    t = load_task(make_task(tmp_path / "t", FULL))
    assert t.name == "full"
    assert t.agent.timeout_sec == 30
    assert t.verifier.environment_mode == "separate"
    assert t.verifier.env == {"MODE": "strict"}
    assert t.environment.memory_mb == 2048
    assert t.limits().cpus == 0.5 and t.limits().disk_mb == 300 and t.limits().memory_mb == 2048
    net = t.network()
    assert net.mode == "allow" and str(net.allow[0]) == "127.0.0.1:8080"
    assert t.environment.workdir == "/app"
    assert t.artifacts == ("/app/out.txt",)
    assert t.rollbox.attempts == 3 and t.rollbox.group_mode == "snapshot"
    assert t.metadata["difficulty"] == "easy"
    assert "version" in t.ignored_keys and "environment.build_timeout_sec" in t.ignored_keys
    assert t.instruction == "Do it.\n"
    assert t.digest.startswith("sha256:") and len(t.digest) == 71


def test_defaults_without_task_toml(tmp_path: Path) -> None:
    t = load_task(make_task(tmp_path / "plain", toml=None))
    assert t.name == "plain"
    assert t.verifier.environment_mode == "shared"
    assert t.network().mode == "none"
    assert t.dockerfile is None
    assert t.rollbox.pass_threshold is None


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ("[agent\n", "not valid TOML"),
        ("[agent]\ntimeout_sec = -1\n", "[agent] timeout_sec"),
        ("[agent]\ntimeout_sec = 'soon'\n", "[agent] timeout_sec"),
        ("agent = 3\n", "[agent] must be a table"),
        ("[verifier]\nenvironment_mode = 'elsewhere'\n", "environment_mode"),
        ("[environment]\nmemory = 'lots'\n", "memory"),
        ("[environment]\nworkdir = 'rel'\n", "workdir"),
        ("[environment]\nallowed_hosts = ['nope']\nnetwork_mode = 'allow'\n", "allowed_hosts"),
        ("[environment]\nallowed_hosts = ['1.2.3.4:80']\n", "network_mode = 'allow'"),
        ("[rollbox]\nbackend_typo = 'x'\n", "[rollbox] backend_typo"),
        ("artifacts = 'x'\n", "artifacts must be a list"),
        ("artifacts = ['rel/path']\n", "absolute path"),
        ("artifacts = ['/a/../etc']\n", "absolute path"),
        ("[task]\nname = ''\n", "[task] name"),
    ],
)
def test_malformed_toml_is_one_task_error(tmp_path: Path, toml: str, needle: str) -> None:
    with pytest.raises(TaskError) as ei:
        load_task(make_task(tmp_path / "bad", toml))
    msg = ei.value.one_line()
    assert needle in msg, msg
    assert "\n" not in msg
    assert ei.value.exit_code == 2


def test_missing_instruction_and_dir(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match=r"instruction\.md is missing"):
        load_task(make_task(tmp_path / "noinstr", instruction=None))
    with pytest.raises(TaskError, match="does not exist"):
        load_task(tmp_path / "nowhere")


def test_non_utf8_instruction(tmp_path: Path) -> None:
    d = make_task(tmp_path / "bin")
    (d / "instruction.md").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(TaskError, match="not UTF-8"):
        load_task(d)


def test_digest_tracks_paths_contents_and_modes(tmp_path: Path) -> None:
    d = make_task(tmp_path / "d", "")
    first = task_digest(d)
    assert task_digest(d) == first
    copy = make_task(tmp_path / "elsewhere", "")
    assert task_digest(copy) == first  # identity does not depend on where it lives
    (d / "tests" / "test.sh").write_text("echo 0 > /logs/verifier/reward.txt\n")
    second = task_digest(d)
    assert second != first
    os.chmod(d / "tests" / "test.sh", 0o755)
    assert task_digest(d) != second
    (d / "tests" / "test.sh").rename(d / "tests" / "check.sh")
    assert task_digest(d) not in (first, second)


def test_task_tar_is_deterministic(tmp_path: Path) -> None:
    a = make_task(tmp_path / "a", FULL)
    b = make_task(tmp_path / "b", FULL)
    os.utime(b / "instruction.md", (1, 1))
    assert task_tar(a) == task_tar(b)


def test_dockerfile_found(tmp_path: Path) -> None:
    d = make_task(tmp_path / "df", "")
    (d / "environment").mkdir()
    (d / "environment" / "Dockerfile").write_text("FROM debian:bookworm\n")
    assert load_task(d).dockerfile == d / "environment" / "Dockerfile"


def test_symlinks_out_of_the_task_are_refused(tmp_path: Path) -> None:
    d = make_task(tmp_path / "leak", "")
    (d / "instruction.md").unlink()
    (d / "instruction.md").symlink_to("/etc/passwd")
    with pytest.raises(TaskError, match="outside the task directory"):
        load_task(d)
    inside = make_task(tmp_path / "ok", "")
    (inside / "tests" / "alias.sh").symlink_to("test.sh")
    assert load_task(inside).digest.startswith("sha256:")
