"""Where Redis is: the settings' Redis keys read once into a ``RedisTarget`` (pure).

Three modes, one shape. ``redis_url`` always gives the scheme (``redis://`` or
``rediss://`` for TLS), the credentials, the database and the TLS options (its
query string: ``ssl_ca_certs`` and friends, as the ``redis`` client reads them).
Its host and port are the server (standalone), one more seed node (cluster), or
unused (sentinel: the sentinels say where the master is). ``redis_nodes`` lists
``host:port`` of the sentinels or of the cluster's seed nodes; ``redis_service``
names the Sentinel service; ``redis_sentinel_password`` is the sentinels' own
password when they have one.

Nothing here connects: ``gateway.redisconn.clients`` builds the clients,
``gateway.redisconn.check`` asks the nodes at start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

__all__ = ["Mode", "RedisTarget", "as_target", "parse_node"]

Mode = Literal["standalone", "sentinel", "cluster"]


def parse_node(node: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as a pair; ValueError names a bad one."""
    host, sep, port = node.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"redis_nodes: {node!r} is not host:port")
    return host, int(port)


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """One Redis deployment: its mode, the URL's options and the nodes to ask."""

    mode: Mode
    url: str
    nodes: tuple[tuple[str, int], ...] = ()
    service: str | None = None
    sentinel_password: str | None = None

    @classmethod
    def build(
        cls,
        mode: Mode,
        url: str,
        nodes: list[str] | tuple[str, ...] = (),
        service: str | None = None,
        sentinel_password: str | None = None,
    ) -> RedisTarget:
        """The target, or ValueError saying which key is wrong and why."""
        scheme = urlsplit(url).scheme
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError("redis_url must be a redis://, rediss:// or unix:// URL")
        pairs = tuple(parse_node(n) for n in nodes)
        if mode == "standalone" and pairs:
            raise ValueError('redis_nodes is for redis_mode = "sentinel" or "cluster"')
        if mode != "standalone" and scheme == "unix":
            raise ValueError(f'redis_mode = "{mode}" needs a redis:// or rediss:// redis_url')
        if mode == "sentinel":
            if not pairs:
                raise ValueError('redis_mode = "sentinel" needs redis_nodes (the sentinels)')
            if not service:
                raise ValueError('redis_mode = "sentinel" needs redis_service (the master name)')
        elif service:
            raise ValueError('redis_service is for redis_mode = "sentinel"')
        if mode == "cluster" and urlsplit(url).path.strip("/") not in ("", "0"):
            raise ValueError('redis_mode = "cluster" has one database: redis_url must use /0')
        if sentinel_password is not None and mode != "sentinel":
            raise ValueError('redis_sentinel_password is for redis_mode = "sentinel"')
        return cls(mode, url, pairs, service or None, sentinel_password)

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "rediss"

    def options(self) -> dict[str, Any]:
        """The URL's connection options (credentials, db, TLS) without host and port."""
        from redis.connection import parse_url  # redis is imported only when used

        found: dict[str, Any] = dict(parse_url(self.url))  # type: ignore[no-untyped-call]
        for key in ("host", "port", "path", "connection_class"):
            found.pop(key, None)
        if self.tls:
            found["ssl"] = True
        return found

    def seeds(self) -> list[tuple[str, int]]:
        """Cluster: the URL's host and port, then every node of ``redis_nodes``."""
        parts = urlsplit(self.url)
        first = [(parts.hostname, parts.port or 6379)] if parts.hostname else []
        return list(dict.fromkeys([*first, *self.nodes]))

    def describe(self) -> str:
        """The mode and the nodes configured, no secret (for logs and errors)."""
        if self.mode == "standalone":
            parts = urlsplit(self.url)
            where = (
                parts.path if parts.scheme == "unix" else f"{parts.hostname}:{parts.port or 6379}"
            )
            return f"standalone {where}"
        nodes = ", ".join(
            f"{h}:{p}" for h, p in (self.seeds() if self.mode == "cluster" else self.nodes)
        )
        if self.mode == "sentinel":
            return f"sentinel service {self.service!r} via {nodes}"
        return f"cluster seeds {nodes}"


def as_target(where: RedisTarget | str) -> RedisTarget:
    """A target as is; a URL as a standalone server's."""
    return where if isinstance(where, RedisTarget) else RedisTarget.build("standalone", where)
