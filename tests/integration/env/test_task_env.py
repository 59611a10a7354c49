"""TaskEnv on real namespace sandboxes: the repo's example tasks solved and failed by scripted
policies, episodes recorded and verifiable, forks independent, bad input refused, nothing
left on the host."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from rollbox.config import Home
from rollbox.env import (
    AsyncTaskEnv,
    EnvClosedError,
    EpisodeDoneError,
    InvalidActionError,
    NoEpisodeError,
    TaskEnv,
    UnknownToolError,
    batch,
)
from rollbox.hoststate import HostState
from rollbox.models import RolloutRecord
from rollbox.store.metadata import MetaStore

pytestmark = [pytest.mark.root]

TASKS = Path(__file__).resolve().parents[3] / "examples" / "tasks"
HELLO = TASKS / "hello-file"
SUM = TASKS / "sum-numbers-separate"


def rollbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollbox.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def stored(home: Home, run_id: str) -> list[RolloutRecord]:
    with MetaStore(home=home) as meta:
        return meta.rollouts_of(run_id)


def leftovers(home: Home, before: HostState, records: list[RolloutRecord]) -> dict[str, list[str]]:
    """Host resources (mounts, cgroups, processes, sandbox dirs) naming these sandboxes."""
    ids = {s for r in records for s in r.sandbox_ids}
    assert ids, "the records name no sandboxes"
    out: dict[str, list[str]] = {}
    for kind, items in before.diff(HostState.capture(home.sandboxes)).items():
        mine = [i for i in items if any(x in i for x in ids)]
        if mine:
            out[kind] = mine
    for sid in ids:
        if (home.sandboxes / sid).exists():
            out.setdefault("sandbox_dirs", []).append(sid)
    return out


def test_solve_then_wrong_recorded_and_verifiable(linked_home: Home) -> None:
    before = HostState.capture(linked_home.sandboxes)
    with TaskEnv.create(HELLO, caller="scripted") as env:
        obs = env.reset()
        assert "/app/hello.txt" in obs.text
        r = env.step("echo hi && ls -d /app")
        assert (r.observation.exit_code, r.observation.stdout, r.done) == (0, "hi\n/app\n", False)
        env.step({"tool": "write_file", "path": "/app/hello.txt", "content": "Hello, rollbox!\n"})
        assert env.step({"tool": "read_file", "path": "/app/hello.txt"}).observation.text == (
            "Hello, rollbox!\n"
        )
        missing = env.step({"tool": "read_file", "path": "/app/nope"})
        assert missing.info["error"] and missing.observation.text.startswith("error:")
        win = env.step({"tool": "submit"})
        assert (win.reward, win.done, win.info["passed"]) == (1.0, True, True)

        env.reset()  # second episode: a wrong policy
        env.step({"tool": "bash", "command": "echo 'Hello, world' > /app/hello.txt"})
        lose = env.step({"tool": "submit"})
        assert (lose.reward, lose.done, lose.info["passed"]) == (0.0, True, False)
        run_id = env.run.id
    recs = {r.id: r for r in stored(linked_home, run_id)}
    assert set(recs) == {win.info["rollout_id"], lose.info["rollout_id"]}
    first = recs[win.info["rollout_id"]]
    assert first.agent == "env:scripted" and first.status == "done"
    assert first.extra["verifier_isolation"] == "private"
    assert first.sandbox_ids[0] not in recs[lose.info["rollout_id"]].sandbox_ids
    assert first.trajectory is not None
    steps = json.loads((linked_home.blobs / "sha256" / first.trajectory.digest[7:9]
                        / first.trajectory.digest[7:]).read_bytes())  # fmt: skip
    assert [s["tool"] for s in steps] == [
        "bash", "write_file", "read_file", "read_file", "submit",
    ]  # fmt: skip
    assert any(c.path == "/app/hello.txt" for c in first.fs_diff)

    ok = rollbox("verify", run_id, "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"], ok.stdout + ok.stderr
    # one stored field edited: the reward of the losing episode
    rid = lose.info["rollout_id"]
    with sqlite3.connect(linked_home.db_path) as db:
        (doc,) = db.execute("SELECT doc FROM rollouts WHERE id = ?", (rid,)).fetchone()
        rec = json.loads(doc)
        rec["verifier"]["reward"] = 1.0
        db.execute("UPDATE rollouts SET doc = ? WHERE id = ?", (json.dumps(rec), rid))
    bad = rollbox("verify", run_id, "--json")
    assert bad.returncode == 1
    assert any(rid in p for p in json.loads(bad.stdout)["problems"]), bad.stdout
    assert leftovers(linked_home, before, list(recs.values())) == {}


def test_separate_verifier_and_a_forged_reward(linked_home: Home) -> None:
    async def main() -> tuple[float | None, float | None, str]:
        async with await AsyncTaskEnv.create(SUM) as env:
            await env.reset()
            await env.step("seq 1 100 > /app/numbers.txt")
            # the agent writes the reward itself and never solves: it must not count
            await env.step("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt")
            forged = await env.verify()
            await env.reset()
            await env.step("seq 1 100 > /app/numbers.txt")
            await env.step("python3 -c 'print(sum(range(101)))' > /app/sum.txt")
            solved = await env.step({"tool": "submit"})
            return forged.reward, solved.reward, env.run.id

    forged, solved, run_id = asyncio.run(main())
    assert forged == 0.0 and solved == 1.0
    recs = stored(linked_home, run_id)
    assert {r.extra["verifier_mode"] for r in recs} == {"separate"}
    assert all(len(r.sandbox_ids) == 2 for r in recs)  # agent's sandbox + the verifier's


def test_fork_branches_are_independent(linked_home: Home) -> None:
    before = HostState.capture(linked_home.sandboxes)

    async def main() -> list[str]:
        env = await AsyncTaskEnv.create(HELLO)
        await env.reset()
        await env.step("echo shared > /app/base.txt")
        a, b = await env.fork(2)
        try:
            await a.step("echo only-a > /app/a.txt")
            seen_b = await b.step("cat /app/base.txt; ls /app")
            assert seen_b.observation.stdout.split() == ["shared", "base.txt"]
            assert (await env.step("ls /app")).observation.stdout.split() == ["base.txt"]
            assert (await a.step("cat /app/a.txt")).observation.stdout == "only-a\n"
            await b.step("echo 'Hello, rollbox!' > /app/hello.txt")
            ra, rb = await a.step({"tool": "submit"}), await b.step({"tool": "submit"})
            assert (ra.reward, rb.reward) == (0.0, 1.0)
            ids = [env.run.id, a.run.id, b.run.id]
            assert len(set(ids)) == 3 and ra.info["rollout_id"] != rb.info["rollout_id"]
        finally:
            for e in (a, b, env):
                await e.close()
        return ids

    run_ids = asyncio.run(main())
    parent, *branches = (stored(linked_home, r) for r in run_ids)
    assert parent[0].status == "interrupted"  # closed mid-episode
    for (rec,) in branches:
        assert rec.extra["env_fork_of_run"] == run_ids[0]
        assert rec.extra["env_fork"] == "filesystem"
        assert rec.baseline_digest != parent[0].baseline_digest
    for r in run_ids:
        assert rollbox("verify", r).returncode == 0
    every = [r for rs in (parent, *branches) for r in rs]
    assert leftovers(linked_home, before, every) == {}


def test_bad_input_leaves_the_episode_consistent(linked_home: Home) -> None:
    before = HostState.capture(linked_home.sandboxes)
    env = TaskEnv.create(HELLO)
    with pytest.raises(NoEpisodeError, match="call reset"):
        env.step("ls")
    env.reset()
    env.step("echo kept > /app/state.txt")
    with pytest.raises(UnknownToolError, match="unknown tool 'python'"):
        env.step({"tool": "python", "code": "1"})
    with pytest.raises(InvalidActionError, match="'command'"):
        env.step({"tool": "bash"})
    with pytest.raises(InvalidActionError, match="got NoneType"):
        env.step(None)  # type: ignore[arg-type]
    with TaskEnv.create(HELLO) as fresh, pytest.raises(NoEpisodeError):
        fresh.verify()
    # the episode goes on as if the bad actions never happened
    assert env.step("cat /app/state.txt").observation.stdout == "kept\n"
    old = env.aio.sandbox.id
    env.reset()  # a second reset abandons the running episode: its sandbox is gone
    assert not (linked_home.sandboxes / old).exists()
    assert env.step("ls /app/state.txt").observation.exit_code != 0
    env.step({"tool": "submit"})
    with pytest.raises(EpisodeDoneError, match="reset"):
        env.step("ls")
    with pytest.raises(EpisodeDoneError):
        env.verify()
    env.close()
    env.close()  # idempotent
    for call in (env.reset, lambda: env.step("ls"), lambda: env.fork(1)):
        with pytest.raises(EnvClosedError, match="closed"):
            call()
    recs = stored(linked_home, env.run.id)
    assert sorted(r.status for r in recs) == ["done", "interrupted"]
    assert leftovers(linked_home, before, recs) == {}


def test_batch(linked_home: Home) -> None:
    before = HostState.capture(linked_home.sandboxes)

    async def main() -> list[str]:
        envs = await batch([HELLO, SUM], n=2, concurrency=2)
        try:
            assert [e.task.name for e in envs] == ["hello-file"] * 2 + ["sum-numbers-separate"] * 2
            assert len({e.sandbox.id for e in envs}) == 4
            assert all(e.last_observation and e.last_observation.text for e in envs)
        finally:
            await asyncio.gather(*(e.close() for e in envs))
        return [e.run.id for e in envs]

    run_ids = asyncio.run(main())
    recs = [r for rid in run_ids for r in stored(linked_home, rid)]
    assert len(recs) == 4
    assert leftovers(linked_home, before, recs) == {}
    with pytest.raises(ValueError, match="n >= 1"):
        asyncio.run(batch([HELLO], n=0))


FORGED = Path(__file__).resolve().parents[1] / "rollouts" / "verifier_tasks" / "forged-writer"
FORGER = (FORGED / "solution" / "solve.sh").read_text()


@pytest.mark.parametrize("guard", [True, False])
def test_forged_reward_does_not_count(
    linked_home: Home, monkeypatch: pytest.MonkeyPatch, guard: bool
) -> None:
    """A detached loop the agent leaves rewrites reward.txt and test.sh writes none: through
    the env's verifier it counts for nothing; with the verifier's guard switched off (the
    deliberately broken target) the forged 1 wins."""
    from rollbox.rollouts import verifier_exec

    monkeypatch.setattr(verifier_exec, "PROTECT", guard)
    with TaskEnv.create(FORGED) as env:
        env.reset()
        env.step(FORGER)
        result = env.step({"tool": "submit"})
    if guard:
        assert result.reward is None and "wrote no reward" in result.info["verifier_error"]
    else:
        assert result.reward == 1.0, result


@pytest.mark.vm
def test_fork_on_microvm_carries_memory(linked_home: Home) -> None:
    """A process the episode left running is running in each microVM branch (memory fork);
    files written in one branch are absent in the other."""

    async def main() -> list[str]:
        env = await AsyncTaskEnv.create(HELLO, backend="microvm")
        await env.reset()
        await env.step("(setsid sleep 600 >/dev/null 2>&1 &); echo base > /app/base.txt")
        a, b = await env.fork(2)
        try:
            for br in (a, b):
                ps = await br.step("pgrep -x sleep >/dev/null && echo alive; cat /app/base.txt")
                assert ps.observation.stdout.split() == ["alive", "base"]
            await a.step("echo 'Hello, rollbox!' > /app/hello.txt")
            assert (await b.step("ls /app")).observation.stdout.split() == ["base.txt"]
            ra, rb = await a.step({"tool": "submit"}), await b.step({"tool": "submit"})
            assert (ra.reward, rb.reward) == (1.0, 0.0)
        finally:
            for e in (a, b, env):
                await e.close()
        return [a.run.id, b.run.id]

    for run_id in asyncio.run(main()):
        (rec,) = stored(linked_home, run_id)
        assert rec.extra["env_fork"] == "memory" and rec.status == "done"
        assert rollbox("verify", run_id).returncode == 0
