"""How the Redis store reaches Redis, handed in by its owner.

The store imports nothing of the package but itself: the clients are built by
the one Redis client factory (``gateway.redisconn``) where the store is built
(``gateway.app``), and handed in as a ``RedisConnection``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["RedisConnection"]


@dataclass(frozen=True, slots=True)
class RedisConnection:
    """The store's clients: an asyncio one for every call, and how to build the blocking
    one its outage probe PINGs with (built in the probe's thread, where a cluster's
    seeds may fail to answer)."""

    #: ``redis.asyncio.Redis`` or ``RedisCluster`` (each call bounded by the store).
    client: Any
    #: Builds a blocking client whose every socket wait is bounded.
    blocking: Callable[[], Any]
    #: Whether an error (raised, or a pipeline's answer per command) says the command did
    #: not run for want of a master that takes it now (``gateway.redisconn.away``).
    away: Callable[[object], bool]
    #: A Redis Cluster: a failing master fails a pipeline whole, a PING goes to masters.
    cluster: bool = False
