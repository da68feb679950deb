"""Tap: what the upstream sent on one stream, chunk by chunk, with its timing, bounded.

Only a route with ``capture`` set pays for it: the relay wraps its chunk
reader once per stream (``relay_stream``), so a route without captures runs
the same loop as before, with no test per chunk. The tap keeps the chunks
as the network delivered them (their boundaries are part of the evidence)
and the time each arrived, up to ``max_bytes`` in all (the chunk that
crosses the cap is kept up to it); past that it counts what it did not keep
and marks itself truncated. It also notes how the
upstream body ended as the reader saw it: a clean end (``eof``), a
transport or decoding error, or the relay stopping the stream (``stopped``:
a deadline, the client, the drain). Nothing here is redacted yet; the tap
lives in memory until its request is observed, and only the capture writer
turns it into a file (``gateway.capture.writer``), off the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import httpx

__all__ = ["Ending", "Tap"]

ReadChunk = Callable[[], Awaitable[bytes]]

#: How the upstream body ended, as the relay's reader saw it. ``open``: the
#: reader never saw an end (the guard reached its verdict first, or the relay
#: stopped between two reads).
Ending = Literal["eof", "transport_error", "decoding_error", "stopped", "open"]


@dataclass(slots=True, eq=False)
class Tap:
    """The upstream chunks of one stream and their arrival times, up to ``max_bytes``."""

    #: The request's start (``time.monotonic()``): every time is relative to it.
    origin: float
    max_bytes: int
    #: The protocol the stream was judged as (a registry name).
    protocol: str
    content_type: str
    #: Seconds from the request's start to the response head (when the tap began).
    head_at: float = field(init=False)
    #: (seconds from the request's start, bytes), in arrival order.
    chunks: list[tuple[float, bytes]] = field(init=False, default_factory=list)
    kept_bytes: int = field(init=False, default=0)
    received_bytes: int = field(init=False, default=0)
    received_chunks: int = field(init=False, default=0)
    truncated: bool = field(init=False, default=False)
    ending: Ending = field(init=False, default="open")

    def __post_init__(self) -> None:
        self.head_at = time.monotonic() - self.origin

    def wrap(self, read: ReadChunk) -> ReadChunk:
        """A reader that records what ``read`` returns (and how it ends) on the way."""

        async def tapped() -> bytes:
            try:
                chunk = await read()
            except httpx.DecodingError:
                self.ending = "decoding_error"
                raise
            except httpx.TransportError:
                self.ending = "transport_error"
                raise
            except asyncio.CancelledError:
                self.ending = "stopped"
                raise
            self.take(chunk, time.monotonic())
            return chunk

        return tapped

    def take(self, chunk: bytes, now: float) -> None:
        """Record one chunk read at ``now`` (``b""``: the body ended cleanly)."""
        if not chunk:
            if self.ending == "open":
                self.ending = "eof"
            return
        self.received_bytes += len(chunk)
        self.received_chunks += 1
        if self.truncated:
            return
        room = self.max_bytes - self.kept_bytes
        if len(chunk) > room:
            # The file says so: its last chunk is only the part that fitted.
            self.truncated = True
            chunk = chunk[:room]
            if not chunk:
                return
        self.kept_bytes += len(chunk)
        self.chunks.append((now - self.origin, chunk))
