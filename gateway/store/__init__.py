"""The stream store: one bounded, expiring log of whole events per stream.

``api`` says what a store holds and promises (``StreamStore``, ``Writer``,
``Batch``, ``End``, ``StreamInfo``); ``memory`` keeps logs in this process,
``redis_store`` in Redis Streams (shared by every worker and replica);
``budget`` is the total byte budget; ``follow`` reads a log to its end with the
live tail. Nothing here knows HTTP or a protocol, nor imports anything of the
package but itself (the Redis clients are handed in: ``connection``): resumable
streams (``gateway.resume``) and the response cache build on it.
"""

from __future__ import annotations

from typing import Literal

from gateway.store.api import (
    Batch,
    BeyondEnd,
    End,
    Gone,
    StoreError,
    StreamInfo,
    StreamStore,
    Writer,
    new_stream_id,
)
from gateway.store.connection import RedisConnection
from gateway.store.follow import Vanished, follow
from gateway.store.memory import MemoryStore

__all__ = [
    "Batch",
    "BeyondEnd",
    "End",
    "Gone",
    "MemoryStore",
    "RedisConnection",
    "StoreError",
    "StreamInfo",
    "StreamStore",
    "Vanished",
    "Writer",
    "build_store",
    "follow",
    "new_stream_id",
]


def build_store(
    kind: Literal["memory", "redis"],
    *,
    max_bytes: int,
    redis: RedisConnection | None = None,
    timeout: float = 1.0,
) -> StreamStore:
    """The configured store (``stream_store``); Redis needs ``redis`` (its clients, built
    by the caller: the store imports nothing of the package but itself)."""
    if kind == "memory":
        return MemoryStore(max_bytes)
    from gateway.store.redis_store import RedisStore  # redis is imported only when used

    if redis is None:
        raise ValueError('stream_store = "redis" needs redis_url')
    return RedisStore(redis, timeout, max_bytes)
