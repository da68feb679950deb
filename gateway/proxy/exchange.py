"""Exchange: one proxied request in flight, and what the relay's layers share about it.

The disconnect watcher, the deadlines and the drain act on an exchange by
``stop(reason)``, which cancels the request's task once; the layer that
catches the cancellation asks ``claim_stop()`` whether it was that stop
(then it finishes the request with the reason) or a foreign cancellation
(then it re-raises).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.types import Scope, Send

from gateway.guard import Outcome, Reason, StreamGuard, Verdict, WholeEvents
from gateway.observe import RequestRecord
from gateway.policy.routing import Route, Target
from gateway.protocols import ANY_PATH, ProtocolSpec
from gateway.proxy.admission import ANONYMOUS_CALLER, Caller
from gateway.proxy.partial import PartialEvents
from gateway.settings import Timeouts

#: What a stage hands the relay to be told that a guarded stream's head is about to go
#: out (its guard, its content type, and the ``gateway.proxy.continuation.Rescuer`` of a
#: route that continues cut streams, or None); it returns what the relay awaits once
#: the stream ended.
StreamOpener = Callable[[StreamGuard, str, Any], Awaitable[Callable[[], Awaitable[None]] | None]]

__all__ = ["AbortConnection", "Exchange", "HoldGate", "StreamOpener", "bare_verdict"]


class HoldGate(Protocol):
    """A stage's hold on a guarded stream's answer (``Exchange.hold_gate``): its head and
    events go out only once ``settled()`` says so, or the stream ended whole. Bounded:
    at most ``max_bytes`` held and ``seconds`` from the head; past either, ``gave_up``
    (``"bytes"`` or ``"time"``) gives the detail the stream ends with (``limit_exceeded``).
    An answer that fails while held goes out as nothing but its error (or its retry);
    ``restart()`` is told each time an answer's hold begins (a retry's is a new one)."""

    max_bytes: int
    seconds: float

    def restart(self) -> None: ...

    def settled(self) -> bool: ...

    def gave_up(self, why: str) -> str: ...


class AbortConnection(Exception):
    """Raised to make the server drop the connection (response headers already sent)."""


@dataclass(slots=True, eq=False)
class Exchange:
    """One request in flight."""

    task: asyncio.Task[Any]
    route: Route
    scope: Scope
    send: Send
    record: RequestRecord
    spec: ProtocolSpec = ANY_PATH
    withhold_usage: bool = False
    total_deadline: float = 0.0
    counted: bool = False  # counted in the active streams (admission, gauge)
    #: The request body until the relay takes it (a rewritten body replaces the client's).
    body: bytes = b""
    held_copies: int = 0  # bytes of rewritten bodies counted in the body budget
    stop_reason: Reason | None = None
    response_done: bool = False
    #: Who sent it; a gateway key that authenticated it is not forwarded upstream.
    caller: Caller = ANONYMOUS_CALLER
    #: Set while a resumable stream is relayed: a client that leaves detaches it (the
    #: answer is read on into its log) instead of stopping the request.
    detach: Callable[[], None] | None = None
    #: The exchange's one ``Detachment`` (``gateway.proxy.detach``), shared by every
    #: layer that reads an answer on (resume, the cache), made by the first of them.
    detachment: Any = None
    #: What the request is, known before the stages run: the path under the route's
    #: prefix, where the client's path asked to go, and the body's small top-level
    #: members (None when it is not a JSON object or was not read).
    rest: str = ""
    target: Target | None = None
    request_json: dict[str, Any] | None = None
    #: The readers of the answer's whole events (``gateway.guard.whole``): the stages
    #: register them (log writers, checks); every guard of the answer hands them events.
    events: WholeEvents = field(default_factory=WholeEvents)
    #: The stages told when a guarded stream starts (a resume's log).
    on_stream: list[StreamOpener] = field(default_factory=list)
    #: An earlier stage knows the answer costs no tokens (a whole cached answer will
    #: serve it): the limits count it as a request that reserves none.
    free: bool = False
    #: Set by the stage that took ``free`` at its word: what a later stage calls when the
    #: request turns out not free after all (the cached answer expired before it was
    #: served); False: the request was refused (answered), it goes no further.
    not_free: Callable[[], Awaitable[bool]] | None = None
    #: The worker's bound on unfinished events' bytes (``gateway.proxy.partial``).
    partial: PartialEvents | None = None
    #: This stream's bytes of an unfinished event, as held against ``partial``.
    partial_held: int = 0
    #: Words the stages add to the stream's trailer comment (``key=value``), each asked
    #: once the verdict is known, just before the trailer is written.
    trailer_words: list[Callable[[], str]] = field(default_factory=list)
    #: A stage that holds a stream's answer until it says so (``HoldGate``), or None.
    hold_gate: HoldGate | None = None
    #: The deadlines of the attempt being relayed: the route's, with its upstream's overrides.
    timeouts: Timeouts = field(init=False)

    def __post_init__(self) -> None:
        self.timeouts = self.route.timeouts

    def release(self, send: Send) -> None:
        """The request is over: drop what the stages hung on it (send wrappers, detach
        hooks, readers, trailer words), each of which refers back to the exchange. Once
        none does, the request's objects are freed as soon as it ends, not left in
        reference cycles for the garbage collector to find; ``send``: the client's own."""
        self.send = send
        self.detach = None
        self.detachment = None
        self.not_free = None
        self.hold_gate = None
        self.events.clear()
        self.on_stream.clear()
        self.trailer_words.clear()

    def stop(self, reason: Reason) -> None:
        """Stop the request for ``reason`` (first caller wins; nothing once it is done)."""
        if self.stop_reason is None and not self.response_done:
            self.stop_reason = reason
            self.task.cancel()

    def client_gone(self) -> None:
        """The client's connection was lost."""
        if self.detach is not None:
            self.detach()
        else:
            self.stop(Reason.CLIENT_DISCONNECT)

    def claim_stop(self) -> bool:
        """Call in ``except CancelledError``: True when the cancellation was this
        exchange's own ``stop`` (the task is un-cancelled, the caller finishes the
        request with ``stop_reason``); False when it was not ours (re-raise it)."""
        if self.stop_reason is None:
            return False
        self.task.uncancel()
        return True


def bare_verdict(reason: Reason, detail: str = "") -> Verdict:
    """The verdict of a stream that ended before the guard saw any of it."""
    return Verdict(outcome=Outcome.INCOMPLETE, reason=reason, detail=detail)
