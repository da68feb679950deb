"""What a stream store holds and promises: the API both backends implement.

A store keeps one bounded **log** per stream, keyed by an opaque id of at
least 128 random bits (``new_stream_id``). A log holds, in order:

- the bytes of each whole event as it was relayed (event N is the N-th, from 1);
- the stream's **owner** (a named client, or a digest of a credential) and a few
  string ``meta`` fields the writer chose (content type, protocol, route...);
- while it is being written, a **lease** held by its one writer and renewed by it;
  a log whose lease ran out with no end is an orphan, that ``adopt`` may take over;
- at the end, one **End** entry (the trailer every reader gets after the last event,
  and string fields such as the verdict and the usage).

A log is bounded per stream (``max_bytes``: past it, the log *stops*: later events
are counted but not kept, and a read beyond the kept ones is ``Gone``), in total
(the store's byte budget: past it, ``open`` answers None) and in time: every key
expires ``ttl`` seconds after the last write (finished or orphaned alike).

A reader asks for the events after a cursor (the number of whole events it has)
and may wait for more (the live tail). Nothing here knows HTTP, SSE or a
protocol: the events are opaque bytes, the end's fields opaque strings.
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from gateway.store.budget import Budget

__all__ = [
    "Batch",
    "BeyondEnd",
    "End",
    "Gone",
    "NewLog",
    "StoreError",
    "StreamInfo",
    "StreamStore",
    "Writer",
    "new_stream_id",
]

#: Events a read returns at most at once.
READ_LIMIT = 512


def new_stream_id() -> str:
    """An opaque stream id: 160 random bits, URL-safe (27 characters)."""
    return secrets.token_urlsafe(20)


class StoreError(Exception):
    """The store could not be asked (Redis unreachable, slow, or it failed)."""


class Gone(Exception):
    """The cursor lies in a part of the stream that is no longer kept (the log stopped
    at its byte cap before it)."""


class BeyondEnd(Exception):
    """The cursor lies beyond the events the stream has (so far)."""


@dataclass(frozen=True, slots=True)
class End:
    """A log's final entry: ``trailer`` goes to every reader after the last event;
    ``fields`` are the writer's (verdict, usage, ...), opaque to the store."""

    trailer: bytes
    fields: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """A log as it stands."""

    owner: str
    meta: Mapping[str, str]
    #: Events relayed so far (kept or not).
    total: int
    #: Events kept (``total`` unless the log stopped at its byte cap).
    kept: int
    #: Bytes kept.
    size: int
    stopped: bool
    #: A writer holds the lease (None after the end).
    leased: bool
    #: Someone asked the writer to stop (``cancel``).
    cancel: bool
    end: End | None


@dataclass(frozen=True, slots=True)
class Batch:
    """Events after a cursor: ``events[i]`` is event ``after + 1 + i``; ``end`` is set
    when the batch reaches the log's end (no event follows)."""

    after: int
    events: list[bytes]
    end: End | None = None


class Writer(ABC):
    """The one writer of a log, holder of its lease (renewed in the background until
    ``finish`` or ``release``). ``append`` does no I/O: the backend writes in batches."""

    def __init__(self, stream_id: str, max_bytes: int, total: int = 0, size: int = 0) -> None:
        self.id = stream_id
        self.max_bytes = max_bytes
        #: Events appended (kept or not), including those before an ``adopt``.
        self.total = total
        #: Events kept.
        self.kept = total
        #: Bytes kept.
        self.size = size
        #: The log stopped at its byte cap (or at the store's total budget).
        self.stopped = False
        #: A reader asked for the stream to stop (seen at the last renewal or write).
        self.cancelled = False
        #: The lease was lost (another writer took the log over): writes are refused.
        self.lost = False
        self.finished = False
        #: Called (once) when the backend sees a cancel request for this stream.
        self.on_cancel: Callable[[], None] | None = None

    # A reader of a stream's whole events (``gateway.guard.whole``): its log.
    #: A log refuses no event: ``WholeEvents`` does not ask it to check one.
    checks: ClassVar[bool] = False

    def check(self, piece: bytes, event: object) -> None:
        """A log refuses no event."""
        return None

    def take(self, piece: bytes, event: object) -> None:
        """Log one whole event, as the client gets it."""
        self.append(piece)

    def append(self, event: bytes) -> None:
        """Log one whole event (no I/O; past the byte cap it is only counted)."""
        self.total += 1
        if self.stopped:
            return
        if self.size + len(event) > self.max_bytes or not self._room(len(event)):
            self.stopped = True
            self._stop()
            return
        self.kept += 1
        self.size += len(event)
        self._add_all([event])

    def extend(self, events: list[bytes]) -> None:
        """Log whole events in order, as ``append`` does each; when all fit, the budget
        is asked once and the backend keeps them at once (a relayed chunk's events)."""
        size = sum(map(len, events))
        if self.stopped or self.size + size > self.max_bytes or not self._room(size):
            for event in events:
                self.append(event)
            return
        self.total += len(events)
        self.kept += len(events)
        self.size += size
        self._add_all(events)

    @abstractmethod
    def _room(self, size: int) -> bool:
        """Whether the store's total budget takes ``size`` more bytes (and takes them)."""

    def _stop(self) -> None:  # noqa: B027 (a hook: most backends need nothing)
        """The log just stopped at its cap (nothing more is kept)."""

    def _cancelled(self) -> None:
        """The backend saw a cancel request: tell the owner once."""
        if not self.cancelled:
            self.cancelled = True
            if self.on_cancel is not None:
                self.on_cancel()

    @abstractmethod
    def _add_all(self, events: list[bytes]) -> None:
        """Keep events, in order (the caller counted them)."""

    @abstractmethod
    async def flush(self) -> None:
        """Wait until the log and everything appended so far are written."""

    @abstractmethod
    async def finish(self, end: End) -> None:
        """Write the end (after every appended event); the lease is given up."""

    @abstractmethod
    async def release(self) -> None:
        """Stop renewing the lease without an end (the log becomes an orphan once the
        lease runs out); for a writer that cannot finish."""


