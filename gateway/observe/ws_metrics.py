"""The WebSocket connections' own metrics, on the gateway's registry.

Each response on a connection is a stream like any other (``gateway_streams_total``
and the rest, through the observers); what is the connection's alone is
counted here: how many are open, and why each ended (``close``, a closed
vocabulary: ``gateway.proxy.websocket.Close``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["WsMetrics"]


class WsMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.open = Gauge(
            "gateway_active_websocket_connections",
            "WebSocket connections open now.",
            ["route"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.closed = Counter(
            "gateway_websocket_connections_total",
            "WebSocket connections, by why they ended (a limit's name, or who closed).",
            ["route", "close"],
            registry=registry,
        )

    def opened(self, route: str) -> None:
        self.open.labels(route).inc()

    def ended(self, route: str, close: str, accepted: bool) -> None:
        if accepted:
            self.open.labels(route).dec()
        self.closed.labels(route, close).inc()
