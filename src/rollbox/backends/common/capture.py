"""Output capture for execs: a byte cap per stream and secret masking, also on the
streamed chunks (a secret split across two chunks is still masked)."""

from __future__ import annotations

import codecs
from collections.abc import Callable

MASK = "***"


def mask(text: str, secrets: list[str]) -> str:
    """``text`` with every secret value replaced by ``***`` (longest first)."""
    for s in sorted(secrets, key=len, reverse=True):
        if s:
            text = text.replace(s, MASK)
    return text


class StreamCapture:
    """One stream (stdout or stderr) of one exec."""

    def __init__(
        self, cap: int, secrets: list[str], callback: Callable[[str], None] | None
    ) -> None:
        self.cap = cap
        self.secrets = sorted((s for s in secrets if s), key=len, reverse=True)
        self.callback = callback
        self.buf = bytearray()
        self.truncated = False
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = ""
        self._hold = max((len(s) for s in self.secrets), default=1) - 1

    def feed(self, data: bytes) -> None:
        """Take one chunk as it arrives."""
        room = self.cap - len(self.buf)
        if room > 0:
            self.buf += data[:room]
        if len(data) > room:
            self.truncated = True
        if self.callback is not None:
            text = mask(self._pending + self._dec.decode(data), self.secrets)
            if self._hold and len(text) > self._hold:
                out, self._pending = text[: -self._hold], text[-self._hold :]
            elif self._hold:
                out, self._pending = "", text
            else:
                out, self._pending = text, ""
            if out:
                self.callback(out)

    def finish(self) -> str:
        """Flush held-back streamed text and return the captured, masked text."""
        if self.callback is not None:
            tail = mask(self._pending + self._dec.decode(b"", final=True), self.secrets)
            self._pending = ""
            if tail:
                self.callback(tail)
        return mask(self.buf.decode("utf-8", "replace"), self.secrets)
