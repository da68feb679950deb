"""What every framing's decoder shares: the ``Event`` it emits and the offsets it keeps.

A decoder turns a byte stream of one framing (server-sent events, NDJSON)
into events, incrementally and within byte budgets. ``StreamGuard`` drives
any of them through this base: ``feed`` returns the events a chunk
completed, ``close`` those only the end of the body completes, ``boundary``
is the offset up to which the input is whole events (what may be forwarded),
``received`` the bytes fed, ``quiet_ends`` the ends of whole blocks that
dispatched no event (SSE comment-only or data-less blocks, blank NDJSON
lines: ``gateway.guard.whole`` cuts there too; the guard empties it). After a
``GuardError`` a decoder is dead and ``events_before_error`` holds the whole
events the failing ``feed`` completed before the offending line.
"""

from __future__ import annotations

from typing import NamedTuple

from gateway.guard.errors import GuardError

__all__ = ["Decoder", "Event"]


class Event(NamedTuple):
    """One decoded event (immutable): a server-sent event, or one NDJSON line.

    ``start`` is the stream offset of the first byte of the event's block;
    ``end`` is the offset after the terminator (LF, CR or CRLF) of the blank
    line that dispatched it (NDJSON: after the line's LF). Neither takes part
    in equality or hashing.

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


class Decoder:
    """Base of the incremental decoders: the byte offsets, the error state, and the check
    of the two budgets every framing's decoder is built from."""

    def __init__(self, max_line_bytes: int, max_event_bytes: int) -> None:
        if max_line_bytes < 1 or max_event_bytes < 1:
            raise ValueError("budgets must be positive")
        self._received = 0  # total bytes fed
        self._boundary = 0
        #: After a GuardError: the events the failing ``feed`` completed before the
        #: offending line (they are whole and valid; the caller may still judge them).
        self.events_before_error: list[Event] = []
        #: Offsets after whole blocks that dispatched no event, in order (the reader
        #: empties it).
        self.quiet_ends: list[int] = []
        self._error: GuardError | None = None

    @property
    def boundary(self) -> int:
        """Offset up to which the input is whole events (and whole comment lines)."""
        return self._boundary

    @property
    def pending_bytes(self) -> int:
        """Bytes received after ``boundary`` (an unfinished line or block)."""
        return self._received - self._boundary

    @property
    def received(self) -> int:
        """Total bytes fed so far."""
        return self._received

    def feed(self, data: bytes) -> list[Event]:
        """Consume ``data`` and return the events it completed, in order. A
        ``GuardError`` kills the decoder: it is raised again by every later call."""
        if self._error is not None:
            raise self._error
        events: list[Event] = []
        if not data:
            return events
        start = self._received
        self._received = start + len(data)
        try:
            self._feed(data, start, events)
        except GuardError as exc:
            self._error = exc
            self.events_before_error = events
            raise
        return events

    def close(self) -> list[Event]:
        """The body ended: the events only its end completes (an unfinished one is dropped)."""
        if self._error is not None:
            raise self._error
        events: list[Event] = []
        self._close(events)
        return events

    def _feed(self, data: bytes, start: int, events: list[Event]) -> None:
        """Consume ``data`` (not empty; ``start`` the stream offset of its first byte,
        ``received`` already counts it), appending the events it completes to ``events``."""
        raise NotImplementedError

    def _close(self, events: list[Event]) -> None:
        """Append the events only the end of the body completes (by default none)."""

    def clean_end(self, held: bytes) -> bool:
        """Whether a body that ended with ``held`` unforwarded ended between events (line
        framings: nothing but whitespace is left over)."""
        return not held.strip()
