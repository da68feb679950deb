"""One resumable stream's log on its way: the recorder, and its detached life.

For one guarded stream of a route with ``resume = true`` (nothing is wrapped
elsewhere: a stream without resume pays nothing), ``StreamLog`` puts the one
recorder (``gateway.streamlog.Recorder``) in the exchange's ``send``, with
resume's two options:

- it adds ``X-Gateway-Stream-Id`` to the response head (for the client only);
- every send waits until the store wrote what the client got before it
  (``Writer.flush``: one batch for every stream of the process), so that
  whatever a client counted can be resumed, even from another replica after
  this one died; a failing store does not hold the client up (its writer logs
  them once it is back);
- a client that stalls past ``timeouts.client_send`` is cut (``client_stalled``)
  and the stream detaches, as when it leaves.

On a route with ``on_client_disconnect = "finish"`` (the default with resume),
a client that leaves no longer stops the request (``Exchange.detach``): the
stream *detaches*: the relay goes on at the upstream's pace, every send now
goes to the log alone, for at most ``detach_max_seconds`` (then
``total_timeout``; ``gateway.proxy.detach``). A cancel request (``POST
.../cancel``, seen by the store) stops the request with ``cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

from gateway.guard import Reason, StreamGuard
from gateway.observe import Metrics
from gateway.proxy.detach import Detachment
from gateway.proxy.exchange import Exchange
from gateway.store import End, StoreError, Writer
from gateway.streamlog import Recorder

__all__ = ["STREAM_ID_HEADER", "StreamLog"]

STREAM_ID_HEADER = b"x-gateway-stream-id"


class StreamLog:
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
        self.recorder = Recorder(
            exchange,
            writer,
            [(STREAM_ID_HEADER, writer.id.encode())],
            self.detachment,
            logged_first=True,
            on_stall=self.detach,
        )
        if exchange.route.config.detaches:
            # The client gets the stream's id with the head: leaving, it detaches.
            exchange.detach = self.detach
        writer.on_cancel = self._cancel

    def watch_response_id(self, on_response_id: Callable[[str, str, float], None]) -> None:
        """Tell ``on_response_id`` the stream's response id once an event shows it."""
        self.on_response_id = on_response_id
        self.recorder.watch = self._find_response_id

    def _find_response_id(self, event: bytes) -> None:
        retrieval = self.exchange.spec.retrieval
        assert retrieval is not None  # (only a retrievable protocol's log looks)
        response_id = retrieval.id_of(event)
        if response_id is not None and self.on_response_id is not None:
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
            self.recorder.watch = None

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
        trailer = self.recorder.trailer(True)
        verdict = exchange.record.verdict
        if not self.recorder.ended:  # never sent (the connection was dropped): logged
            trailer = exchange.events.pending
            if self.guard.verdict is not None and self.annotate:
                trailer += self.guard.withheld + self.guard.annotation(
                    exchange.record.request_id, exchange.record.continued
                )
        fields = {}
        if verdict is not None:
            fields = {"outcome": str(verdict.outcome), "reason": str(verdict.reason)}
            usage = exchange.record.usage or verdict.usage
            if usage is not None:
                fields["usage"] = json.dumps([usage.input_tokens, usage.output_tokens])
        # A store that fails here: the lease runs out, a resume ends the stream owner_lost.
        try:
            with contextlib.suppress(StoreError):
                await self.writer.finish(End(trailer, fields))
        finally:
            # Its hooks refer back to this log (and it to the request): let them go, so
            # that the request's objects are freed when it ends (no reference cycle).
            self.writer.on_cancel = None
            self.recorder.on_stall = None
            self.recorder.watch = None
            self.on_response_id = None
        self.metrics.store_bytes(self.store_size())
