"""Realistic run/rollout records for the store tests (blobs stored, records sealed)."""

from __future__ import annotations

import io
import json
import tarfile
from datetime import UTC, datetime, timedelta

from rollbox.ids import new_id
from rollbox.models import (
    FsChange,
    Limits,
    NetworkPolicy,
    PhaseStamp,
    RolloutRecord,
    RunRecord,
    TrajectoryStep,
    VerifierOutcome,
)
from rollbox.store import provenance
from rollbox.store.blobs import BlobStore

T0 = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)


def task_tar(name: str, instruction: str) -> bytes:
    """A small task directory as a tar: instruction.md, task.toml, tests/test.sh."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, text in (
            ("instruction.md", instruction),
            ("task.toml", f'[task]\nname = "{name}"\n'),
            ("tests/test.sh", "#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n"),
        ):
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_run(**kw: object) -> RunRecord:
    """A run record."""
    fields: dict[str, object] = {
        "id": new_id("run"),
        "created_at": T0,
        "agent": "oracle",
        "backend": "namespace",
        "backend_reason": "test",
        "task_dirs": ["tasks/a", "tasks/b"],
        "attempts": 2,
        "concurrency": 4,
    }
    fields.update(kw)
    return RunRecord.model_validate(fields)


def make_rollout(
    blobs: BlobStore,
    run_id: str,
    task: str = "hello",
    attempt: int = 0,
    *,
    reward: float | None = 1.0,
    status: str = "done",
    offset_s: float = 0.0,
    seal: bool = True,
    **kw: object,
) -> RolloutRecord:
    """A finished rollout with logs, task copy, trajectory, an artifact and a verifier."""
    start = T0 + timedelta(seconds=offset_s)
    phases = []
    for i, ph in enumerate(
        ("queued", "provisioning", "setup", "agent", "verify", "collect", "teardown")
    ):
        phases.append(PhaseStamp(phase=ph, at=start + timedelta(milliseconds=10 * i * (i + 1))))  # type: ignore[arg-type]
    phases.append(PhaseStamp(phase="done" if status == "done" else "failed", at=phases[-1].at))  # type: ignore[arg-type]
    steps = [
        TrajectoryStep(action="ls /", observation={"exit_code": 0}, started_at=start).model_dump(
            mode="json"
        )
    ]
    fields: dict[str, object] = {
        "id": new_id("ro"),
        "run_id": run_id,
        "task_name": task,
        "task_digest": "sha256:" + "ab" * 32,
        "task_blob": blobs.ref("task.tar", task_tar(task, f"Do the {task} thing.\n")),
        "attempt": attempt,
        "agent": "oracle",
        "agent_config": {"timeout_sec": 30},
        "seed": attempt,
        "backend": "namespace",
        "backend_version": "runc 1.1.5",
        "host": "testhost",
        "rollbox_version": "0.1.0",
        "baseline_digest": "sha256:" + "cd" * 32,
        "baseline_lineage": ["sha256:" + "cd" * 32, "sha256:" + "ef" * 32],
        "limits": Limits(),
        "network": NetworkPolicy(),
        "env_names": ["TASK_NAME"],
        "phases": phases,
        "status": status,
        "exit_codes": {"agent": 0, "verifier": 0},
        "stdout": blobs.ref("stdout", f"agent output {task} {attempt}\n".encode()),
        "stderr": blobs.ref("stderr", b""),
        "trajectory": blobs.ref("trajectory.json", json.dumps(steps).encode()),
        "artifacts": [blobs.ref("/app/out.bin", bytes(range(256)))],
        "fs_diff": [FsChange(path="/app/out.bin", kind="added", size=256, sha256=None)],
        "verifier": VerifierOutcome(
            reward=reward,
            passed=None if reward is None else reward > 0,
            exit_code=0,
            stdout=blobs.ref("verifier.stdout", b"1 passed\n"),
            error=None if reward is not None else "reward.txt is missing",
        ),
        "created_at": start,
        "finished_at": phases[-1].at,
    }
    fields.update(kw)
    rec = RolloutRecord.model_validate(fields)
    return provenance.seal(rec, blobs) if seal else rec
