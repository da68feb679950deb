"""The WebSocket connections' own metrics, on the gateway's registry.

Each response on a connection is a stream like any other (``gateway_streams_total``
and the rest, through the observers); what is the connection's alone is
counted here: how many are open, and why each ended (``close``, a closed
vocabulary: ``gateway.proxy.websocket.Close``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.observe.table import Declared, build

__all__ = ["WsMetrics"]


class WsMetrics:
    open = Declared(
        "gateway_active_websocket_connections",
        Gauge,
        "WebSocket connections open now.",
        ("route",),
        mode="livesum",
    )
    closed = Declared(
        "gateway_websocket_connections_total",
        Counter,
        "WebSocket connections, by why they ended (a limit's name, or who closed).",
        ("route", "close"),
    )

    def __init__(self, registry: CollectorRegistry) -> None:
        build(self, registry)

    def opened(self, route: str) -> None:
        self.open.labels(route).inc()

    def ended(self, route: str, close: str, accepted: bool) -> None:
        if accepted:
            self.open.labels(route).dec()
        self.closed.labels(route, close).inc()
