"""Conformance checks of exec: results, streams, the output cap, and the environment an
exec sees (the same on every backend)."""

from __future__ import annotations

from rollbox.backends.base import SandboxHandle
from rollbox.backends.conformance.harness import Harness, check, sh
from rollbox.errors import (
    InvalidInputError,
    RollboxError,
)
from rollbox.models import Limits


async def exec_basics(t: Harness) -> None:
    """exit code, stdout/stderr, stdin, cwd, env, user, streaming, output cap."""
    h = await t.create(env={"SPEC_VAR": "spec"}, limits=Limits(output_bytes=1000))
    r = await h.exec(["/bin/sh", "-c", "echo out; echo err >&2; exit 7"])
    check((r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n"), f"basic exec: {r}")
    r = await h.exec(["cat"], stdin=b"from stdin")
    check(r.stdout == "from stdin", f"stdin not passed: {r.stdout!r}")
    r = await h.exec("pwd; echo $SPEC_VAR $EXEC_VAR", cwd="/tmp", env={"EXEC_VAR": "x"})
    check(r.stdout == "/tmp\nspec x\n", f"cwd/env: {r.stdout!r}")
    r = await h.exec(["id", "-u"], user="1000")
    check(r.stdout.strip() == "1000", f"user: {r.stdout!r}")
    chunks: list[str] = []
    r = await h.exec("echo a; sleep 0.1; echo b", on_stdout=chunks.append)
    check("".join(chunks) == "a\nb\n" and r.stdout == "a\nb\n", f"streaming: {chunks}")
    r = await h.exec("head -c 5000 /dev/zero | tr '\\0' x")
    check(r.truncated and len(r.stdout) == 1000, f"cap: {len(r.stdout)} {r.truncated}")
    r = await h.exec(["/no/such/program"])
    check(r.exit_code == 127, f"missing program exit {r.exit_code}")
    r = await h.exec("kill -9 $$")
    check(r.exit_code == 137, f"signal exit {r.exit_code}")


EXEC_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The default ``PATH`` of an exec, pinned here (not imported from the helper), so a change
there shows up as a failure."""
BACKEND_ENV_EXTRAS: dict[str, frozenset[str]] = {
    # the statx shim every gVisor exec preloads (gvisor STATX_SHIM: runsc 20221219's statx)
    "gvisor": frozenset({"LD_PRELOAD"}),
}
"""Variables a backend adds for its own plumbing; they are left out of the comparison."""


async def _exec_view(h: SandboxHandle, **kwargs: object) -> tuple[dict[str, str], str, str]:
    """(environment, ``uid gid``, cwd) an exec with ``kwargs`` sees."""
    r = await h.exec(["env", "-0"], **kwargs)  # type: ignore[arg-type]
    check(r.exit_code == 0, f"env exited {r.exit_code}: {r.stderr.strip()[-300:]}")
    env = dict(item.partition("=")[::2] for item in r.stdout.split("\0") if item)
    for key in BACKEND_ENV_EXTRAS.get(h.info.backend, frozenset()):
        env.pop(key, None)
    ids = await sh(h, "echo $(id -u) $(id -g); pwd -P", **kwargs)
    who, _, cwd = ids.strip().partition("\n")
    return env, who, cwd


def _passwd_home(passwd: str, user: str) -> tuple[str, str] | None:
    """(``uid gid``, home) of ``user`` (a name or a uid) in ``passwd``."""
    for line in passwd.splitlines():
        f = line.split(":")
        if len(f) >= 7 and (f[0] == user or f[2] == user):
            return f"{f[2]} {f[3]}", f[5] or "/"
    return None


async def exec_environment(t: Harness) -> None:
    """The environment, user and cwd an exec sees are the same on every backend:
    ``PATH``/``HOME``/``HOSTNAME`` defaults < image ``ENV`` < sandbox env < exec env <
    secrets, nothing else (no ``USER``/``LOGNAME`` unless set); ``HOME`` from the user's
    ``/etc/passwd`` entry (``/root`` for root, ``/`` for an unknown uid); cwd normalised,
    relative to ``/``; ``timeout <= 0`` refused."""
    h = await t.create(hostname="rbx-envcheck", env={"SPEC_ONLY": "s", "OVER": "spec"})
    image = dict(item.partition("=")[::2] for item in t.baseline.config.env if "=" in item)
    expect = {"PATH": EXEC_PATH, "HOME": "/root", "HOSTNAME": "rbx-envcheck", **image}
    expect |= {"SPEC_ONLY": "s", "OVER": "spec"}
    image_cwd = "/" + t.baseline.config.workdir.strip("/") if t.baseline.config.workdir else "/"
    env, who, cwd = await _exec_view(h)
    check(env == expect, f"root's environment: {env} != {expect}")
    check((who, cwd) == ("0 0", image_cwd), f"root: ids/cwd {who!r} {cwd!r}")
    for name in ("USER", "LOGNAME"):
        check(name in image or name not in env, f"{name} set by the backend: {env.get(name)!r}")
    # exec env over sandbox env, secrets over both (and masked in what the exec prints)
    env, _, _ = await _exec_view(
        h, env={"OVER": "exec", "EXEC_ONLY": "e", "SEC": "plain"}, secrets={"SEC": "hidden"}
    )
    want = expect | {"OVER": "exec", "EXEC_ONLY": "e", "SEC": "***"}
    check(env == want, f"exec env/secrets precedence: {env} != {want}")
    env, _, _ = await _exec_view(h, env={"HOSTNAME": "mine", "HOME": "/h", "PATH": "/bin"})
    check(
        (env["HOSTNAME"], env["HOME"], env["PATH"]) == ("mine", "/h", "/bin"),
        f"exec env does not override the defaults: {env}",
    )
    # users: HOME from /etc/passwd; a uid without an entry gets "/"
    passwd = (await h.read_file("/etc/passwd")).decode(errors="replace")
    unknown = next(str(u) for u in range(4242, 5000) if _passwd_home(passwd, str(u)) is None)
    named = next(
        (line.split(":")[0] for line in passwd.splitlines() if line.startswith("nobody:")),
        None,
    )
    cases = [(unknown, (f"{unknown} {unknown}", "/"))]
    if named is not None:
        found = _passwd_home(passwd, named)
        assert found is not None
        cases.append((named, found))
    for user, (ids, home) in cases:
        env, who, _ = await _exec_view(h, user=user)
        check(who == ids, f"user {user!r}: ids {who!r}, expected {ids!r}")
        check(env == expect | {"HOME": home}, f"user {user!r}: {env} != HOME {home!r}")
    # cwd: relative to /, lexically normalised
    for asked, want_cwd in (("/tmp", "/tmp"), ("tmp", "/tmp"), ("/tmp/../var/./", "/var")):
        _, _, cwd = await _exec_view(h, cwd=asked)
        check(cwd == want_cwd, f"cwd {asked!r} -> {cwd!r}, expected {want_cwd!r}")
    for bad in (0, -1.0):
        try:
            await h.exec("true", timeout=bad)
        except InvalidInputError:
            continue
        except RollboxError as exc:  # e.g. run, then "timed out after 0s"
            raise AssertionError(f"timeout={bad} was accepted: {exc}") from exc
        raise AssertionError(f"timeout={bad} was accepted")
