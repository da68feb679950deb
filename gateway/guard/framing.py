"""Framings: how a protocol's stream is cut into events, and what its trailer may hold.

A framing names its media type, builds its decoder from the two byte
budgets, and says whether it has comment lines (the SSE trailer's
``: gateway outcome=...`` line; NDJSON has none, so its trailer is the error
line alone, and a complete stream gets nothing; AWS's binary event stream has
none either). Every protocol contract
names its framing (``Contract.framing``), so the relay, captures, replay and
the probe pick the decoder and media type from it and never name one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.guard.decoder import Decoder
from gateway.guard.eventstream import EventStreamDecoder
from gateway.guard.ndjson import NDJSONDecoder
from gateway.guard.sse import DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_LINE_BYTES, SSEDecoder

__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "DEFAULT_MAX_LINE_BYTES",
    "EVENTSTREAM",
    "FRAMINGS",
    "NDJSON",
    "SSE",
    "Framing",
    "framing_of",
]


@dataclass(frozen=True, slots=True)
class Framing:
    """One stream framing: media type, decoder, and what its trailer may carry."""

    name: str
    #: The response media type (no parameters) that marks a stream of this framing.
    media_type: str
    #: Build a decoder from ``max_line_bytes`` and ``max_event_bytes``.
    new_decoder: Callable[[int, int], Decoder]
    #: Whether the framing has comment lines (the trailer's outcome line).
    comments: bool
    #: Whether an answer of this media type is a stream only when the request asked
    #: for one (NDJSON is also a bulk format, e.g. a model download's progress).
    announced_only: bool

    def is_stream(self, content_type: str) -> bool:
        """Whether a response's ``Content-Type`` is this framing's media type."""
        return content_type.startswith(self.media_type)


SSE = Framing(
    name="sse",
    media_type="text/event-stream",
    new_decoder=SSEDecoder,
    comments=True,
    announced_only=False,
)
NDJSON = Framing(
    name="ndjson",
    media_type="application/x-ndjson",
    new_decoder=NDJSONDecoder,
    comments=False,
    announced_only=True,
)
#: AWS's binary event stream (Bedrock Runtime): frames with lengths and CRCs; no comments.
EVENTSTREAM = Framing(
    name="eventstream",
    media_type="application/vnd.amazon.eventstream",
    new_decoder=EventStreamDecoder,
    comments=False,
    announced_only=False,
)

#: Every framing: a media type of one of them is a stream, never one whole JSON text.
FRAMINGS: tuple[Framing, ...] = (SSE, NDJSON, EVENTSTREAM)


def framing_of(content_type: str) -> Framing | None:
    """The framing whose media type ``content_type`` is (None: no stream framing's)."""
    for framing in FRAMINGS:
        if framing.is_stream(content_type):
            return framing
    return None
