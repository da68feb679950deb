"""The stage that holds an issued key to the models it may ask for.

A key issued with ``models`` is refused (403 ``model_not_allowed``, in the
route's error shape, nothing sent upstream) for a request naming another
model, or none. Every other request goes on untouched. The key's models are
read from this process's copy of the keys (``Registry``), so a change to
them holds from the next request.
"""

from __future__ import annotations

from gateway.keys.registry import Registry
from gateway.proxy.errors import send_error
from gateway.proxy.exchange import Exchange
from gateway.proxy.stages import Next

__all__ = ["KeyModels"]


class KeyModels:
    """Refuses a model an issued key may not use."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    async def __call__(self, exchange: Exchange, call_next: Next) -> None:
        key_id = exchange.caller.key_id
        key = self.registry.keys.get(key_id) if key_id is not None else None
        if key is None or key.models is None or exchange.record.model in key.models:
            await call_next(exchange)
            return
        record = exchange.record
        record.status = 403
        record.rejected = "forbidden"
        record.bytes_out += await send_error(
            exchange.send,
            exchange.spec.name,
            403,
            "This API key may not use this model.",
            "permission_error",
            "model_not_allowed",
            record.request_id,
        )
