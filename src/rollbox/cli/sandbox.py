"""``rollbox sandbox …``: create, exec, cp, snapshot, fork, pause, resume, rm, ls.

A sandbox created here is detached: it has no owner process and lives until ``rm`` or its
TTL, so later commands (other processes) re-attach to it by id.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import typer
from pydantic import ValidationError

from rollbox.backends.base import Backend, MemorySnapshots, SandboxHandle, memory_snapshots
from rollbox.backends.registry import new_backend
from rollbox.backends.state import list_states, read_state
from rollbox.cli import validate
from rollbox.cli.output import JSON_OPTION, emit
from rollbox.config import Home
from rollbox.errors import ExecTimeoutError, InvalidInputError, LimitsError
from rollbox.models import Limits, SandboxInfo, SandboxSpec, utcnow

app = typer.Typer(help="Create and use sandboxes.", no_args_is_help=True)

T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        k, sep, val = v.partition("=")
        if not sep or not k:
            raise InvalidInputError(f"bad {what} {v!r}", hint="use KEY=VALUE")
        out[k] = val
    return out


def _detached_backend(name: str, home: Home) -> Backend:
    """A private backend instance whose sandboxes (and forks) have no owner process: they
    outlive this CLI process. Not the registry's shared instance, so library sandboxes made
    in the same process keep their owner."""
    return new_backend(name, home, detached=True)


def _backend_for(home: Home, sandbox_id: str) -> tuple[Backend, SandboxInfo]:
    info = read_state(home, sandbox_id)
    be = _detached_backend(info.backend, home)
    return be, info


async def _attach(home: Home, sandbox_id: str) -> SandboxHandle:
    be, _ = _backend_for(home, sandbox_id)
    return await be.attach(sandbox_id)


@app.command("create")
def create_cmd(
    baseline: str | None = typer.Option(None, "--baseline", help="Digest, prefix or name."),
    backend: str | None = typer.Option(
        None, "--backend", help="namespace (default), gvisor, microvm."
    ),
    from_snapshot: str | None = typer.Option(
        None, "--from-snapshot", help="Restore a memory snapshot (snap-...; microvm)."
    ),
    cpus: float | None = typer.Option(
        None, "--cpus", help="CPU quota in cores.", callback=validate.cpus()
    ),
    memory_mb: int | None = typer.Option(
        None,
        "--memory-mb",
        help="Memory limit (MiB).",
        callback=validate.limit("--memory-mb", "memory_mb"),
    ),
    pids: int | None = typer.Option(
        None, "--pids", help="Process limit.", callback=validate.limit("--pids", "pids")
    ),
    disk_mb: int | None = typer.Option(
        None, "--disk-mb", help="Disk limit (MiB).", callback=validate.limit("--disk-mb", "disk_mb")
    ),
    network: str = typer.Option("none", "--network", help="none | loopback | allow=H:P,..."),
    env: list[str] = typer.Option([], "--env", help="KEY=VALUE (repeatable)."),
    label: list[str] = typer.Option([], "--label", help="KEY=VALUE (repeatable)."),
    ttl: float | None = typer.Option(
        None, "--ttl", help="Seconds until auto-destroy.", callback=validate.ttl()
    ),
    hostname: str = typer.Option("sandbox", "--hostname", help="Hostname inside."),
    workdir: str | None = typer.Option(None, "--workdir", help="Default working directory."),
    user: str | None = typer.Option(None, "--user", help="Default user inside."),
    json_: bool = JSON_OPTION,
) -> None:
    """Create a detached sandbox (lives until `rm` or its TTL); prints its id."""
    from rollbox.baselines.store import BaselineStore
    from rollbox.sandbox import parse_network

    home = Home.from_env().ensure()
    try:
        base = Limits()
        limits = Limits(
            cpus=cpus if cpus is not None else base.cpus,
            memory_mb=memory_mb if memory_mb is not None else base.memory_mb,
            pids=pids if pids is not None else base.pids,
            disk_mb=disk_mb if disk_mb is not None else base.disk_mb,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise LimitsError(f"bad limit {where}: {first['msg']}") from None
    if ttl is not None and ttl <= 0:
        raise InvalidInputError("--ttl must be > 0")
    backend = backend or ("microvm" if from_snapshot else "namespace")
    be = _detached_backend(backend, home)
    policy = parse_network(network)
    store = BaselineStore(home)
    if from_snapshot:
        if baseline is not None:
            raise InvalidInputError(
                "--from-snapshot restores the snapshot's own baseline; drop --baseline"
            )
        baseline = memory_snapshots(be).load_snapshot(from_snapshot).baseline
    info = store.default() if baseline is None else store.resolve(baseline)
    spec = SandboxSpec(
        baseline=info.digest,
        backend=backend,
        limits=limits,
        network=policy,
        env=_pairs(env, "--env"),
        labels=_pairs(label, "--label"),
        ttl_s=ttl,
        hostname=hostname,
        workdir=workdir,
        user=user,
        from_snapshot=from_snapshot,
    )
    be.check(spec)
    be.prepare()
    handle = _run(be.create(spec, info))
    emit(handle.info, json_, handle.id)


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_cmd(
    sandbox_id: str = typer.Argument(..., help="Sandbox id."),
    cmd: list[str] = typer.Argument(..., help="Command and arguments (after --)."),
    timeout: float | None = typer.Option(
        None, "--timeout", help="Seconds.", callback=validate.seconds("--timeout")
    ),
    env: list[str] = typer.Option([], "--env", help="KEY=VALUE (repeatable)."),
    workdir: str | None = typer.Option(None, "--workdir", help="Working directory."),
    user: str | None = typer.Option(None, "--user", help="User inside."),
    json_: bool = JSON_OPTION,
) -> None:
    """Run a command; streams its output and exits with its exit code (124 on timeout)."""
    home = Home.from_env()
    if not cmd:
        raise InvalidInputError("no command given", hint="rollbox sandbox exec ID -- CMD ...")

    def out(chunk: str) -> None:
        sys.stdout.write(chunk)
        sys.stdout.flush()

    def err(chunk: str) -> None:
        sys.stderr.write(chunk)
        sys.stderr.flush()

    async def go() -> int:
        h = await _attach(home, sandbox_id)
        try:
            r = await h.exec(
                cmd,
                cwd=workdir,
                env=_pairs(env, "--env"),
                timeout=timeout,
                user=user,
                on_stdout=None if json_ else out,
                on_stderr=None if json_ else err,
            )
        except ExecTimeoutError as exc:
            if json_:
                emit({"error": exc.one_line(), "type": "ExecTimeoutError", "exit_code": 124}, True)
            else:
                sys.stderr.write(f"error: {exc.one_line()}\n")
            return 124
        if json_:
            emit(r, True)
        return r.exit_code

    raise typer.Exit(_run(go()))


def _split(arg: str) -> tuple[str | None, str]:
    head, sep, tail = arg.partition(":")
    if sep and head.startswith("sbx-"):
        return head, tail
    return None, arg


@app.command("cp")
def cp_cmd(
    src: str = typer.Argument(..., help="Host path or ID:/path."),
    dest: str = typer.Argument(..., help="Host path or ID:/path."),
    links: str | None = typer.Option(
        None,
        "--links",
        help="Downloads of a tree: a symlink pointing out of the tree is 'refuse'd "
        "(default) or replaced by its 'content'. Links into the tree stay links.",
    ),
    json_: bool = JSON_OPTION,
) -> None:
    """Copy files or trees between the host and a sandbox (`ID:/path` on one side).

    Paths inside resolve as if chrooted in the sandbox: a link to a file inside is
    followed there, never to a host path."""
    from rollbox.backends.common.copylinks import LINK_POLICIES, LinkPolicy

    home = Home.from_env()
    s_id, s_path = _split(src)
    d_id, d_path = _split(dest)
    if (s_id is None) == (d_id is None):
        raise InvalidInputError("exactly one of SRC and DEST must be ID:/path")
    if links is not None and links not in LINK_POLICIES:
        raise InvalidInputError(f"--links must be one of {', '.join(LINK_POLICIES)}, not {links!r}")
    if links is not None and s_id is None:
        raise InvalidInputError("--links applies to downloads (SRC is ID:/path)")
    policy: LinkPolicy = "content" if links == "content" else "refuse"

    async def go() -> None:
        if s_id is not None:
            h = await _attach(home, s_id)
            await h.download(s_path, Path(d_path), links=policy)
        else:
            assert d_id is not None
            h = await _attach(home, d_id)
            await h.upload(Path(s_path), d_path)

    _run(go())
    emit({"src": src, "dest": dest}, json_, f"copied {src} -> {dest}")


@app.command("snapshot")
def snapshot_cmd(
    sandbox_id: str = typer.Argument(..., help="Sandbox id."),
    name: str | None = typer.Option(None, "--name", help="Name for the new baseline."),
    memory: bool = typer.Option(
        False, "--memory", help="Also save memory and devices (microvm): prints a snap- id."
    ),
    json_: bool = JSON_OPTION,
) -> None:
    """Turn the sandbox's filesystem changes into a new baseline (it keeps running); with
    --memory, a memory snapshot that `create --from-snapshot` restores."""
    home = Home.from_env()
    if memory and name is not None:
        raise InvalidInputError("--name names a filesystem baseline; drop it with --memory")

    async def go() -> str:
        h = await _attach(home, sandbox_id)
        if memory:
            _backend_for(home, sandbox_id)[0].require("memory_snapshot")
            return await h.snapshot_memory()
        return await h.snapshot(name=name)

    ref = _run(go())
    if memory:
        emit({"snapshot": ref, "sandbox": sandbox_id}, json_, ref)
    else:
        emit({"digest": ref, "sandbox": sandbox_id, "name": name}, json_, ref)


def _memory_backend(home: Home) -> MemorySnapshots:
    """The backend that keeps memory snapshots (microvm), through the registry."""
    return memory_snapshots(new_backend("microvm", home))


@app.command("snapshots")
def snapshots_cmd(json_: bool = JSON_OPTION) -> None:
    """List memory snapshots (microvm)."""
    home = Home.from_env()
    records = _memory_backend(home).list_snapshots()

    def human() -> None:
        if not records:
            print("no memory snapshots")
        for r in records:
            kind = "fork" if r.ephemeral else "user"
            print(f"{r.id}  {kind}  from {r.source}  baseline {r.baseline[:19]}  {r.layout}")

    emit([r.model_dump(mode="json") for r in records], json_, human)


@app.command("snapshot-rm")
def snapshot_rm_cmd(
    snapshot_id: str = typer.Argument(..., help="Memory snapshot id (snap-...)."),
    json_: bool = JSON_OPTION,
) -> None:
    """Delete a memory snapshot (refused while a sandbox or snapshot stacks on it)."""
    home = Home.from_env()
    _memory_backend(home).remove_snapshot(snapshot_id)
    emit({"removed": snapshot_id}, json_, f"removed {snapshot_id}")


@app.command("fork")
def fork_cmd(
    sandbox_id: str = typer.Argument(..., help="Sandbox id."),
    n: int = typer.Option(
        1, "-n", help="How many forks.", callback=validate.int_range("-n", 1, validate.MAX_FORKS)
    ),
    json_: bool = JSON_OPTION,
) -> None:
    """Make N independent detached sandboxes from the sandbox's current state."""
    home = Home.from_env()
    if n < 1:
        raise InvalidInputError("-n must be >= 1")

    async def go() -> list[SandboxHandle]:
        _backend_for(home, sandbox_id)[0].require("fork")
        return await (await _attach(home, sandbox_id)).fork(n)

    handles = _run(go())
    emit([h.info for h in handles], json_, "\n".join(h.id for h in handles))


