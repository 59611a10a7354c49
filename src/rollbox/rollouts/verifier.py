"""The verifier's reward: Harbor's ``/logs/verifier/reward.json`` or ``reward.txt``.

``reward.json`` (a dict of named rewards) wins when both exist. The headline reward is the
``reward`` key when present, the only value when there is one, else the mean of all values.
A missing, empty or unparseable reward is a :class:`~rollbox.errors.VerifierError` whose
message says which of those it was.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from rollbox.errors import VerifierError

REWARD_DIR = "/logs/verifier"
REWARD_TXT = f"{REWARD_DIR}/reward.txt"
REWARD_JSON = f"{REWARD_DIR}/reward.json"


@dataclass(frozen=True)
class Reward:
    """A parsed reward."""

    reward: float
    """The headline reward."""
    rewards: dict[str, float] | None
    """All named rewards (``reward.json`` only)."""
    source: str
    """The file it came from."""


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise VerifierError(f"{where}: reward must be a number, got {value!r}"[:300])
    f = float(value)
    if not math.isfinite(f):
        raise VerifierError(f"{where}: reward must be finite, got {value!r}")
    return f


def parse_reward(txt: bytes | None, js: bytes | None) -> Reward:
    """Parse the reward files' contents (``None``: the file does not exist).

    Raises:
        VerifierError: no reward file, an empty one, or one that cannot be parsed.
    """
    if js is not None:
        text = js.decode("utf-8", "replace").strip()
        if not text:
            raise VerifierError(f"verifier wrote an empty {REWARD_JSON}")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise VerifierError(f"{REWARD_JSON} is not valid JSON: {exc}") from None
        if isinstance(doc, int | float) and not isinstance(doc, bool):
            value = _number(doc, REWARD_JSON)
            return Reward(value, {"reward": value}, REWARD_JSON)
        if not isinstance(doc, dict) or not doc:
            raise VerifierError(f"{REWARD_JSON} must be a non-empty object of named rewards")
        rewards = {str(k): _number(v, f"{REWARD_JSON} key {k!r}") for k, v in doc.items()}
        if "reward" in rewards:
            head = rewards["reward"]
        elif len(rewards) == 1:
            head = next(iter(rewards.values()))
        else:
            head = sum(rewards.values()) / len(rewards)
        return Reward(head, rewards, REWARD_JSON)
    if txt is not None:
        text = txt.decode("utf-8", "replace").strip()
        if not text:
            raise VerifierError(f"verifier wrote an empty {REWARD_TXT}")
        try:
            value = float(text)
        except ValueError:
            raise VerifierError(
                f"{REWARD_TXT} is not a number: {text[:80]!r}",
            ) from None
        return Reward(_number(value, REWARD_TXT), None, REWARD_TXT)
    raise VerifierError(f"verifier wrote no reward ({REWARD_TXT} or {REWARD_JSON})")
