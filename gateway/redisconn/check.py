"""Ask the configured Redis nodes once, at start and in ``check-config``: what was found
(the mode and the nodes, for the start-up log), or a clear error, within a bound.

Each node is asked on its own connection with the target's credentials and TLS,
each question bounded by ``bound`` seconds: a dead node, a wrong password, a Sentinel
that does not know the service or names a master that does not answer, a seed
that is not a cluster node, are each one sentence naming the node, never a hang.
In Sentinel and Cluster mode every configured node must answer: a dead one in the
list is found at deploy, not at the first failover that needed it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, RedisError, ResponseError

from gateway.redisconn.target import RedisTarget

__all__ = ["RedisUnusable", "inspect"]

T = TypeVar("T")


class RedisUnusable(Exception):
    """The configured Redis cannot be used; the message says why and where.

    ``unreachable``: nothing answered (an outage may end; a standalone gateway waits for
    it), as opposed to an answer that says the configuration is wrong."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _ask(what: str, call: Awaitable[T], bound: float) -> T:
    """``call`` within ``bound``, its failure a RedisUnusable naming ``what``."""
    try:
        async with asyncio.timeout(bound):
            return await call
    except AuthenticationError as exc:
        raise RedisUnusable(f"{what}: the password (or user) is refused ({_why(exc)})") from None
    except ResponseError as exc:
        if "NOAUTH" in str(exc) or "WRONGPASS" in str(exc):
            raise RedisUnusable(f"{what}: the password is refused ({_why(exc)})") from None
        raise RedisUnusable(f"{what}: {_why(exc)}") from None
    except (RedisError, OSError, TimeoutError) as exc:
        raise RedisUnusable(f"{what} does not answer ({_why(exc)})", unreachable=True) from None


def _node(host: str, port: int, options: dict[str, Any], bound: float) -> Any:
    return redis.asyncio.Redis(
        host=host,
        port=port,
        socket_timeout=bound,
        socket_connect_timeout=bound,
        retry=Retry(NoBackoff(), 0),
        **options,
    )


async def inspect(target: RedisTarget, bound: float = 3.0) -> str:
    """One line naming the mode and the nodes found; RedisUnusable otherwise."""
    if target.mode == "sentinel":
        return await _sentinel(target, bound)
    if target.mode == "cluster":
        return await _cluster(target, bound)
    client = redis.asyncio.Redis.from_url(
        target.url,
        socket_timeout=bound,
        socket_connect_timeout=bound,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        await _ask(f"redis {target.describe()}", client.ping(), bound)
    finally:
        await client.aclose()
    return f"redis: standalone, {target.describe().removeprefix('standalone ')}"


async def _sentinel(target: RedisTarget, bound: float) -> str:
    options = target.options()
    sentinel_options = {k: v for k, v in options.items() if k.startswith("ssl")}
    if target.sentinel_password is not None:
        sentinel_options["password"] = target.sentinel_password
    masters: set[tuple[str, int]] = set()
    replicas: set[tuple[str, int]] = set()
    for host, port in target.nodes:
        node = _node(host, port, sentinel_options, bound)
        try:
            what = f"sentinel {host}:{port}"
            state = await _ask(what, node.execute_command("SENTINEL", "MASTERS"), bound)
            known = {_field(m, "name"): m for m in state}
            if target.service not in known:
                raise RedisUnusable(
                    f"{what} knows no service {target.service!r} (it knows: "
                    f"{', '.join(sorted(known)) or 'none'}): check redis_service"
                )
            master = known[target.service]
            masters.add((_field(master, "ip"), int(_field(master, "port"))))
            listed = await _ask(
                what, node.execute_command("SENTINEL", "REPLICAS", target.service), bound
            )
            replicas |= {(_field(r, "ip"), int(_field(r, "port"))) for r in listed}
        finally:
            await node.aclose()
    if len(masters) != 1:
        named = ", ".join(f"{h}:{p}" for h, p in sorted(masters))
        raise RedisUnusable(
            f"the sentinels name different masters for {target.service!r} ({named}): "
            "a failover is under way, or they watch different sets"
        )
    ((host, port),) = masters
    master = _node(host, port, options, bound)
    try:
        role = await _ask(
            f"the master {host}:{port} the sentinels name for {target.service!r}",
            master.execute_command("ROLE"),
            bound,
        )
    finally:
        await master.aclose()
    if _text(role[0]) != "master":
        raise RedisUnusable(
            f"{host}:{port}, named master of {target.service!r}, says it is a {_text(role[0])}"
        )
    sentinels = ", ".join(f"{h}:{p}" for h, p in target.nodes)
    found = ", ".join(f"{h}:{p}" for h, p in sorted(replicas)) or "none"
    return (
        f"redis: sentinel, service {target.service!r}: master {host}:{port}, replicas "
        f"{found} (sentinels {sentinels})"
    )


async def _cluster(target: RedisTarget, bound: float) -> str:
    options = target.options()
    options.pop("db", None)
    layout: str | None = None
    for host, port in target.seeds():
        node = _node(host, port, options, bound)
        what = f"cluster seed {host}:{port}"
        try:
            info = await _ask(what, node.execute_command("INFO", "cluster"), bound)
            if not info.get("cluster_enabled"):
                raise RedisUnusable(f"{what} is not a cluster node (cluster_enabled:0)")
            state = await _ask(what, node.execute_command("CLUSTER", "INFO"), bound)
            if _text(state).find("cluster_state:ok") < 0:
                raise RedisUnusable(f"{what} says the cluster is not ok (cluster_state:fail)")
            if layout is None:
                layout = _text(await _ask(what, node.execute_command("CLUSTER", "NODES"), bound))
        finally:
            with contextlib.suppress(Exception):
                await node.aclose()
    assert layout is not None
    masters, replicas = _roles(layout)
    return f"redis: cluster, masters {', '.join(masters)}; replicas {', '.join(replicas) or 'none'}"


def _roles(layout: str) -> tuple[list[str], list[str]]:
    """``CLUSTER NODES``: the live masters that own slots, and the live replicas."""
    masters, replicas = [], []
    for line in layout.splitlines():
        parts = line.split()
        if len(parts) < 8 or "fail" in parts[2].split(","):
            continue
        address = parts[1].split("@")[0]
        if "master" in parts[2].split(",") and len(parts) > 8:
            masters.append(address)
        elif "slave" in parts[2].split(","):
            replicas.append(address)
    return sorted(masters), sorted(replicas)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _field(state: Any, name: str) -> str:
    """A field of a Sentinel reply (a flat list or a dict, by protocol version)."""
    if isinstance(state, dict):
        value = state.get(name.encode(), state.get(name))
    else:
        pairs = dict(zip(state[::2], state[1::2], strict=True))
        value = pairs.get(name.encode(), pairs.get(name))
    return _text(value)
