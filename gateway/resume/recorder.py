"""The recorder: one resumable stream's bytes into its log, and its detached life.

A ``Recorder`` stands in the exchange's ``send`` for one guarded stream of a route
with ``resume = true`` (nothing is wrapped elsewhere: a stream without resume pays
nothing). On the way to the client it

- adds ``X-Gateway-Stream-Id`` to the response head;
- reads the stream's whole events from its guard (``Exchange.events``,
  ``gateway.guard.whole``), appends them to the log and waits until the store
  wrote them (``Writer.flush``: one batch for every stream of the process)
  *before* the client gets them, so that whatever a client counted can be
  resumed, even from another replica after this one died; a failing store does
  not hold the client up (its writer logs them once it is back);
- keeps the last send, the trailer, for the log's end.

Once the head is out, on a route with ``on_client_disconnect = "finish"`` (the
default with resume), a client that leaves no longer stops the request
(``Exchange.detach``): the recorder *detaches*: the relay goes on at the
upstream's pace, every send now goes to the log alone, for at most
``detach_max_seconds`` (then ``total_timeout``; ``gateway.proxy.detach``). A
client that stalls past
``timeouts.client_send`` is cut (``client_stalled``) and detaches the same way.
A cancel request (``POST .../cancel``, seen by the store) stops the request with
``cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

from starlette.types import Message, Send

from gateway.guard import Event, Reason, StreamGuard
from gateway.observe import Metrics
from gateway.policy.errors import RequestError
from gateway.proxy.connection import abort_connection
from gateway.proxy.detach import Detachment
from gateway.proxy.exchange import Exchange
from gateway.store import End, StoreError, Writer

__all__ = ["STREAM_ID_HEADER", "Recorder"]

STREAM_ID_HEADER = b"x-gateway-stream-id"


class Recorder:
    def __init__(
        self,
        exchange: Exchange,
        writer: Writer,
        guard: StreamGuard,
        metrics: Metrics,
        store_size: Callable[[], int],
        *,
        annotate: bool = True,
    ) -> None:
        self.store_size = store_size
        self.exchange = exchange
        self.annotate = annotate
        #: A Responses stream: told its response id once an event shows it (for a
        #: Responses retrieve with ``stream=true`` to find the log).
        self.on_response_id: Callable[[str, str, float], None] | None = None
        self.writer = writer
        self.guard = guard
        self.metrics = metrics
        self.detachment = Detachment.of(exchange, metrics)  # its gate, before the wrap
        self._trailer: bytes | None = None
        #: Events were appended that the next send must wait for (logged first).
        self._unlogged = False
        self._send: Send = exchange.send
        exchange.send = self.send
        exchange.events.add(self)
        writer.on_cancel = self._cancel

    def check(self, piece: bytes, event: Event) -> None:
        return None

    def take(self, piece: bytes, event: Event | None) -> None:
        """One whole event of the stream: into the log before the client gets it."""
        self.writer.append(piece)
        self._unlogged = True
        if self.on_response_id is not None:
            self._find_response_id([piece])

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.body":
            if not message.get("more_body", False):
                self._trailer = message.get("body", b"")
        elif kind == "http.response.start":
            headers = [*message.get("headers", []), (STREAM_ID_HEADER, self.writer.id.encode())]
            message = {**message, "headers": headers}
            if self.exchange.route.config.detaches:
                # From now on the client knows the stream's id: leaving, it detaches.
                self.exchange.detach = self.detach
        if self._unlogged and not self.detachment.active:
            # Logged before sent: a client never holds an event its log lacks (a
            # cursor it got is always one the log can serve, whoever dies).
            self._unlogged = False
            with contextlib.suppress(StoreError):
                await self.writer.flush()
        try:
            await self._send(message)
        except asyncio.CancelledError:
            exchange = self.exchange
            if (
                exchange.stop_reason is not Reason.CLIENT_STALLED
                or exchange.detach is None
                or not exchange.claim_stop()
            ):
                raise
            # The client stopped reading: it is cut, the answer goes on into the log.
            exchange.stop_reason = None
            exchange.record.error = RequestError.CLIENT_STALLED
            abort_connection(exchange.scope)
            self.detach()

    def _find_response_id(self, events: list[bytes]) -> None:
        retrieval = self.exchange.spec.retrieval
        assert retrieval is not None  # (only a retrievable protocol's recorder looks)
        for event in events:
            response_id = retrieval.id_of(event)
            if response_id is not None:
                assert self.on_response_id is not None
                route = self.exchange.route
                # The name outlives the log's last write (a log lives at most its
                # route's total deadline, or its detached time, and then its TTL).
                ttl = (
                    route.config.resume_ttl_seconds
                    + route.timeouts.total
                    + route.config.detach_max_seconds
                )
                self.on_response_id(response_id, self.writer.id, ttl)
                self.on_response_id = None
                return

    def detach(self) -> None:
        """The client left: go on without it, for at most ``detach_max_seconds``."""
        exchange = self.exchange
        loop = asyncio.get_running_loop()
        at = min(loop.time() + exchange.route.config.detach_max_seconds, exchange.total_deadline)
        self.detachment.start(at)

    def _cancel(self) -> None:
        self.exchange.stop(Reason.CANCELLED)

    async def close(self) -> None:
        """The stream ended (or failed): its end goes into the log."""
        exchange = self.exchange
        exchange.detach = None
        exchange.events.remove(self)
        self.detachment.end()
        trailer = self._trailer
        verdict = exchange.record.verdict
        if trailer is None:  # never sent (the connection was dropped): the log has it
            trailer = b""
            if self.guard.verdict is not None and self.annotate:
                trailer = self.guard.withheld + self.guard.annotation(
                    exchange.record.request_id, exchange.record.continued
                )
        fields = {}
        if verdict is not None:
            fields = {"outcome": str(verdict.outcome), "reason": str(verdict.reason)}
            usage = exchange.record.usage or verdict.usage
            if usage is not None:
                fields["usage"] = json.dumps([usage.input_tokens, usage.output_tokens])
        # A store that fails here: the lease runs out, a resume ends the stream owner_lost.
        with contextlib.suppress(StoreError):
            await self.writer.finish(End(exchange.events.pending + trailer, fields))
        self.metrics.store_bytes(self.store_size())
