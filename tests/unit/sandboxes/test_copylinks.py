"""The file-copy contract's link arithmetic (no root, no sandbox)."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollbox.backends.common.copylinks import in_tree_text, inside, resolve_lexically


@pytest.mark.parametrize(
    ("link", "target", "want"),
    [
        ("/tmp/l2", "/tmp/real", "/tmp/real"),
        ("/tmp/link", "/etc/shadow", "/etc/shadow"),  # the sandbox's own /etc/shadow
        ("/tmp/up", "../../../../../etc/hostname", "/etc/hostname"),  # clamped at /
        ("/data/rel", "sub/f", "/data/sub/f"),
        ("/data/x", "./../data/./y", "/data/y"),
        ("/a", "..", "/"),
    ],
)
def test_resolve_lexically(link: str, target: str, want: str) -> None:
    assert resolve_lexically(link, target) == want


@pytest.mark.parametrize(
    ("link", "target", "top", "want"),
    [
        ("/data/abs_in", "/data/sub/f", "/data", "sub/f"),
        ("/data/sub/deep/l", "/data/f", "/data", "../../f"),
        ("/data/rel", "sub/f", "/data", "sub/f"),
        ("/data/out", "/etc/hostname", "/data", None),
        ("/data/outdir", "../etc", "/data", None),
        ("/data/self", ".", "/data", "."),
        ("/l", "/etc/passwd", "/", "etc/passwd"),
    ],
)
def test_in_tree_text(link: str, target: str, top: str, want: str | None) -> None:
    assert in_tree_text(link, target, top) == want


def test_inside() -> None:
    assert inside("/data", "/data") and inside("/data/x", "/data/") and inside("/x", "/")
    assert not inside("/database", "/data") and not inside("/", "/data")


names = st.sampled_from(["a", "b", "..", ".", "", "etc"])


@given(
    st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4),
    st.booleans(),
    st.lists(names, max_size=8),
    st.integers(min_value=0, max_value=3),
)
def test_kept_links_never_leave_the_tree(
    link_parts: list[str], absolute: bool, target_parts: list[str], depth: int
) -> None:
    """A link kept by a tree copy is relative and, resolved from where it sits on the
    host, stays inside the copied tree (lexically: every directory on the way down was
    made by the copy)."""
    top = "/" + "/".join(link_parts[:depth]) if depth else "/"
    link = "/" + "/".join(link_parts)
    target = ("/" if absolute else "") + "/".join(target_parts)
    text = in_tree_text(link, target, top)
    if text is None:
        assert not inside(resolve_lexically(link, target), top)
        return
    assert not text.startswith("/")
    landed = posixpath.normpath(posixpath.join(posixpath.dirname(link), text))
    assert inside(landed, top)
    assert landed == resolve_lexically(link, target)