@app.command("pause")
def pause_cmd(sandbox_id: str = typer.Argument(...), json_: bool = JSON_OPTION) -> None:
    """Freeze every process in the sandbox."""
    home = Home.from_env()

    async def go() -> None:
        _backend_for(home, sandbox_id)[0].require("pause")
        await (await _attach(home, sandbox_id)).pause()

    _run(go())
    emit({"id": sandbox_id, "state": "paused"}, json_, f"paused {sandbox_id}")


@app.command("resume")
def resume_cmd(sandbox_id: str = typer.Argument(...), json_: bool = JSON_OPTION) -> None:
    """Thaw a paused sandbox."""
    home = Home.from_env()

    async def go() -> None:
        await (await _attach(home, sandbox_id)).resume()

    _run(go())
    emit({"id": sandbox_id, "state": "running"}, json_, f"resumed {sandbox_id}")


@app.command("rm")
def rm_cmd(
    sandbox_ids: list[str] = typer.Argument(None, help="Sandbox ids."),
    all_: bool = typer.Option(False, "--all", help="Remove every sandbox of this home."),
    json_: bool = JSON_OPTION,
) -> None:
    """Destroy sandboxes (idempotent per sandbox; an unknown id is an error)."""
    home = Home.from_env()
    ids = [i.id for i in list_states(home)] if all_ else list(sandbox_ids or [])
    if not ids and not all_:
        raise InvalidInputError("name sandbox ids or use --all")
    for sid in ids:
        read_state(home, sid)  # unknown id: one clear error before anything is removed

    async def go() -> None:
        for sid in ids:
            be, _ = _backend_for(home, sid)
            await asyncio.to_thread(be.destroy_by_id, sid)

    _run(go())
    emit({"removed": ids}, json_, "\n".join(f"removed {i}" for i in ids) or "nothing to remove")


def _age(info: SandboxInfo) -> str:
    secs = int((utcnow() - info.created_at).total_seconds())
    return f"{secs // 3600}h{secs % 3600 // 60:02d}m" if secs >= 3600 else f"{secs}s"


@app.command("ls")
def ls_cmd(json_: bool = JSON_OPTION) -> None:
    """List the sandboxes of this home."""
    home = Home.from_env()
    infos = list_states(home)

    def human() -> None:
        rows = [("ID", "BACKEND", "BASELINE", "STATE", "AGE", "TTL", "ACCEL", "LABELS")]
        for i in infos:
            ttl = "-"
            if i.expires_at is not None:
                ttl = f"{max(0, int((i.expires_at - utcnow()).total_seconds()))}s"
            rows.append(
                (
                    i.id,
                    i.backend,
                    i.baseline.removeprefix("sha256:")[:12],
                    i.state,
                    _age(i),
                    ttl,
                    i.accelerator or "-",
                    ",".join(f"{k}={v}" for k, v in i.spec.labels.items()) or "-",
                )
            )
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        for r in rows:
            print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())

    emit(infos, json_, human)
