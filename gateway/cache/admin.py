"""Invalidation by a client: ``DELETE {prefix}/gateway/cache/{key}``.

Only a named client with ``cache_admin = true`` may delete (403 for any
other), and only an entry of its own on this route, or one of the route's
scope; any other key, or one that names nothing, is 404: a client cannot
learn that another's key exists. The key is the one a MISS's
``X-Gateway-Cache-Key`` gave it.
"""

from __future__ import annotations

from gateway.cache.entry import entry_name
from gateway.observe import Metrics
from gateway.proxy.errors import send_error
from gateway.proxy.exchange import Exchange
from gateway.settings import ANONYMOUS
from gateway.store import StoreError, StreamStore

__all__ = ["ADMIN_PATH", "KEY_LENGTH", "delete_entry"]

#: Below a caching route's prefix.
ADMIN_PATH = "/gateway/cache/"
KEY_LENGTH = 64


async def delete_entry(
    store: StreamStore,
    metrics: Metrics,
    admins: frozenset[str],
    exchange: Exchange,
    key: str,
    owner: str,
) -> None:
    """``DELETE {prefix}/gateway/cache/{key}``: a named client with ``cache_admin``
    deletes an entry of its own (or of the route's scope); any other key is 404."""
    record = exchange.record
    name = exchange.caller.name
    if name == ANONYMOUS or name not in admins:
        await _answer(exchange, 403, "This client may not delete cache entries.")
        return
    found = None
    if len(key) == KEY_LENGTH and all(c in "0123456789abcdef" for c in key):
        try:
            stream_id = await store.resolve(entry_name(key))
            info = await store.info(stream_id) if stream_id is not None else None
        except StoreError:
            await _answer(exchange, 503, "The stream store is unavailable.")
            return
        if (
            info is not None
            and stream_id is not None
            and info.meta.get("route") == exchange.route.name
            and (info.owner == owner or info.meta.get("scope") == "route")
        ):
            found = stream_id
    if found is None:
        await _answer(exchange, 404, "No such cache entry.")
        return
    if await store.resolve(entry_name(key)) == found:
        await store.forget(entry_name(key))
    await store.delete(found)
    metrics.cached(exchange.route.name, "deleted")
    record.status = 204
    await exchange.send(
        {
            "type": "http.response.start",
            "status": 204,
            "headers": [(b"x-request-id", record.request_id.encode())],
        }
    )
    await exchange.send({"type": "http.response.body", "body": b"", "more_body": False})


async def _answer(exchange: Exchange, status: int, message: str) -> None:
    record = exchange.record
    record.status = status
    type_ = "permission_error" if status == 403 else "not_found_error"
    record.bytes_out += await send_error(
        exchange.send,
        exchange.spec.name,
        status,
        message,
        type_,
        "cache_entry" if status == 404 else "cache_admin",
        record.request_id,
    )
