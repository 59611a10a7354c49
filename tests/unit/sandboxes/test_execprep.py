"""The one exec preparation every backend uses (backends/common/execprep.py)."""

from __future__ import annotations

import math

import pytest

from rollbox.backends.common.execprep import (
    DEFAULT_PATH,
    map_exec_error,
    prepare_exec,
    resolve_user,
)
from rollbox.errors import BackendError, InvalidInputError, PathEscapeError
from rollbox.models import SandboxInfo, SandboxSpec, utcnow

PASSWD = "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\nbad:x:x:y::/b:\n"
GROUP = "root:x:0:\nstaff:x:50:alice\n"


def _info(extra: dict[str, object] | None = None, **spec: object) -> SandboxInfo:
    return SandboxInfo(
        id="sbx-1",
        backend="namespace",
        baseline="sha256:" + "a" * 64,
        spec=SandboxSpec(baseline="sha256:" + "a" * 64, **spec),  # type: ignore[arg-type]
        created_at=utcnow(),
        extra=extra or {},
    )


def test_defaults_for_root() -> None:
    p = prepare_exec(_info(hostname="box"), "echo hi")
    assert p.argv == ["/bin/sh", "-c", "echo hi"]
    assert p.env == {"PATH": DEFAULT_PATH, "HOME": "/root", "HOSTNAME": "box"}
    assert p.cwd == "/" and p.user.uid is None and p.timeout is None


def test_env_precedence() -> None:
    info = _info(
        {"image_env": ["HOSTNAME=img", "A=img", "B=img", "C=img", "NOEQUALS"]},
        hostname="box",
        env={"B": "spec", "C": "spec"},
    )
    p = prepare_exec(info, ["x"], env={"C": "exec", "S": "exec"}, secrets={"S": "sec"})
    # defaults < image ENV < sandbox env < exec env < secrets
    assert p.env["HOSTNAME"] == "img"
    assert (p.env["A"], p.env["B"], p.env["C"], p.env["S"]) == ("img", "spec", "exec", "sec")
    assert "NOEQUALS" not in p.env and p.secret_values == ["sec"]


@pytest.mark.parametrize("bad", [0, -1.0, math.nan])
def test_timeout_must_be_positive(bad: float) -> None:
    with pytest.raises(InvalidInputError, match="timeout must be > 0"):
        prepare_exec(_info(), "true", timeout=bad)


def test_user_precedence_and_home() -> None:
    info = _info({"image_user": "alice", "image_workdir": "/srv/./app"})
    p = prepare_exec(info, "id", passwd=PASSWD)
    assert (p.user.uid, p.user.gid, p.env["HOME"], p.cwd) == (1000, 1000, "/home/alice", "/srv/app")
    p = prepare_exec(info, "id", user="root")
    assert p.user.uid is None and p.env["HOME"] == "/root"
    spec_user = _info({"image_user": "alice"}, user="0")
    assert prepare_exec(spec_user, "id").env["HOME"] == "/root"


def test_resolve_user_forms() -> None:
    assert resolve_user("1000", PASSWD).home == "/home/alice"
    assert (resolve_user("4242", PASSWD).uid, resolve_user("4242", None).home) == (4242, "/")
    assert resolve_user("alice:7", PASSWD).gid == 7
    assert resolve_user("alice:staff", PASSWD, GROUP).gid == 50
    with pytest.raises(InvalidInputError, match="no user 'bob'"):
        resolve_user("bob", PASSWD)
    with pytest.raises(InvalidInputError, match="no group 'wheel'"):
        resolve_user("alice:wheel", PASSWD, GROUP)
    with pytest.raises(InvalidInputError, match="no user 'bad'"):
        resolve_user("bad", PASSWD)  # a malformed entry is skipped, not a crash


def test_cwd_normalised_and_checked() -> None:
    assert prepare_exec(_info(), "x", cwd="tmp/../work").cwd == "/work"
    with pytest.raises(PathEscapeError):
        prepare_exec(_info(), "x", cwd="/..")
    with pytest.raises(InvalidInputError):
        prepare_exec(_info(), [])


def test_map_exec_error() -> None:
    p = prepare_exec(_info(), "x", cwd="/nope", user="4242")
    chdir = map_exec_error("chdir", "ENOENT", sandbox_id="sbx-1", prepared=p)
    assert isinstance(chdir, InvalidInputError) and "'/nope'" in str(chdir)
    user = map_exec_error("user", "EPERM", sandbox_id="sbx-1", prepared=p)
    assert isinstance(user, InvalidInputError) and "'4242'" in str(user)
    for stage in ("cgroup", "private mounts", "restrict", "agent"):
        err = map_exec_error(stage, "boom", sandbox_id="sbx-1", prepared=p)
        assert isinstance(err, BackendError) and "sbx-1" in str(err)
    assert map_exec_error(None, "", sandbox_id="sbx-1", prepared=p) is None
    assert map_exec_error("exec", "ENOENT", sandbox_id="sbx-1", prepared=p) is None
