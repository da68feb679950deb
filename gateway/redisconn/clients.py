"""The one place a Redis client is built from a ``RedisTarget``, in every mode.

Every user of Redis (the limits link, the stream store and the cache behind it,
issued keys, receipts) asks here, so each works standalone, on a Sentinel set
and on a Cluster with nothing of its own: the ``redis`` client's own support
does the work (``redis.asyncio.sentinel.Sentinel.master_for`` finds the master
and follows a failover; ``redis.asyncio.cluster.RedisCluster`` routes each
command to its slot's owner and refreshes the slot map when a node fails).
``sync_client`` builds the same in the blocking flavour, for a caller that
talks to Redis from a thread of its own (``gateway.limits.redis_link``).

The callers choose their deadlines; retries are off (one attempt, the caller's
error handling decides), so no call waits on a hidden backoff, except one on a
cluster: a command that met a dead node is sent once more after the slot map is
refreshed, so the slot's new owner answers it. A cluster client's pool size is
per node.

A sync cluster client asks its seeds as it is built: build it where a failure
may be met (the link's thread), not at import or in a constructor.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway.redisconn.target import RedisTarget

__all__ = ["CLUSTER_RETRIES", "async_client", "sync_client"]

#: A cluster command that met a dead node is sent once more, after the client refreshed
#: its slot map: a failed-over slot's new owner answers it (within the caller's bound).
CLUSTER_RETRIES = 1


def _sentinel_options(target: RedisTarget, common: dict[str, Any]) -> dict[str, Any]:
    """How to talk to the sentinels themselves: the same TLS, their own password."""
    options = {k: v for k, v in common.items() if k.startswith(("socket_", "ssl"))}
    if target.sentinel_password is not None:
        options["password"] = target.sentinel_password
    return options


def async_client(
    target: RedisTarget,
    *,
    socket_timeout: float | None,
    connect_timeout: float,
    max_connections: int = 100,
) -> Any:
    """An asyncio client (``redis.asyncio.Redis`` or ``RedisCluster``) for ``target``."""
    common: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "health_check_interval": 0,
        "max_connections": max_connections,
    }
    if target.mode == "standalone":
        return redis.asyncio.Redis.from_url(target.url, retry=AsyncRetry(NoBackoff(), 0), **common)
    options = target.options() | common
    if target.mode == "sentinel":
        sentinel = redis.asyncio.sentinel.Sentinel(
            list(target.nodes),
            sentinel_kwargs=_sentinel_options(target, options)
            | {"retry": AsyncRetry(NoBackoff(), 0)},
        )
        assert target.service is not None
        return sentinel.master_for(target.service, retry=AsyncRetry(NoBackoff(), 0), **options)
    options.pop("db", None)
    nodes = [redis.asyncio.cluster.ClusterNode(h, p) for h, p in target.seeds()]
    return redis.asyncio.cluster.RedisCluster(
        startup_nodes=nodes, retry=AsyncRetry(NoBackoff(), CLUSTER_RETRIES), **options
    )


def sync_client(target: RedisTarget, *, timeout: float) -> Any:
    """A blocking client (``redis.Redis`` or ``redis.cluster.RedisCluster``) whose every
    socket wait is bounded by ``timeout``."""
    common: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "health_check_interval": 0,
    }
    if target.mode == "standalone":
        return redis.Redis.from_url(target.url, retry=Retry(NoBackoff(), 0), **common)
    options = target.options() | common
    if target.mode == "sentinel":
        sentinel = redis.sentinel.Sentinel(
            list(target.nodes),
            sentinel_kwargs=_sentinel_options(target, options) | {"retry": Retry(NoBackoff(), 0)},
        )
        assert target.service is not None
        return sentinel.master_for(target.service, retry=Retry(NoBackoff(), 0), **options)
    options.pop("db", None)
    nodes = [redis.cluster.ClusterNode(h, p) for h, p in target.seeds()]  # type: ignore[no-untyped-call]
    return redis.cluster.RedisCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 0), **options)
