"""The WHATWG event-stream decoder: bytes in, events out, incremental and bounded.

Implements "Parsing an event stream" and "Interpreting an event stream" of
the HTML Living Standard (server-sent events), fed in arbitrary chunks.

Goals and bounds:

* Same bytes, any partition, same events (offsets included): a CR at the end
  of one chunk and an LF at the start of the next are one line end; a UTF-8
  BOM split across chunks is still stripped (only at the very start of the
  stream). An event's ``end`` is the offset after the *first* byte of its
  blank line's terminator, so a CRLF split between two chunks cannot change
  it. Budget errors are raised at the same line whatever the partition, and
  the events completed before it are kept in ``events_before_error``.
* No per-byte Python loop: each chunk is scanned with ``bytes.rfind`` and
  split into blocks and lines by C code. Blocks that are one ``data:`` line
  (what every LLM provider sends) are decoded in one step each; anything else
  goes line by line. Work is O(n) in the bytes processed: an unfinished line
  is kept as a list of pieces and joined once, when its terminator arrives.
* Memory is bounded: a line longer than ``max_line_bytes`` raises
  :class:`LineTooLong`, an event whose data exceeds ``max_event_bytes`` raises
  :class:`EventTooLarge` (as does a block whose raw bytes grow past twice
  that plus a line: endless comments or unknown fields inside one block).
* ``boundary`` tells the relay how far the input consists of whole blocks
  and whole comment lines outside any block, so it can forward exactly that.

Invalid UTF-8 becomes U+FFFD, never an exception.
"""

from __future__ import annotations

from typing import NamedTuple

from gateway.guard.errors import EventTooLarge, GuardError, LineTooLong

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "DEFAULT_MAX_LINE_BYTES", "Event", "SSEDecoder"]

#: Large enough for a Responses-API ``response.completed`` event that repeats
#: the whole output (several MiB for long answers with reasoning).
DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024

_BOM = b"\xef\xbb\xbf"
_COLON = 0x3A
_SPACE = 0x20


class Event(NamedTuple):
    """One dispatched server-sent event (immutable).

    ``start`` is the stream offset of the first byte of the event's block;
    ``end`` is the offset just after the first byte of the line terminator of
    the blank line that dispatched it (after its LF, its CR, or the CR of its
    CRLF: the LF of a CRLF may arrive in a later chunk, so it is not counted).
    Neither takes part in equality or hashing.

    A named tuple rather than a frozen dataclass because building one is
    several times cheaper, and the decoder builds one per event.
    """

    event: str = "message"
    data: str = ""
    id: str = ""
    retry: int | None = None
    start: int = 0
    end: int = 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Event) and self[:4] == other[:4]

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self[:4])


_new_event = tuple.__new__


