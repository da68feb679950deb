"""The stream slots: a streamed request counted against the concurrency caps.

A stage (``gateway.proxy.stages``): a request that asks for a stream takes a
slot of the gateway's and its route's ``max_concurrent_streams`` (refused 503
with ``Retry-After`` when one is full) for as long as the rest of its way runs,
whoever answers it (the upstream, or the cache). A stream the request did not
announce is counted by the relay once its answer shows it (``counted``).
"""

from __future__ import annotations

from gateway.observe import Metrics
from gateway.proxy.admission import Admission, Refused
from gateway.proxy.exchange import Exchange
from gateway.proxy.refusal import send_refusal
from gateway.proxy.stages import Next

__all__ = ["StreamSlots"]


class StreamSlots:
    """Counts streams in and out of the caps."""

    def __init__(self, admission: Admission, metrics: Metrics) -> None:
        self.admission = admission
        self.metrics = metrics

    async def __call__(self, exchange: Exchange, call_next: Next) -> None:
        route = exchange.route
        if exchange.record.stream:
            try:
                self.admission.start_stream(route)
            except Refused as refused:
                await send_refusal(exchange, refused, self.metrics)
                return
            exchange.counted = True
            self.metrics.stream_started(route.name)
        try:
            await call_next(exchange)
        finally:
            # A cancel (the client gone, the drain) must never leave the slot taken.
            if exchange.counted:
                exchange.counted = False
                self.admission.end_stream(route)
                self.metrics.stream_ended(route.name)
