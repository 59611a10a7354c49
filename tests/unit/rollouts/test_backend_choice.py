"""`--backend auto`: microvm where KVM works, else gvisor where runsc works, else namespace."""

from __future__ import annotations

import pytest

from rollbox.config import Home
from rollbox.errors import UnknownBackendError
from rollbox.rollouts import backend_choice as bc


@pytest.mark.parametrize(
    ("kvm", "works", "expected", "reason_bits"),
    [
        ((True, "a KVM guest booted"), {"microvm", "gvisor"}, "microvm", ["KVM guest booted"]),
        ((False, "no boot in 4s"), {"microvm", "gvisor"}, "gvisor", ["no boot in 4s", "runsc"]),
        ((True, "booted"), {"gvisor"}, "gvisor", ["microvm: broken", "runsc works"]),
        ((False, "no kvm"), set(), "namespace", ["no kvm", "no gvisor: broken"]),
    ],
)
def test_auto_order(
    home: Home,
    monkeypatch: pytest.MonkeyPatch,
    kvm: tuple[bool, str],
    works: set[str],
    expected: str,
    reason_bits: list[str],
) -> None:
    monkeypatch.setattr(bc, "_kvm_verdict", lambda h: kvm)
    monkeypatch.setattr(
        bc, "_works", lambda name, h: (name in works, "ok" if name in works else "broken")
    )
    choice = bc.choose_backend("auto", home)
    assert choice.name == expected
    for bit in reason_bits:
        assert bit in choice.reason


def test_explicit_and_unknown(home: Home) -> None:
    assert bc.choose_backend("namespace", home).reason == "requested explicitly"
    with pytest.raises(UnknownBackendError, match="docker"):
        bc.choose_backend("docker", home)
