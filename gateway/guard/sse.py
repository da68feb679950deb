"""The WHATWG event-stream decoder: bytes in, events out, incremental and bounded.

Implements "Parsing an event stream" and "Interpreting an event stream" of
the HTML Living Standard (server-sent events), fed in arbitrary chunks.

Goals and bounds:

* Same bytes, any partition, same events (offsets included): a CR at the end
  of one chunk and an LF at the start of the next are one line end; a UTF-8
  BOM split across chunks is still stripped (only at the very start of the
  stream). A blank line ended by a CR that is the last byte received so far
  is interpreted when the next byte shows whether an LF follows, so an
  event's ``end`` (after its blank line's whole terminator) never depends on
  where the network split a CRLF. Budget errors are raised at the same line
  whatever the partition, and the events completed before it are kept in
  ``events_before_error``.
* No per-byte Python loop: each chunk is split into lines by C code
  (``bytes.split``; ``splitlines`` only for mixed line ends). A block that is
  one ``data:`` line and a blank line (what LLM providers send) is decoded
  in a tight loop, a pair of lines per iteration; anything else goes through
  the general per-line interpreter. Work is O(n) in the bytes processed: an
  unfinished line is kept as a list of pieces, joined once when its
  terminator arrives.
* Memory is bounded: a line longer than ``max_line_bytes`` raises
  :class:`LineTooLong`, an event whose data exceeds ``max_event_bytes`` raises
  :class:`EventTooLarge` (as does a block whose raw bytes grow past twice
  that plus a line: endless comments or unknown fields inside one block).
* ``boundary`` tells the relay how far the input consists of whole blocks
  and whole comment lines outside any block, so it can forward exactly that.

Invalid UTF-8 becomes U+FFFD, never an exception.
"""

from __future__ import annotations

from gateway.guard.decoder import Decoder, Event
from gateway.guard.errors import EventTooLarge, LineTooLong

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "DEFAULT_MAX_LINE_BYTES", "Event", "SSEDecoder"]

#: Large enough for a Responses-API ``response.completed`` event that repeats
#: the whole output (several MiB for long answers with reasoning).
DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024

_BOM = b"\xef\xbb\xbf"
_COLON = 0x3A
_SPACE = 0x20


_new_event = tuple.__new__