class SSEDecoder:
    """Incremental event-stream decoder with byte budgets.

    ``feed(chunk)`` returns the events completed by that chunk. After a
    :class:`GuardError` the decoder is dead: every later call raises it again.
    """

    def __init__(
        self,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        if max_line_bytes < 1 or max_event_bytes < 1:
            raise ValueError("budgets must be positive")
        self.max_line_bytes = max_line_bytes
        self.max_event_bytes = max_event_bytes
        self._max_block_bytes = 2 * max_event_bytes + max_line_bytes
        self._received = 0  # total bytes fed
        self._tail = b""  # the unfinished line (no terminator yet)
        self._first_line = True  # the next complete line starts at offset 0
        self._cr_pending = False  # the last byte seen was a CR ending a line
        self._boundary = 0
        self._block_start: int | None = None  # offset of the open block's first line
        self._data: list[bytes] = []
        self._has_data = False
        self._data_size = 0
        self._event_type = b""
        self._block_retry: int | None = None
        self._error: GuardError | None = None
        #: The last event ID string, carried from event to event (spec: never reset).
        self.last_event_id = ""
        #: The reconnection time in milliseconds, if the stream set one.
        self.retry: int | None = None

    # -- public state ---------------------------------------------------------

    @property
    def boundary(self) -> int:
        """Offset up to which the input is whole blocks and whole comment lines."""
        return self._boundary

    @property
    def pending_bytes(self) -> int:
        """Bytes received after ``boundary`` (an unfinished line or block)."""
        return self._received - self._boundary

    @property
    def received(self) -> int:
        """Total bytes fed so far."""
        return self._received

    @property
    def in_block(self) -> bool:
        """True when a field line was seen and its block is not finished yet."""
        return self._block_start is not None

    # -- feeding --------------------------------------------------------------

    def feed(self, data: bytes) -> list[Event]:
        """Consume ``data`` and return the events it completed, in order."""
        if self._error is not None:
            raise self._error
        try:
            return self._feed(data)
        except GuardError as exc:
            self._error = exc
            raise

    def _feed(self, data: bytes) -> list[Event]:
        events: list[Event] = []
        if not data:
            return events
        start = self._received
        self._received += len(data)
        if self._cr_pending:
            self._cr_pending = False
            if data[0] == 0x0A:  # the LF of a CRLF split across chunks
                data = data[1:]
                start += 1
                if self._block_start is None and not self._tail:
                    self._boundary = start
                if not data:
                    return events
        if self._tail:
            start -= len(self._tail)
            data = self._tail + data
        last_lf = data.rfind(b"\n")
        last_cr = data.rfind(b"\r", last_lf + 1)
        last = last_cr if last_cr > last_lf else last_lf
        if last < 0:
            self._tail = data
            self._check_tail()
            return events
        if last == len(data) - 1:
            self._tail = b""
            self._cr_pending = last_cr == last
            complete = data
        else:
            self._tail = data[last + 1 :]
            complete = data[: last + 1]
        pos = start
        if b"\r" in complete:
            for raw in complete.splitlines(keepends=True):
                end = pos + len(raw)
                if raw.endswith(b"\r\n"):
                    self._line(raw[:-2], pos, end, events)
                else:
                    self._line(raw[:-1], pos, end, events)
                pos = end
        else:
            lines = complete.split(b"\n")
            lines.pop()  # ``complete`` ends with a terminator: the last item is empty
            for line in lines:
                end = pos + len(line) + 1
                self._line(line, pos, end, events)
                pos = end
        self._check_tail()
        if self._block_start is not None and pos - self._block_start > self._max_block_bytes:
            raise EventTooLarge(f"event block exceeds {self._max_block_bytes} bytes without ending")
        return events

    def _check_tail(self) -> None:
        if len(self._tail) > self.max_line_bytes:
            raise LineTooLong(f"line exceeds {self.max_line_bytes} bytes")

    def _line(self, line: bytes, pos: int, end: int, events: list[Event]) -> None:
        """Interpret one complete line spanning stream offsets [pos, end)."""
        if len(line) > self.max_line_bytes:
            raise LineTooLong(f"line exceeds {self.max_line_bytes} bytes")
        if self._first_line:
            self._first_line = False
            if line.startswith(_BOM):
                line = line[3:]
        if not line:
            if self._block_start is not None:
                if self._has_data:
                    events.append(self._dispatch(end))
                self._reset_block()
            self._boundary = end
            return
        if line[0] == _COLON:
            if self._block_start is None:
                self._boundary = end
            return
        if self._block_start is None:
            self._block_start = pos
        colon = line.find(b":")
        if colon < 0:
            name, value = line, b""
        else:
            name = line[:colon]
            value = line[colon + 1 :]
            if value and value[0] == _SPACE:
                value = value[1:]
        if name == b"data":
            self._has_data = True
            self._data_size += len(value) + (1 if self._data else 0)
            if self._data_size > self.max_event_bytes:
                raise EventTooLarge(f"event data exceeds {self.max_event_bytes} bytes")
            self._data.append(value)
        elif name == b"event":
            self._event_type = value
        elif name == b"id":
            if b"\x00" not in value:
                self.last_event_id = value.decode("utf-8", "replace")
        elif name == b"retry" and value and value.isdigit():  # bytes.isdigit is ASCII-only
            self.retry = self._block_retry = int(value)
        # any other field name is ignored, as the spec says

    def _dispatch(self, end: int) -> Event:
        assert self._block_start is not None
        data = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
        return Event(
            event=self._event_type.decode("utf-8", "replace") if self._event_type else "message",
            data=data.decode("utf-8", "replace"),
            id=self.last_event_id,
            retry=self._block_retry,
            start=self._block_start,
            end=end,
        )

    def _reset_block(self) -> None:
        self._block_start = None
        self._data = []
        self._has_data = False
        self._data_size = 0
        self._event_type = b""
        self._block_retry = None
