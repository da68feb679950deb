"""Writing server-sent events: compact JSON, raw UTF-8, LF or CRLF line endings."""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["Framer", "dumps"]


_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(obj: Any) -> str:
    """Compact JSON with raw UTF-8 (never ``\\u`` escapes for non-ASCII characters, but
    for a lone surrogate (``x-sim-surrogate``), which has no UTF-8 form)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class Framer:
    """Formats events and comments with one line ending for the whole stream."""

    __slots__ = ("nl",)

    def __init__(self, *, crlf: bool = False) -> None:
        self.nl = "\r\n" if crlf else "\n"

    def event(self, data: str, name: str | None = None) -> bytes:
        """One event: an optional ``event:`` line, one ``data:`` line, a blank line."""
        nl = self.nl
        head = f"event: {name}{nl}" if name else ""
        return f"{head}data: {data}{nl}{nl}".encode()

    def comment(self, text: str) -> bytes:
        """A comment block (``: text`` and a blank line), e.g. a heartbeat."""
        nl = self.nl
        return f": {text}{nl}{nl}".encode()