class SSEDecoder(Decoder):
    """Incremental event-stream decoder with byte budgets.

    ``feed(chunk)`` returns the events completed by that chunk; ``close()``
    the one a final CR-ended blank line completes at the end of the stream.
    After a :class:`GuardError` the decoder is dead: every later call raises
    it again.
    """

    def __init__(
        self,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        super().__init__(max_line_bytes, max_event_bytes)
        self.max_line_bytes = max_line_bytes
        self.max_event_bytes = max_event_bytes
        self._max_block_bytes = 2 * max_event_bytes + max_line_bytes
        #: the unfinished line (no terminator yet), as the pieces that brought it
        self._tail: list[bytes] = []
        self._tail_len = 0
        #: regions no longer than this hold no line or data over budget: fast path
        self._fast_limit = min(max_line_bytes, max_event_bytes)
        self._first_line = True  # the next complete line starts at offset 0
        self._cr_pending = False  # the last byte seen was a CR ending a line
        #: offset of a blank line ended by a CR that was the last byte seen: it is
        #: interpreted once the next byte tells whether its terminator is CR or CRLF
        self._blank_pending: int | None = None
        self._block_start: int | None = None  # offset of the open block's first line
        self._comments = False  # comment lines since the last blank line, outside a block
        self._data: list[bytes] = []
        self._has_data = False
        self._data_size = 0
        self._event_type = b""
        self._block_retry: int | None = None
        #: The last event ID string, carried from event to event (spec: never reset).
        self.last_event_id = ""
        #: The reconnection time in milliseconds, if the stream set one.
        self.retry: int | None = None

    # -- public state ---------------------------------------------------------

    @property
    def in_block(self) -> bool:
        """True when a field line was seen and its block is not finished yet."""
        return self._block_start is not None

    # -- feeding --------------------------------------------------------------

    def _close(self, events: list[Event]) -> None:
        """The stream ended: the event a final CR-ended blank line dispatches.

        An unfinished line or block is discarded, as the standard says.
        """
        if self._blank_pending is not None:
            at, self._blank_pending = self._blank_pending, None
            self._line(b"", at, at + 1, events)

    def _feed(self, data: bytes, start: int, events: list[Event]) -> None:
        size = len(data)
        if self._cr_pending or self._blank_pending is not None:
            lf = data[0] == 0x0A  # the LF of a CRLF split across chunks
            if lf:
                data = data[1:]
                size -= 1
                start += 1
            if self._cr_pending:
                self._cr_pending = False
                if lf and self._block_start is None:
                    self._boundary = start
            else:
                at, self._blank_pending = self._blank_pending, None
                assert at is not None
                self._line(b"", at, start, events)  # its terminator ends at ``start``
            if not size:
                return
        if b"\r" not in data:
            # LF line ends only (the common case): split the chunk itself.
            lines = data.split(b"\n")
            rest = lines.pop()  # after the last LF: the start of an unfinished line
            tail = self._tail
            if not lines:  # no line ends here: the unfinished line grows
                tail.append(rest)
                self._tail_len += size
            else:
                if tail:
                    start -= self._tail_len
                    size += self._tail_len
                    tail.append(lines[0])
                    lines[0] = b"".join(tail)
                    tail.clear()  # the pieces go now, not after the line was judged
                self._tail = [rest] if rest else []
                self._tail_len = len(rest)
                # A region no longer than both budgets cannot hold a line or an
                # event over budget, so the fast path need not check them.
                fast = size <= self._fast_limit
                if fast and self._block_start is None and not self._first_line:
                    # the common case, without ``_run``'s bookkeeping
                    before = len(events)
                    pos = self._pairs(lines, start, 2, events)
                    done = 2 * (len(events) - before)
                    if done:
                        self._boundary = pos
                    if done < len(lines):
                        self._run(lines[done:], pos, 1, fast, events)
                else:
                    self._run(lines, start, 1, fast, events)
            if self._tail_len > self.max_line_bytes:
                raise LineTooLong(f"line exceeds {self.max_line_bytes} bytes")
            return
        last_lf = data.rfind(b"\n")
        last_cr = data.rfind(b"\r", last_lf + 1)
        last = last_cr if last_cr > last_lf else last_lf
        if last < 0:  # no line ends here: the unfinished line grows
            self._tail.append(data)
            self._tail_len += len(data)
            self._check_tail()
            return
        cut = last + 1
        if self._tail:
            start -= self._tail_len
            self._tail.append(data[:cut] if cut < len(data) else data)
            complete = b"".join(self._tail)
        else:
            complete = data[:cut] if cut < len(data) else data
        rest = data[cut:]
        self._tail = [rest] if rest else []
        self._tail_len = len(rest)
        if last == last_cr and not rest:  # the data ends with a CR
            if len(complete) == 1 or complete[-2] in (0x0A, 0x0D):
                # ... that ends a blank line: wait for the next byte (an LF or not)
                self._blank_pending = start + len(complete) - 1
                complete = complete[:-1]
            else:
                self._cr_pending = True
        if complete:
            self._lines(complete, start, events)
        self._check_tail()

    def _check_tail(self) -> None:
        if self._tail_len > self.max_line_bytes:
            raise LineTooLong(f"line exceeds {self.max_line_bytes} bytes")

    def _lines(self, complete: bytes, pos: int, events: list[Event]) -> None:
        """Interpret ``complete`` (whole lines, each with its terminator) starting at ``pos``."""
        if b"\r" not in complete:
            sep = b"\n"
        else:
            crlf = complete.count(b"\r\n")
            if crlf == complete.count(b"\r") and crlf == complete.count(b"\n"):
                sep = b"\r\n"
            else:  # mixed line ends: C splits the lines, Python takes them one by one
                for raw in complete.splitlines(keepends=True):
                    end = pos + len(raw)
                    self._line(raw[:-2] if raw.endswith(b"\r\n") else raw[:-1], pos, end, events)
                    pos = end
                return
        lines = complete.split(sep)
        lines.pop()  # ``complete`` ends with ``sep``: nothing after it
        self._run(lines, pos, len(sep), len(complete) <= self._fast_limit, events)

    def _run(
        self, lines: list[bytes], pos: int, step: int, fast: bool, events: list[Event]
    ) -> None:
        """Interpret ``lines``, each followed by a ``step``-byte terminator, from ``pos``.

        Between blocks, the common shape (a block that is one ``data`` line) is
        decoded by ``_pairs``; anything else goes through ``_line`` one line at
        a time until its block is closed.
        """
        n = len(lines)
        i = 0
        while i < n:
            if fast and self._block_start is None and not self._first_line:
                before = len(events)
                pos = self._pairs(lines[i:] if i else lines, pos, 2 * step, events)
                done = len(events) - before
                if done:
                    i += 2 * done
                    self._boundary = pos
            while i < n:
                line = lines[i]
                end = pos + len(line) + step
                self._line(line, pos, end, events)
                pos = end
                i += 1
                if self._block_start is None:
                    break

    def _pairs(self, lines: list[bytes], pos: int, width: int, events: list[Event]) -> int:
        """Decode the blocks at the start of ``lines`` that are a ``data`` line and a blank line.

        The caller knows that no block is open and that no budget can be
        exceeded. ``width`` is the size of two line terminators. Stops at the
        first pair of another shape; returns the offset after the last block
        decoded (the caller counts the events it appended).
        """
        first = pos
        last_id = self.last_event_id
        append = events.append
        new_event = _new_event
        cls = Event
        it = iter(lines)
        for line, blank in zip(it, it):  # noqa: B905 (an odd last line is left alone)
            if blank:  # a data line not followed by a blank line: a longer block
                break
            value = line.removeprefix(b"data: ")
            if value is line:
                if line[:5] != b"data:":
                    break
                value = line[5:]
            try:
                text = value.decode()
            except UnicodeDecodeError:
                text = value.decode("utf-8", "replace")
            end = pos + (len(line) + width)
            append(new_event(cls, ("message", text, last_id, None, pos, end)))
            pos = end
        if pos != first:  # a comment before the first pair was that block's
            self._comments = False
        return pos

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
                else:
                    self.quiet_ends.append(end)
                self._reset_block()
            elif self._comments:
                self.quiet_ends.append(end)  # a comment-only block (``: ping``)
            self._comments = False
            self._boundary = end
            return
        if line[0] == _COLON:
            if self._block_start is None:
                self._comments = True
                self._boundary = end
            elif end - self._block_start > self._max_block_bytes:
                raise EventTooLarge(
                    f"event block exceeds {self._max_block_bytes} bytes without ending"
                )
            return
        if self._block_start is None:
            self._block_start = pos
        elif end - self._block_start > self._max_block_bytes:
            raise EventTooLarge(f"event block exceeds {self._max_block_bytes} bytes without ending")
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
        elif name == b"retry" and value.isdigit():  # bytes.isdigit: ASCII only, b"" is not
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
