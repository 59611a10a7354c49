"""Shared-mode verifier integrity on real sandboxes: forged rewards do not count.

The adversarial tasks live in ``verifier_tasks/`` (example-style Harbor tasks; kept out of
``examples/tasks`` because ``make demo`` expects every example to pass):

* ``forged-prewritten`` — the agent writes ``reward.txt``/``reward.json`` = 1 in advance;
* ``forged-writer`` — it leaves a ``setsid`` loop rewriting ``reward.txt``;
* ``forged-watcher`` — it leaves a watcher that rewrites ``/tests/test.sh`` in place once
  uploaded;
* ``forged-procroot`` — it leaves a loop writing the reward through ``/proc/PID/root`` of
  every process (the verifier's too, where the kernel allows it);

each with a ``tests/test.sh`` that never writes a passing reward. ``agent-server`` (the
tests query a server the agent left running) must still pass, and ``agent-leftover`` passes
only when ``[rollbox] stop_agent_before_verify = true`` killed what the agent left.

On gVisor (no private mount namespaces in runsc 20221219) shared mode stops the agent's
processes before the verifier by default (``verifier_isolation = "stopped-agent"``), so the
forgeries fail there too and ``agent-server`` needs ``stop_agent_before_verify = false``
(``-optout`` copies; recorded ``"none"``, counted as unprotected by the report, and only the
weaker path's tamper checks then fail the writer and the watcher). With the guard switched
off every forgery passes on every backend.
"""

from __future__ import annotations

import io
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from rollbox.models import RolloutRecord
from rollbox.rollouts import verifier_exec
from rollbox.rollouts.report import render, summarize
from rollbox.store.provenance import check

from .conftest import Runs

TASKS = Path(__file__).parent / "verifier_tasks"
FORGED = ["forged-prewritten", "forged-writer", "forged-watcher", "forged-procroot"]
BACKENDS = ["namespace", "gvisor", pytest.param("microvm", marks=pytest.mark.vm)]


def stopped(root: Path, name: str) -> Path:
    """A copy of task ``name`` with ``stop_agent_before_verify = true``."""
    d = root / f"{name}-stopped"
    shutil.copytree(TASKS / name, d)
    toml = d / "task.toml"
    text = toml.read_text().replace(f'name = "{name}"', f'name = "{name}-stopped"')
    toml.write_text(text + "\n[rollbox]\nstop_agent_before_verify = true\n")
    return d


def optout(root: Path, name: str) -> Path:
    """A copy of task ``name`` with ``stop_agent_before_verify = false`` set explicitly."""
    d = root / f"{name}-optout"
    shutil.copytree(TASKS / name, d)
    toml = d / "task.toml"
    text = toml.read_text().replace(f'name = "{name}"', f'name = "{name}-optout"')
    toml.write_text(text + "\n[rollbox]\nstop_agent_before_verify = false\n")
    return d


