"""Reward parsing: json wins, each failure has its own reason."""

from __future__ import annotations

import pytest

from rollbox.errors import VerifierError
from rollbox.rollouts.verifier import parse_reward


def test_txt_reward() -> None:
    r = parse_reward(b" 0.75\n", None)
    assert r.reward == 0.75 and r.rewards is None and r.source.endswith("reward.txt")


def test_json_wins_over_txt() -> None:
    r = parse_reward(b"0", b'{"reward": 1, "style": 0.5}')
    assert r.reward == 1.0 and r.rewards == {"reward": 1.0, "style": 0.5}
    assert r.source.endswith("reward.json")


def test_json_without_reward_key() -> None:
    assert parse_reward(None, b'{"accuracy": 0.25}').reward == 0.25
    assert parse_reward(None, b'{"a": 1, "b": 0}').reward == 0.5


@pytest.mark.parametrize(
    ("txt", "js", "needle"),
    [
        (None, None, "wrote no reward"),
        (b"", None, "empty"),
        (b"  \n", None, "empty"),
        (b"yes", None, "not a number"),
        (b"nan", None, "finite"),
        (None, b"", "empty"),
        (None, b"{", "not valid JSON"),
        (None, b"[1]", "non-empty object"),
        (None, b"{}", "non-empty object"),
        (None, b'{"reward": "high"}', "must be a number"),
        (None, b'{"reward": true}', "must be a number"),
    ],
)
def test_bad_reward_reasons(txt: bytes | None, js: bytes | None, needle: str) -> None:
    with pytest.raises(VerifierError, match=needle):
        parse_reward(txt, js)
