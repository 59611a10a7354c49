"""The exec-environment conformance check can fail: run against namespace sandboxes whose
shared exec preparation is deliberately broken, it reports each drift."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rollbox.backends import conformance
from rollbox.backends.base import Backend
from rollbox.backends.common import execprep
from rollbox.models import BaselineInfo

pytestmark = pytest.mark.root


def _wrong_home(user: str, passwd: str | None, group: str | None = None) -> execprep.ResolvedUser:
    who = _real_resolve(user, passwd, group)
    return execprep.ResolvedUser(who.spec, who.uid, who.gid, "/")


_real_resolve = execprep.resolve_user
_real_base_env = execprep.base_env


def _with_user_var(info: object, home: str) -> dict[str, str]:
    return {**_real_base_env(info, home), "USER": "root"}  # type: ignore[arg-type]


MUTATIONS: dict[str, tuple[str, object, str]] = {
    # drifts the backends had or could grow: no timeout rule (microvm), a variable of
    # their own, a HOME not from /etc/passwd
    "timeout-accepted": ("check_timeout", lambda t: t, "timeout=0 was accepted"),
    "user-var-added": ("base_env", _with_user_var, "root's environment"),
    "home-not-from-passwd": ("resolve_user", _wrong_home, "HOME"),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_exec_environment_check_fails_on_a_broken_exec_path(
    mutation: str,
    monkeypatch: pytest.MonkeyPatch,
    backend_or_skip: Callable[[str], Backend],
    dev_baseline: BaselineInfo,
) -> None:
    be = backend_or_skip("namespace")
    conformance.run_check_sync("exec_environment", be, dev_baseline)  # the real one passes
    name, value, needle = MUTATIONS[mutation]
    monkeypatch.setattr(execprep, name, value)
    with pytest.raises(AssertionError, match=needle):
        conformance.run_check_sync("exec_environment", be, dev_baseline)
