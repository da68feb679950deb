"""How a client counts a stream's whole events in the bytes it received (the tests' reference).

The gateway hands its log writers whole events from the guard
(``gateway.guard.whole``); the tests count what a client received the way any
client can, independently:

- SSE: a block ends at a blank line (after any line end: LF, CRLF or CR); a
  comment-only block (``: ping`` and a blank line) is an event too; blank lines
  before a block belong to it;
- NDJSON: each line ended by LF is an event.

What follows the last whole event waits in ``rest``.
"""

from __future__ import annotations

import re

__all__ = ["Splitter"]


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
