"""Whole events: the relayed bytes cut where each event ends, for the stream's readers.

The guard's decoder knows where every event ends, so the guard hands out,
beside the bytes it lets through, those bytes cut into whole events, as
wsproto's ``FrameProtocol.received_frames()`` hands out whole frames. No
reader of a stream lexes its bytes a second time.

A *whole event* is the bytes the client got for one event, as relayed:

- SSE: a block up to and including its blank line, with the comment lines and
  blank lines that came before it; a block that dispatches nothing (comments
  only, such as ``: ping``, or fields without ``data``) is a whole event too;
- NDJSON: a line with its LF (blank lines join the line after them);
- a binary framing (AWS's event stream): one frame, by the same rule.

The API, for a stage that reads a stream (a log writer, a schema check):

- ``WholeEvents`` is the list of a response's readers (``Exchange.events``):
  ``add(consumer)``. Every guard of one answer (a continuation's too) hands
  its events to the same list, in order; with no reader the guard does none
  of this (one truth test per upstream read).
- An ``EventConsumer`` has two methods, called by the guard while it judges a
  read, before the relay sends the bytes (so a log holds whatever a client
  counted):

  - ``check(piece, event)``: asked about each decoded event the contract lets
    through (``event`` is the decoder's ``Event``: its type and data), before
    any reader takes it. Returning a ``Refusal(reason, detail)`` refuses it:
    the event is withheld and the stream ends there, as at an event the
    contract rejects: the verdict is incomplete with ``reason``, and the relay
    ends the stream with the protocol's error event and trailer. Readers that
    only record return None. While it is asked, ``WholeEvents.parsed`` is the
    event's JSON value as its contract parsed it (None: not parsed): a reader
    never parses the event's data a second time; ``WholeEvents.delta_text()``
    asks the contract for the event's answer text, when it is a delta of text
    and nothing else.
  - ``take(piece, event)``: a whole event every reader accepted (``event`` is
    None for a block that dispatched nothing, which is never checked). A reader
    that only checks says ``takes = False`` and is never handed one.

- A continuation's events, as the gateway renders them past the splice
  (``relayed``), are asked of the readers too: a check judges the continued
  answer as one document with what came before the cut.
- ``pending`` is what the client got after the last whole event (comment
  lines of a block not ended yet): a log puts it before its trailer.
- While the relay holds an answer's head (a retry is still possible), what
  readers take waits (``hold``); ``begin`` hands it to them once the head is
  out, or drops it when the answer relayed is not the held one: a reader
  never takes an event before the response head, nor one no client got.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from gateway.guard.contract import Contract
from gateway.guard.decoder import Event
from gateway.guard.sse import SSEDecoder
from gateway.guard.verdict import Reason

__all__ = ["EventConsumer", "Refusal", "WholeEvents"]


class Refusal(NamedTuple):
    """Why a reader refused an event: the stream ends there with ``reason``."""

    reason: Reason
    detail: str = ""


class EventConsumer(Protocol):
    """One reader of a stream's whole events, registered by a stage."""

    def check(self, piece: bytes, event: Event) -> Refusal | None:
        """None to let ``event`` through; a refusal ends the stream before it."""

    def take(self, piece: bytes, event: Event | None) -> None:
        """One whole event, as the client gets it."""