def separate(root: Path, name: str) -> Path:
    """A copy of task ``name`` whose verifier runs in a separate sandbox."""
    d = root / f"{name}-separate"
    shutil.copytree(TASKS / name, d)
    toml = d / "task.toml"
    text = toml.read_text().replace(f'name = "{name}"', f'name = "{name}-separate"')
    toml.write_text(text.replace("[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n'))
    return d


def final(recs: list[RolloutRecord]) -> dict[str, RolloutRecord]:
    return {r.task_name: r for r in recs if r.retried_by is None}


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_forged_rewards_do_not_pass_and_agent_servers_still_serve(
    runs: Runs,
    backend: str,
    tmp_path: Path,
    no_leaks: Callable[[list[RolloutRecord]], dict[str, list[str]]],
) -> None:
    dirs = [TASKS / n for n in [*FORGED, "agent-server", "agent-leftover"]]
    dirs += [TASKS / "verifier-writes-tests", TASKS / "verifier-timeout"]
    dirs += [stopped(tmp_path, n) for n in ["agent-server", "agent-leftover", *FORGED]]
    dirs.append(separate(tmp_path, "forged-prewritten"))
    dirs.append(optout(tmp_path, "agent-server"))
    private = backend != "gvisor"
    if not private:  # the weaker path's tamper checks, with the agent's processes alive
        dirs += [optout(tmp_path, n) for n in ["forged-writer", "forged-watcher"]]
    run, recs = runs.run(dirs, agent="oracle", backend_override=backend)
    by = final(recs)
    assert len(by) == (16 if private else 18), sorted(by)
    for name, r in by.items():
        assert r.verifier is not None, (name, r.error)
        if private:
            want = "private"
        elif name.endswith(("-optout", "-separate")):
            want = "none"
        else:
            want = "stopped-agent"
        assert r.extra.get("verifier_isolation") == want, name
        assert check(r, runs.blobs) == [], name

    # (a) a reward written in advance: not seen; test.sh wrote none -> verifier error
    pre = by["forged-prewritten"]
    assert pre.verifier is not None and pre.verifier.passed is None
    assert pre.status == "failed" and pre.error_kind == "verifier", pre.error
    assert "wrote no reward" in (pre.verifier.error or "") and "exited 3" in pre.verifier.error
    assert not [a for a in pre.artifacts if a.name.startswith("/logs/verifier/")]
    # the same in separate mode: the snapshot carries the forged file, the verifier never sees it
    sep = by["forged-prewritten-separate"]
    assert sep.verifier is not None and sep.verifier.mode == "separate"
    assert sep.verifier.passed is None and "wrote no reward" in (sep.verifier.error or "")
    # its planted program under /usr is listed, and the report counts it (and its copies')
    assert pre.suspicious_changes == ["/usr/local/bin/rbx-planted"]
    assert not by["agent-server"].suspicious_changes  # /srv is not a system path
    summary = summarize(run, recs)
    assert summary.suspicious_changes == 3 and summary.suspicious_rollouts == 3
    # shared-mode rollouts whose verifier ran beside the agent's live processes unisolated
    assert summary.unprotected_rollouts == (0 if private else 3)
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(render(summary))
    text = console.export_text()
    assert "system files changed" in text and "3 paths in 3 rollouts" in text
    assert re.search(rf"unprotected verifier\W+{summary.unprotected_rollouts} rollouts", text)
    # the field is sealed by the provenance digest: an edit is caught by `rollbox verify`
    edited = pre.model_copy(update={"suspicious_changes": []})
    assert check(edited, runs.blobs) != []

    for name in [*FORGED, *(f"{n}-stopped" for n in FORGED)]:
        v = by[name].verifier
        assert v is not None and not v.passed, (name, v)
        assert v.reward in (None, 0.0), (name, v.reward)
    w = by["forged-writer"].verifier
    c = by["forged-watcher"]
    assert w is not None and c.verifier is not None
    # (b) the writer's reward never reached the verifier (private dirs; on gVisor the writer
    # was stopped first): no reward at all
    assert "wrote no reward" in (w.error or ""), w
    # (c) the watcher never saw the tests (or was stopped): the original test.sh wrote 0
    assert c.verifier.reward == 0.0 and c.status == "done", c.verifier
    # (d) /proc/PID/root of the verifier's processes is refused to what the agent left
    proc = by["forged-procroot"].verifier
    assert proc is not None and "wrote no reward" in (proc.error or ""), proc
    if not private:
        # opted out on gVisor: the agent's processes run on, the tamper checks catch both
        wo, co = by["forged-writer-optout"].verifier, by["forged-watcher-optout"].verifier
        assert wo is not None and co is not None and not wo.passed and not co.passed
        assert "changed after the verifier ended" in (wo.error or ""), wo
        assert "/tests/test.sh changed while the verifier ran" in (co.error or ""), co

    # files the verifier itself adds under /tests (pytest's __pycache__) are no tampering
    own = by["verifier-writes-tests"]
    assert own.status == "done" and own.verifier is not None and own.verifier.passed, own
    # a verifier past its timeout: what it wrote to /logs/verifier is still kept
    slow = by["verifier-timeout"]
    assert slow.verifier is not None and slow.verifier.error == "verifier timed out after 2s"
    assert slow.verifier.duration_s is not None and slow.verifier.duration_s < 15
    logs = {a.name: runs.blobs.get(a.digest) for a in slow.artifacts}
    assert logs.get("/logs/verifier/progress.log") == b"started\n", sorted(logs)
    # a server the agent left running still answers the tests (Harbor's shared mode) ...
    srv = by["agent-server"]
    assert srv.status == "done" and srv.verifier is not None
    # (gVisor: only when the task opts out of the stop explicitly)
    assert srv.verifier.passed is private, srv.verifier
    out = by["agent-server-optout"]
    assert out.status == "done" and out.verifier is not None and out.verifier.passed, out
    # ... unless the task asks for the agent's processes to be stopped first
    srv_stopped = by["agent-server-stopped"].verifier
    assert srv_stopped is not None and not srv_stopped.passed
    # stop_agent_before_verify killed every tree the agent left (a sleeper and a fork loop)
    left = by["agent-leftover"].verifier
    assert left is not None and left.reward == (0.0 if private else 1.0)
    gone = by["agent-leftover-stopped"]
    assert gone.verifier is not None and gone.verifier.reward == 1.0, gone.verifier

    assert run.summary["cleanup"]["ok"] is True, run.summary["cleanup"]
    assert no_leaks(recs) == {}


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_without_the_guard_the_forged_rewards_would_pass(
    runs: Runs, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard is what stops them: with it switched off, every forgery counts."""
    monkeypatch.setattr(verifier_exec, "PROTECT", False)
    _, recs = runs.run([TASKS / n for n in FORGED], agent="oracle", backend_override=backend)
    by = final(recs)
    for name in FORGED:
        v = by[name].verifier
        assert v is not None and v.passed and v.reward == 1.0, (name, v, by[name].error)


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.vm
def test_microvm_without_the_capability_drop_the_procroot_forgery_would_pass(
    runs: Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guest whose commands keep every capability (the drop switched off): the loop the
    agent left reaches the verifier's private /logs/verifier through /proc/PID/root."""
    from rollbox.backends.microvm import lifecycle as mvb

    configure = mvb._configure_args
    monkeypatch.setattr(mvb, "_configure_args", lambda spec, _full=False: configure(spec, True))
    _, recs = runs.run([TASKS / "forged-procroot"], agent="oracle", backend_override="microvm")
    r = final(recs)["forged-procroot"]
    assert r.extra.get("verifier_isolation") == "private"
    assert r.verifier is not None and r.verifier.passed and r.verifier.reward == 1.0, r.verifier
