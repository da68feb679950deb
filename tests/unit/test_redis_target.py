"""The Redis keys of the settings read into one target (gateway.redisconn.target)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.redisconn import RedisTarget, parse_node
from gateway.settings import Settings


def _settings(**redis: object) -> Settings:
    return Settings(upstream_url="http://x", stream_store="redis", **redis)  # type: ignore[arg-type]


def test_a_sentinel_set_is_its_sentinels_and_its_service() -> None:
    settings = _settings(
        redis_url="rediss://:pw@ignored/2?ssl_ca_certs=/ca.pem",
        redis_mode="sentinel",
        redis_nodes=["10.0.0.1:26379", "[::1]:26380"],
        redis_service="gw",
        redis_sentinel_password="spw",
    )
    target = settings.redis_target()
    assert target is not None
    assert target.mode == "sentinel"
    assert target.nodes == (("10.0.0.1", 26379), ("::1", 26380))
    assert target.service == "gw"
    assert target.sentinel_password == "spw"
    options = target.options()
    assert options["password"] == "pw"
    assert options["db"] == 2
    assert options["ssl"] is True
    assert options["ssl_ca_certs"] == "/ca.pem"
    assert "host" not in options
    assert "port" not in options
    assert "pw" not in target.describe()


def test_a_cluster_seeds_from_the_url_and_the_nodes() -> None:
    target = RedisTarget.build("cluster", "redis://a:7000/0", ["b:7001", "a:7000"])
    assert target.seeds() == [("a", 7000), ("b", 7001)]
    assert target.describe() == "cluster seeds a:7000, b:7001"


def test_a_standalone_url_is_read_as_it_always_was() -> None:
    settings = _settings(redis_url="redis://127.0.0.1:6379/0")
    target = settings.redis_target()
    assert target == RedisTarget("standalone", "redis://127.0.0.1:6379/0")
    assert target.describe() == "standalone 127.0.0.1:6379"


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ({"redis_mode": "sentinel", "redis_service": "gw"}, "needs redis_nodes"),
        ({"redis_mode": "sentinel", "redis_nodes": ["h:1"]}, "needs redis_service"),
        ({"redis_mode": "cluster", "redis_nodes": ["h:1"], "redis_service": "gw"}, "redis_service"),
        ({"redis_nodes": ["h:1"]}, "redis_nodes is for"),
        ({"redis_mode": "cluster", "redis_nodes": ["h"]}, "is not host:port"),
        ({"redis_mode": "cluster", "redis_nodes": ["h:99999"]}, "is not host:port"),
        ({"redis_mode": "cluster", "redis_url": "redis://h:1/3"}, "one database"),
        ({"redis_mode": "cluster", "redis_url": "unix:///tmp/r.sock"}, "redis:// or rediss://"),
        ({"redis_sentinel_password": "x"}, "redis_sentinel_password is for"),
        ({"redis_url": "http://h"}, "redis://, rediss:// or unix://"),
    ],
)
def test_a_wrong_redis_key_is_named(keys: dict[str, object], says: str) -> None:
    values: dict[str, object] = {"redis_url": "redis://h:6379/0"} | keys
    with pytest.raises(ValidationError, match=says):
        _settings(**values)


def test_sentinel_or_cluster_without_a_url_is_refused() -> None:
    with pytest.raises(ValidationError, match="needs redis_url"):
        Settings(upstream_url="http://x", redis_mode="cluster", redis_nodes=["h:1"])


@pytest.mark.parametrize(
    ("node", "pair"), [("h:1", ("h", 1)), (" [fe80::1]:6379 ", ("fe80::1", 6379))]
)
def test_a_node_is_host_and_port(node: str, pair: tuple[str, int]) -> None:
    assert parse_node(node) == pair
