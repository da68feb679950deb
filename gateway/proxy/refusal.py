"""Answering a request refused before any upstream (admission, a full stream cap)."""

from __future__ import annotations

from gateway.observe import Metrics
from gateway.proxy.admission import Refused
from gateway.proxy.errors import send_error
from gateway.proxy.exchange import Exchange

__all__ = ["send_refusal"]


async def send_refusal(exchange: Exchange, refused: Refused, metrics: Metrics) -> None:
    """Answer ``refused`` in the request's protocol's shape, and count it."""
    record = exchange.record
    record.rejected = refused.label
    metrics.reject(refused.label)
    record.status = refused.status
    record.bytes_out += await send_error(
        exchange.send,
        exchange.spec.name,
        refused.status,
        refused.message,
        refused.type_,
        refused.label,
        record.request_id,
        refused.headers,
    )