class WholeEvents:
    """The readers of one response's whole events, and the bytes of an unended one."""

    __slots__ = (
        "_checkers",
        "_contract",
        "_pending",
        "_queue",
        "_takers",
        "consumers",
        "parsed",
        "streaming",
    )

    def __init__(self) -> None:
        self.consumers: list[EventConsumer] = []
        #: The readers that may refuse an event (one that never does sets ``checks = False``).
        self._checkers: list[EventConsumer] = []
        #: The readers that take what they accepted (a check alone sets ``takes = False``).
        self._takers: list[EventConsumer] = []
        self._pending: list[bytes] = []
        #: While the head is held: the whole events judged, not yet taken.
        self._queue: list[tuple[bytes, Event | None]] | None = None
        #: A guarded stream's head is out: its body is handed out here, event by event.
        self.streaming = False
        #: The JSON value of the event being offered, as its contract parsed it (None:
        #: not parsed): a reader's ``check`` reads it here instead of parsing again.
        self.parsed: Any = None
        #: The contract that judged the event being offered (None: the gateway's own).
        self._contract: Contract | None = None

    def __bool__(self) -> bool:
        return bool(self.consumers)

    def add(self, consumer: EventConsumer) -> None:
        self.consumers.append(consumer)
        if getattr(consumer, "checks", True):
            self._checkers.append(consumer)
        if getattr(consumer, "takes", True):
            self._takers.append(consumer)

    def remove(self, consumer: EventConsumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if consumer in self._checkers:
            self._checkers.remove(consumer)
        if consumer in self._takers:
            self._takers.remove(consumer)

    def clear(self) -> None:
        """The response is over: its readers are let go (they refer back to the request,
        and the request to them: without this, only the garbage collector frees them)."""
        self.consumers.clear()
        self._checkers.clear()
        self._takers.clear()
        self._pending.clear()
        self._queue = None
        self.parsed = None
        self._contract = None

    @property
    def pending(self) -> bytes:
        """Bytes relayed after the last whole event (a block not ended yet)."""
        return b"".join(self._pending)

    def hold(self) -> None:
        """The head is held: what readers take waits for ``begin`` (anything held or
        pending before is dropped: its answer was not relayed)."""
        self._queue = []
        self._pending = []

    def begin(self, held: bool) -> None:
        """The response head is out: the events of the held answer (``held``) go to the
        readers now; else what waited is dropped."""
        queue, self._queue = self._queue, None
        self.streaming = True
        if not held:
            self._pending = []
            return
        for piece, event in queue or ():
            self._take(piece, event)

    def relayed(self, pieces: list[bytes]) -> tuple[int, Refusal | None]:
        """Whole events relayed as rendered by the gateway (a continuation's joint: SSE
        blocks, one event each), asked of every reader as the upstream's are, then
        taken (with no event: a log writes the rendered bytes as they are). Returns
        how many were taken, and the refusal of the next one (None: all were): a
        continued answer is judged as one with what came before the cut."""
        for count, piece in enumerate(pieces):
            for event in SSEDecoder().feed(piece):
                self.parsed = None
                self._contract = None
                for consumer in self._checkers:
                    refusal = consumer.check(piece, event)
                    if refusal is not None:
                        return count, refusal
            self._take(self._piece(piece), None)
            self._pending = []
        return len(pieces), None

    def wait(self, data: bytes) -> None:
        """Relayed bytes that end no event yet."""
        if data:
            self._pending.append(data)

    def delta_text(self) -> str | None:
        """The offered event's answer text, when its contract says it is a delta of text
        and nothing else (``Contract.delta_text``); None otherwise."""
        contract = self._contract
        return contract.delta_text() if contract is not None else None

    def offer(self, data: bytes, event: Event, contract: Contract | None = None) -> Refusal | None:
        """``data`` ends ``event``, as ``contract`` judged it (its ``parsed`` JSON value):
        asked of every reader, then taken by each (None), or refused (``data`` is not
        relayed; nothing is taken)."""
        # once per event of every stream with readers: the helpers inlined
        self._contract = contract
        self.parsed = contract.parsed if contract is not None else None
        pending = self._pending
        piece = b"".join(pending) + data if pending else data
        for consumer in self._checkers:
            refusal = consumer.check(piece, event)
            if refusal is not None:
                return refusal
        if pending:
            self._pending = []
        queue = self._queue
        if queue is not None:
            queue.append((piece, event))
            return None
        for consumer in self._takers:
            consumer.take(piece, event)
        return None

    def quiet(self, data: bytes) -> None:
        """``data`` ends a block that dispatched no event."""
        piece = self._piece(data)
        self._pending = []
        self._take(piece, None)

    def _take(self, piece: bytes, event: Event | None) -> None:
        queue = self._queue
        if queue is not None:
            queue.append((piece, event))
            return
        for consumer in self._takers:
            consumer.take(piece, event)

    def _piece(self, data: bytes) -> bytes:
        pending = self._pending
        if not pending:
            return data
        return b"".join(pending) + data
