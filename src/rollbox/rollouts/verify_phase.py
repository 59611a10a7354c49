"""The verify phase of a rollout: ``tests/`` run against the agent's final state.

:class:`VerifyPhase` is a base of :class:`~rollbox.rollouts.runner.RolloutRunner` (the methods
moved here from runner.py unchanged): a private verifier exec where the backend can, else the
weaker path with its tamper checks (``rollouts/verifier_exec.py``); the reward is read from
``/logs/verifier``.
"""

import shutil
import time
from pathlib import Path
from typing import Any

from rollbox.backends.isolation import IsolatedExec
from rollbox.errors import (
    BackendError,
    CapabilityError,
    ExecTimeoutError,
    InvalidInputError,
    RollboxError,
    VerifierError,
)
from rollbox.models import (
    ErrorKind,
    RolloutRecord,
    RolloutStatus,
    VerifierOutcome,
)
from rollbox.rollouts.outputs import RolloutOutputs
from rollbox.rollouts.tasks import Task
from rollbox.rollouts.verifier import REWARD_DIR, REWARD_JSON, REWARD_TXT, parse_reward
from rollbox.rollouts.verifier_exec import (
    VerifierRun,
    is_unsupported,
    isolated_request,
    protected,
    run_unisolated,
    suspicious,
    unisolated_stop,
)
from rollbox.sandbox import AsyncSandbox

TESTS_DIR = "/tests"
DEADLINE_GRACE_S = 15.0
"""A private verifier exec ends at the in-sandbox agent's deadline (files kept); the exec
timeout, this much later, is only the backstop."""


class _Fail(Exception):
    """Ends a rollout early with a status and a blamed party."""

    def __init__(self, status: RolloutStatus, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


class VerifyPhase(RolloutOutputs):
    """The verify phase of the rollout runner."""

    async def _verify(self, rec: RolloutRecord, sbx: AsyncSandbox, task: Task) -> None:
        timing = self._time(rec)
        mode = task.verifier.environment_mode
        rec.suspicious_changes = suspicious(rec.fs_diff)
        t0 = time.perf_counter()
        outcome = VerifierOutcome(mode=mode)
        cmd = ["bash", "-c", f"mkdir -p {REWARD_DIR} && exec bash {TESTS_DIR}/test.sh"]
        opts: dict[str, Any] = {
            "cwd": task.environment.workdir,
            "env": dict(task.verifier.env),
            "timeout": task.verifier.timeout_sec,
        }
        stop = task.rollbox.stop_agent_before_verify and mode == "shared"
        run: VerifierRun | None = None
        iso: IsolatedExec | None = None
        timed_out = f"verifier timed out after {task.verifier.timeout_sec:g}s"
        started = time.perf_counter()
        try:
            if protected():
                try:
                    iso = isolated_request(task.tests_dir, stop_agent=stop)
                except InvalidInputError as exc:
                    raise _Fail("failed", "task", f"task {task.name}: {exc.one_line()}") from None
                iso.timeout_s = task.verifier.timeout_sec
                run = await self._verifier_exec(rec, sbx, task, iso, cmd, opts, stop=stop)
                r = run.result
                if run.isolation == "private" and iso.timed_out:
                    outcome.error = timed_out
            else:  # test-only: the unprotected path, to show the guard is what stops forgeries
                await sbx.files.upload(task.tests_dir, TESTS_DIR)
                started = time.perf_counter()
                r = await sbx.exec(cmd, **opts)
            outcome.exit_code = r.exit_code
            rec.exit_codes = {**rec.exit_codes, "verifier": r.exit_code}
            out, err, cut = r.stdout, r.stderr, r.truncated
        except ExecTimeoutError as exc:
            out, err, cut = exc.stdout, exc.stderr, False
            outcome.error = timed_out
        outcome.duration_s = time.perf_counter() - started
        outcome.stdout = self._ref("verifier.stdout", out.encode(), truncated=cut)
        outcome.stderr = self._ref("verifier.stderr", err.encode(), truncated=cut)
        if run is not None and run.tampered and outcome.error is None:
            outcome.error = run.tampered
        # /logs/verifier comes out once: kept as artifacts (also after a timeout: the private
        # exec's own deadline still returns them), and the reward is read from it.
        private = rec.extra.get("verifier_isolation") == "private"
        if iso is not None and private:
            logs = iso.collected
            refs = [self._ref(f"{REWARD_DIR}/{k}", v) for k, v in sorted(logs.items())]
            rec.artifacts = [*rec.artifacts, *refs]
            txt, js = logs.get("reward.txt"), logs.get("reward.json")
        else:
            txt, js = await self._verifier_logs(rec, sbx)
        if outcome.error is None:
            try:
                reward = parse_reward(txt, js)
            except VerifierError as exc:
                tail = f"; test.sh exited {outcome.exit_code}" if outcome.exit_code else ""
                outcome.error = exc.one_line() + tail
            else:
                outcome.reward = reward.reward
                outcome.rewards = reward.rewards
                threshold = task.rollbox.pass_threshold
                outcome.passed = (
                    reward.reward > 0 if threshold is None else reward.reward >= threshold
                )
        timing.backend_s += time.perf_counter() - t0
        rec.verifier = outcome

    async def _verifier_exec(
        self,
        rec: RolloutRecord,
        sbx: AsyncSandbox,
        task: Task,
        iso: IsolatedExec,
        cmd: list[str],
        opts: dict[str, Any],
        *,
        stop: bool,
    ) -> VerifierRun:
        """Run the verifier in its own mount namespace (``/tests``, ``/logs/verifier``
        private; the agent's own deadline, with the exec timeout as a backstop); where the
        backend cannot, the weaker path with its tamper checks. ``verifier_isolation`` is
        recorded before the command runs (a timeout raises out of here)."""
        scratch = self.home.tmp / f"verifier-tests-{rec.id}"
        private_opts = {**opts, "timeout": task.verifier.timeout_sec + DEADLINE_GRACE_S}
        try:
            rec.extra = {**rec.extra, "verifier_isolation": "private"}
            r = await sbx.exec(cmd, isolate=iso, **private_opts)
            return VerifierRun(r, iso.collected, "private")
        except CapabilityError as exc:
            if not is_unsupported(exc):
                raise
        stop, how = unisolated_stop(task.rollbox, task.verifier.environment_mode)
        rec.extra = {**rec.extra, "verifier_isolation": how}
        return await run_unisolated(sbx, task.tests_dir, cmd, opts, stop=stop, scratch=scratch)

    async def _verifier_logs(
        self, rec: RolloutRecord, sbx: AsyncSandbox
    ) -> tuple[bytes | None, bytes | None]:
        """Download ``/logs/verifier`` into the blob store (as artifacts); return the contents
        of ``reward.txt`` and ``reward.json`` (None: absent)."""
        scratch = self.home.tmp / f"verifier-{rec.id}"
        dest = scratch / "logs"
        scratch.mkdir(parents=True, exist_ok=True)
        try:
            try:
                await sbx.files.download(REWARD_DIR, dest)
            except BackendError:
                raise
            except (RollboxError, OSError):
                return None, None
            rec.artifacts = [*rec.artifacts, *self._store_tree(REWARD_DIR, dest)]
            found: list[bytes | None] = []
            for path in (REWARD_TXT, REWARD_JSON):
                local = dest / Path(path).name
                if local.is_symlink():  # resolve it inside the sandbox, never on the host
                    found.append(await self._read_optional(sbx, path))
                elif local.is_file():
                    found.append(local.read_bytes())
                else:
                    found.append(None)
            return found[0], found[1]
        finally:
            shutil.rmtree(scratch, True)