@dataclass(frozen=True, slots=True)
class NewLog:
    """What a log is opened with (``StreamStore.open``): its owner and meta, its byte
    cap, how long it lives after its last write, and its writer's lease (seconds)."""

    owner: str
    meta: Mapping[str, str]
    max_bytes: int
    ttl: float
    lease: float


class StreamStore(ABC):
    """A store of stream logs (``memory``: one process; ``redis``: shared)."""

    #: Whether it is across a network (shared by every worker and replica).
    remote: bool
    #: When the current outage of its backend started (monotonic seconds), None while
    #: it answers (the breaker: during an outage every call fails at once).
    down_since: float | None
    #: The total byte budget this process counts (``budget.Budget``).
    budget: Budget

    @property
    @abstractmethod
    def size(self) -> int:
        """Bytes this process holds in the store (its own accounting), for the gauge."""

    @abstractmethod
    async def prepare(self) -> None:
        """Get ready before the first request (connect, load scripts); may raise."""

    @abstractmethod
    async def available(self) -> None:
        """Return once the store answers again (at once unless its breaker is open)."""

    @abstractmethod
    async def close(self) -> None: ...

    def check(self) -> None:  # noqa: B027 (a hook: a store without a breaker never fails)
        """Raise StoreError at once while the backend is known to be away (the breaker)."""

    async def open(
        self,
        owner: str,
        meta: Mapping[str, str],
        *,
        max_bytes: int,
        ttl: float,
        lease: float,
        stream_id: str | None = None,
    ) -> Writer | None:
        """Start a new log (a fresh id unless ``stream_id``) and take its lease;
        None when the store's total budget is spent (``budget.Budget.room``). Others
        see the log once it is written (by the writer's first batch; ``flush``
        waits for it)."""
        if not self.budget.room(max_bytes):
            return None
        self.check()
        new = NewLog(owner, meta, max_bytes, ttl, lease)
        return await self._open(stream_id or new_stream_id(), new)

    @abstractmethod
    async def _open(self, stream_id: str, new: NewLog) -> Writer | None:
        """``open`` once the budget has room: make the log ``stream_id`` and its writer."""

    @abstractmethod
    async def adopt(self, stream_id: str, *, lease: float) -> Writer | None:
        """Take over an orphan (lease expired, no end): a writer that continues at its
        ``total`` events; None when the log has an end, a live lease, or is gone."""

    @abstractmethod
    async def info(self, stream_id: str) -> StreamInfo | None:
        """The log's state; None when there is no such log (never made, or expired)."""

    @abstractmethod
    async def read(self, stream_id: str, after: int, *, wait: float = 0.0) -> Batch | None:
        """The events after ``after`` (at most ``READ_LIMIT``), waiting up to ``wait``
        seconds while there are none yet and no end. None: no such log. Raises
        ``Gone`` (not kept) or ``BeyondEnd`` (``after`` above the events relayed)."""

    @abstractmethod
    async def cancel(self, stream_id: str) -> bool:
        """Ask the writer to stop (idempotent); False when there is no such log."""

    @abstractmethod
    async def delete(self, stream_id: str) -> None:
        """Forget the log now (before its TTL)."""

    @abstractmethod
    async def claim(self, name: str, stream_id: str, ttl: float) -> str | None:
        """Point ``name`` at ``stream_id`` unless it points somewhere already: None
        when claimed, else the id it points at (one leader per name)."""

    @abstractmethod
    async def resolve(self, name: str) -> str | None:
        """The stream ``name`` points at, or None."""

    @abstractmethod
    async def forget(self, name: str) -> None:
        """Remove the name ``name``."""
