"""Cutting relayed bytes into whole events, the unit a resume cursor counts (pure).

The relay sends only whole events (``gateway.guard.stream``), but a send may
hold several, or end after a comment line whose block is not finished yet. A
``Splitter`` cuts what was sent into events the way any client can count them:

- SSE: a block ends at a blank line (after any line end: LF, CRLF or CR); a
  comment-only block (``: ping`` and a blank line) is an event too; blank lines
  before a block belong to it;
- NDJSON: each line ended by LF is an event.

What follows the last whole event waits in ``rest`` for the next send (at the
end of the stream, it goes before the trailer). ``with_id`` puts an ``id: N``
line in front of an SSE event, for a browser ``EventSource`` to reconnect with.
"""

from __future__ import annotations

import re

__all__ = ["Splitter", "with_id"]

#: A line end followed by an empty line's end: the end of an SSE block.
_BLOCK_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")


class Splitter:
    __slots__ = ("lines", "rest")

    def __init__(self, lines: bool) -> None:
        self.lines = lines
        self.rest = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The whole events ``data`` completes (with what waited before it)."""
        if self.rest:
            data = self.rest + data
        if self.lines:
            parts = data.split(b"\n")
            self.rest = parts.pop()
            return [part + b"\n" for part in parts]
        if b"\r" not in data:  # the common case: LF only, split in C
            parts = data.split(b"\n\n")
            self.rest = parts.pop()
            if b"" not in parts:
                return [part + b"\n\n" for part in parts]
            return _joined_blank(parts, self)
        events: list[bytes] = []
        start = 0
        for match in _BLOCK_END.finditer(data):
            end = match.end()
            if match.start() == start:  # a blank line before any block: it belongs to it
                continue
            events.append(data[start:end])
            start = end
        self.rest = data[start:]
        return events


def _joined_blank(parts: list[bytes], splitter: Splitter) -> list[bytes]:
    """LF-only parts where some are empty (blank lines before a block): each joins the
    block after it."""
    events: list[bytes] = []
    blank = b""
    for part in parts:
        if part:
            events.append(blank + part + b"\n\n")
            blank = b""
        else:
            blank += b"\n\n"
    splitter.rest = blank + splitter.rest
    return events


def with_id(event: bytes, number: int) -> bytes:
    """``event`` (an SSE block) with an ``id: number`` line first."""
    return b"id: %d\n%s" % (number, event)
