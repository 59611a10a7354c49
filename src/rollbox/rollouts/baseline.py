"""The baseline a task starts from (a store reference, its Dockerfile, or the default)."""

from __future__ import annotations

from typing import Any

from rollbox.config import Home
from rollbox.errors import TaskError
from rollbox.rollouts.tasks import Task


def resolve_baseline(task: Task, home: Home) -> str:
    """The baseline digest a task starts from: ``[rollbox] baseline`` or
    ``[environment] docker_image`` (a store reference), else ``environment/Dockerfile`` built
    through the baseline store (cached by input hash), else the default baseline.

    Raises:
        RollboxError: the reference is unknown or the build failed.
    """
    from rollbox.baselines.store import BaselineStore

    store = BaselineStore(home)
    ref = task.rollbox.baseline or task.environment.docker_image
    if ref:
        return store.resolve(ref).digest
    if task.dockerfile is not None:
        return str(_build(store, task).digest)
    return store.default().digest


def _build(store: Any, task: Task) -> Any:
    assert task.dockerfile is not None
    context = task.dockerfile.parent
    build = getattr(store, "build", None)
    if callable(build):
        return build(context, dockerfile=task.dockerfile)
    try:
        from rollbox.baselines.builders import buildah  # type: ignore[attr-defined]
    except ImportError:
        raise TaskError(
            f"task {task.name}: this rollbox cannot build environment/Dockerfile yet",
            hint="set [rollbox] baseline = '<digest or name>' in task.toml",
        ) from None
    for name in ("build_dockerfile", "build"):
        fn = getattr(buildah, name, None)
        if callable(fn):
            return fn(store, context, dockerfile=task.dockerfile)
    raise TaskError(f"task {task.name}: no Dockerfile builder available")
