"""Reading an answer on after its client left: the one mechanism for it.

While an exchange's ``detach`` is set, a client that leaves does not stop the
request (``Exchange.client_gone``): its owner starts a ``Detachment``. From then
on the relay goes on at the upstream's pace, every send is kept from the client
(``skip``) and goes only where its owner records it, until the answer ends or
the deadline given (then ``total_timeout``). The record says ``detached``; the
bytes that never reached the client are taken out of its ``bytes_out``;
``gateway_detached_streams{route}`` counts the answers being read on.

Two owners: a resumable stream (``gateway.resume.recorder``: the answer goes on
into its log, for the client to resume) and a cache leader with followers
(``gateway.cache``: the answer goes on into its log, for them and the entry).
One exchange has **one** detachment, whoever starts it (``Detachment.of``): it
is a gate in front of the client's own send, made by the first layer that
records (the innermost), so every layer above it, both recorders on a route
with resume and the cache, goes on seeing every send, the end included.
"""

from __future__ import annotations

import asyncio

from starlette.types import Message

from gateway.guard import Reason
from gateway.observe import Metrics
from gateway.proxy.exchange import Exchange

__all__ = ["Detachment"]


class Detachment:
    __slots__ = ("_timer", "active", "exchange", "metrics", "unsent")

    def __init__(self, exchange: Exchange, metrics: Metrics) -> None:
        self.exchange = exchange
        self.metrics = metrics
        self.active = False
        self.unsent = 0  # bytes "sent" while detached: they never reached the client
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, exchange: Exchange, metrics: Metrics) -> Detachment:
        """The exchange's one detachment; the first call puts its gate in front of the
        send the exchange has now (call it before wrapping ``exchange.send``)."""
        found = exchange.detachment
        if isinstance(found, Detachment):
            return found
        detachment = exchange.detachment = cls(exchange, metrics)
        client = exchange.send

        async def gate(message: Message) -> None:
            if not detachment.skip(message):
                await client(message)

        exchange.send = gate
        return detachment

    def start(self, until: float) -> None:
        """The client left: read on without it until the loop time ``until`` at most."""
        if self.active:
            return
        self.active = True
        exchange = self.exchange
        exchange.record.detached = True
        self.metrics.detached(exchange.route.name, 1)
        self._timer = asyncio.get_running_loop().call_at(until, exchange.stop, Reason.TOTAL_TIMEOUT)

    def skip(self, message: Message) -> bool:
        """Whether ``message`` is kept from the client (it left)."""
        if not self.active:
            return False
        if message["type"] == "http.response.body":
            self.unsent += len(message.get("body", b""))
        return True

    def end(self) -> None:
        """The answer ended (or failed): the deadline and the gauge let go."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.active:
            self.metrics.detached(self.exchange.route.name, -1)
            self.exchange.record.bytes_out -= self.unsent
            self.active = False
            self.unsent = 0
