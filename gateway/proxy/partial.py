"""What all streams of a worker may hold of events not yet whole, together: a bound.

A stream's guard keeps the bytes of an event until the event is whole (an SSE
event up to its blank line, an NDJSON line, an event stream frame), up to
``limits.max_event_bytes`` (16 MiB) for one event. Held by many streams at
once, those bytes (and what reading, joining and judging a large event costs
at its peak: about 4 times its size) were the one part of a worker's memory
no setting bounded: 20 streams carrying a 15 MiB event each took a worker from
62 to 838 MiB. ``limits.max_partial_event_bytes`` bounds their sum: a stream
whose unfinished event would grow the sum past it ends incomplete with
``limit_exceeded`` (the protocol's error event, the annotation), counted in
``gateway_partial_event_refusals_total{route}``; what it held is given back.
Small events never come near it: a stream's partial bytes are a line or two.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.guard import Reason, StreamGuard

__all__ = ["PartialEvents"]

_DETAIL = (
    "the gateway's streams hold limits.max_partial_event_bytes of unfinished events: "
    "this stream's event could not grow"
)


class PartialEvents:
    """The bytes of unfinished events every stream of this process holds, bounded."""

    def __init__(self, limit: int, refused: Callable[[str], None] = lambda route: None) -> None:
        self.limit = limit
        self.held = 0
        #: Counts a stream ended by the bound (its route): the metric.
        self.refused = refused

    def fed(self, guard: StreamGuard, before: int, route: str, unsent: int = 0) -> int:
        """After ``guard`` was fed: its unfinished event's bytes now, and ``unsent`` bytes
        of whole events it let through and the client has not taken yet (``before``: what
        the stream held so far), held against the bound; past it, the guard is ended
        ``limit_exceeded`` and its bytes given back (0)."""
        now = (guard.decoder.pending_bytes if guard.verdict is None else 0) + unsent
        if self.hold(before, now):
            return now
        self.hold(now, 0)
        guard.abort(Reason.LIMIT_EXCEEDED, _DETAIL)
        self.refused(route)
        return 0

    def hold(self, before: int, now: int) -> bool:
        """A stream's unfinished event went from ``before`` to ``now`` bytes; False when it
        grew and the sum is past the limit (the stream is then ended, and gives its bytes
        back with ``hold(now, 0)``)."""
        self.held += now - before
        return now <= before or self.held <= self.limit
