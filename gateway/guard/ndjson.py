"""The NDJSON decoder: one JSON text per LF-ended line, incremental and bounded.

Newline-delimited JSON (``application/x-ndjson``, Ollama's native API) has
one event per line: the bytes before an LF, with a CR before it dropped (a
CRLF line end), decoded as UTF-8 (U+FFFD for invalid bytes, never an
exception). A line that is empty or only whitespace is no event; its bytes
are still whole and forwardable. There are no comments and no fields.

Goals and bounds, as for the SSE decoder:

* Same bytes, any partition, same events (offsets included): only an LF
  ends a line, so a split anywhere (between CR and LF, inside a UTF-8
  character) changes nothing. A line longer than ``max_line_bytes`` (its
  bytes before the LF, a CR included) raises :class:`LineTooLong` at the same
  line whatever the partition (as soon as the unfinished line outgrows it),
  with the whole events before it in ``events_before_error``.
* No per-byte Python loop: each chunk is split into lines by C code
  (``bytes.split``); an unfinished line is kept as a list of pieces, joined
  once when its LF arrives. Work is O(n) in the bytes processed.
* ``boundary`` is the offset after the last LF: the input up to it is whole
  lines, which is what the relay may forward.
* A last line without its LF when the body ends is unfinished: ``close``
  drops it, as the SSE decoder drops an unfinished block.
"""

from __future__ import annotations

from gateway.guard.decoder import Decoder, Event
from gateway.guard.errors import LineTooLong
from gateway.guard.sse import DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_LINE_BYTES

__all__ = ["NDJSONDecoder"]

_new_event = tuple.__new__


class NDJSONDecoder(Decoder):
    """Incremental NDJSON line decoder with a byte budget per line.

    A line is an event, so its budget is the smaller of ``max_line_bytes``
    and ``max_event_bytes`` (both taken, so any framing's decoder is built
    from the same two settings).
    """

    def __init__(
        self,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        super().__init__(max_line_bytes, max_event_bytes)
        self.max_line_bytes = min(max_line_bytes, max_event_bytes)
        #: the unfinished line (no LF yet), as the pieces that brought it
        self._tail: list[bytes] = []
        self._tail_len = 0

    def _feed(self, data: bytes, start: int, events: list[Event]) -> None:
        size = len(data)
        last = data.rfind(b"\n")
        if last < 0:  # no line ends here: the unfinished line grows
            self._tail.append(data)
            self._tail_len += size
            self._check_tail()
            return
        cut = last + 1
        if self._tail:
            start -= self._tail_len
            self._tail.append(data[:cut] if cut < size else data)
            complete = b"".join(self._tail)
            self._tail.clear()  # the pieces go now, not after the line was judged
        else:
            complete = data[:cut] if cut < size else data
        rest = data[cut:]
        lines = complete.split(b"\n")
        lines.pop()  # ``complete`` ends with an LF: nothing after it
        limit = self.max_line_bytes
        check = len(complete) > limit  # shorter regions hold no line over budget
        append = events.append
        pos = start
        for line in lines:
            if check and len(line) > limit:
                self._boundary = pos
                raise LineTooLong(f"line exceeds {limit} bytes")
            end = pos + len(line) + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if line and not line.isspace():
                try:
                    text = line.decode()
                except UnicodeDecodeError:
                    text = line.decode("utf-8", "replace")
                append(_new_event(Event, ("message", text, "", None, pos, end)))
            else:
                self.quiet_ends.append(end)
            pos = end
        self._boundary = pos
        self._tail = [rest] if rest else []
        self._tail_len = len(rest)
        self._check_tail()

    def _check_tail(self) -> None:
        if self._tail_len > self.max_line_bytes:
            raise LineTooLong(f"line exceeds {self.max_line_bytes} bytes")
