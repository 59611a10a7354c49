"""The baseline a task starts from (a store reference, its Dockerfile, or the default)."""

from __future__ import annotations

from rollbox.config import Home
from rollbox.rollouts.tasks import Task


def resolve_baseline(task: Task, home: Home) -> str:
    """The baseline digest a task starts from: ``[rollbox] baseline`` or
    ``[environment] docker_image`` (a store reference), else ``environment/Dockerfile`` built
    by buildah through the baseline store (cached by input hash), else the default baseline.

    Raises:
        RollboxError: the reference is unknown, buildah is missing, or the build failed.
    """
    from rollbox.baselines.store import BaselineStore

    store = BaselineStore(home)
    ref = task.rollbox.baseline or task.environment.docker_image
    if ref:
        return store.resolve(ref).digest
    if task.dockerfile is not None:
        return store.build(task.dockerfile.parent, dockerfile=task.dockerfile).digest
    return store.default().digest
