"""The Redis backend's scripts against a real redis-server and a six-node cluster: each
reservation's id makes a late reservation, a repeated settlement and a settlement
without its reservation all come out at what was served; a stream that crossed a window
is charged in full; strict reserves at most what is left; a refusal tells every counter."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis as redis_py
import redis.cluster

from gateway.limits import BackendError
from gateway.limits.backend import Ask, Bill
from gateway.limits.redis_backend import RedisBackend
from gateway.policy.quota import Check, Limit, Rule, checks_for
from gateway.redisconn import RedisTarget
from tests.integration.redis_server import redis_server
from tests.integration.redis_sets import (
    cluster_target,
    redis_cluster,  # noqa: F401 (a fixture)
)

#: 30 s into a minute an hour from now: the keys' expiries (EXPIREAT) lie in the future
NOW = float(int(time.time()) // 60 * 60 + 3630)
RULE = Rule(
    "team",
    {
        Limit.REQUESTS_PER_MINUTE: 10,
        Limit.TOKENS_PER_MINUTE: 1000,
        Limit.MAX_CONCURRENT_STREAMS: 5,
    },
)


@dataclass
class Where:
    """A Redis for one test: its own server, or the shared cluster under a prefix of its
    own (on a cluster, a script that touched two slots would fail: CROSSSLOT)."""

    target: RedisTarget
    prefix: str

    def client(self) -> Any:
        if self.target.mode == "cluster":
            nodes = [redis_py.cluster.ClusterNode(h, p) for h, p in self.target.seeds()]
            options = {k: v for k, v in self.target.options().items() if k != "db"}
            return redis_py.cluster.RedisCluster(startup_nodes=nodes, **options)
        return redis_py.Redis.from_url(self.target.url)


@pytest.fixture(params=["server", "cluster"])
def redis(request: pytest.FixtureRequest) -> Iterator[Where]:
    if request.param == "cluster":
        yield Where(
            cluster_target(request.getfixturevalue("redis_cluster")), f"t{uuid.uuid4().hex}"
        )
        return
    with redis_server(mode="server") as server:  # the cluster is the other param
        yield Where(RedisTarget.build("standalone", server.url), "gateway")


def _values(server: Where, checks: list[Check]) -> list[int]:
    client = server.client()
    try:
        found = []
        for check in checks:
            key = f"{server.prefix}:{{team}}:{check.key}"
            if check.expires is None:
                found.append(client.zcard(key))
            else:
                found.append(int(client.get(key) or 0))
        return found
    finally:
        client.close()


def _run(server: Where, work: Any) -> Any:
    async def run() -> Any:
        backend = RedisBackend(server.target, timeout=2.0, prefix=server.prefix)
        try:
            await backend.prepare()
            return await work(backend)
        finally:
            await backend.close()

    return asyncio.run(run())


def _ask(member: str, input_: int = 90, output: int = 10, strict: bool = False) -> Ask:
    return Ask(member, input_, output, strict, 600.0)


def test_a_reservation_and_its_settlement_replace_the_estimate_by_the_cost(
    redis: Where,
) -> None:
    checks = checks_for([RULE], True, NOW)

    async def work(backend: RedisBackend) -> None:
        admitted = await backend.reserve(checks, _ask("r1"), NOW)
        assert admitted.refused is None
        assert admitted.used == [1, 100, 1]
        after = await backend.settle(checks, checks, _ask("r1"), Bill(100, 40))
        assert after == [1, 40, 0]
        # settled once: a second settlement (a retry whose first attempt ran) is nothing
        assert await backend.settle(checks, checks, _ask("r1"), Bill(100, 40)) == [None] * 3

    _run(redis, work)
    assert _values(redis, checks) == [1, 40, 0]


def test_a_reservation_run_after_its_cancellation_counts_nothing(redis: Where) -> None:
    """The gateway gave up on a reservation and cancelled it; Redis ran the cancellation
    first (a paused Redis resuming runs what it holds in any order): the reservation,
    run late, finds its id closed and counts nothing."""
    checks = checks_for([RULE], True, NOW)

    async def work(backend: RedisBackend) -> None:
        await backend.settle(checks, checks, _ask("late"), Bill(0, 0, served=False))
        with pytest.raises(BackendError):
            await backend.reserve(checks, _ask("late"), NOW)

    _run(redis, work)
    assert _values(redis, checks) == [0, 0, 0]


def test_a_cancellation_after_its_reservation_takes_all_of_it_back(redis: Where) -> None:
    checks = checks_for([RULE], True, NOW)

    async def work(backend: RedisBackend) -> None:
        await backend.reserve(checks, _ask("r1"), NOW)
        await backend.settle(checks, checks, _ask("r1"), Bill(100, 0, served=False))

    _run(redis, work)
    assert _values(redis, checks) == [0, 0, 0]


def test_a_settlement_whose_reservation_never_counted_charges_the_cost_only(
    redis: Where,
) -> None:
    """Served unreserved (on_backend_error = "allow"): its settlement, sent when Redis is
    back, charges what it cost and subtracts nothing."""
    checks = checks_for([RULE], True, NOW)

    async def work(backend: RedisBackend) -> None:
        await backend.reserve(checks, _ask("other"), NOW)  # 100 reserved by another
        after = await backend.settle(checks, checks, _ask("unreserved"), Bill(100, 30))
        assert after == [2, 130, 1]

    _run(redis, work)


def test_a_stream_that_crossed_a_minute_is_charged_in_full(redis: Where) -> None:
    before = checks_for([RULE], True, NOW)
    after = checks_for([RULE], True, NOW + 60)

    async def work(backend: RedisBackend) -> None:
        await backend.reserve(before, _ask("long"), NOW)
        # reserved 100, cost 700: the new minute gets the 600 the old one did not hold
        assert await backend.settle(before, after, _ask("long"), Bill(100, 700)) == [0, 600, 0]

    _run(redis, work)
    assert _values(redis, before)[:2] == [1, 100]


def test_strict_reserves_what_is_left_and_a_refusal_tells_every_counter(
    redis: Where,
) -> None:
    checks = checks_for([RULE], False, NOW)

    async def work(backend: RedisBackend) -> None:
        first = await backend.reserve(checks, _ask("a", 300, 5000, strict=True), NOW)
        assert first.refused is None
        assert first.output == 700  # 1000 - 300: all that was left
        assert first.used == [1, 1000]
        refused = await backend.reserve(checks, _ask("b", 1, 10, strict=True), NOW)
        assert refused.refused == 1
        assert refused.used == [1, 1000]

    _run(redis, work)


def test_a_reservation_of_no_tokens_passes_a_token_limit_that_is_over(
    redis: Where,
) -> None:
    """A cache hit reserves no tokens: a client whose tokens are spent past the limit is
    still admitted, and counted in its requests, which still refuse it at theirs."""
    rule = Rule("team", {Limit.REQUESTS_PER_MINUTE: 3, Limit.TOKENS_PER_MINUTE: 100})
    checks = checks_for([rule], False, NOW)

    async def work(backend: RedisBackend) -> None:
        assert (await backend.reserve(checks, _ask("a"), NOW)).refused is None
        # it cost more than it reserved: the token counter is over its limit
        assert await backend.settle(checks, checks, _ask("a"), Bill(100, 400)) == [1, 400]
        hit = await backend.reserve(checks, _ask("h1", 0, 0), NOW)
        assert (hit.refused, hit.used) == (None, [2, 400])
        # a request that spends tokens is refused by the token limit, and counts nothing
        miss = await backend.reserve(checks, _ask("b"), NOW)
        assert (miss.refused, miss.used) == (1, [2, 400])
        # strict has no output to cap in a reservation of none
        strict = await backend.reserve(checks, _ask("h2", 0, 0, strict=True), NOW)
        assert (strict.refused, strict.output, strict.used) == (None, 0, [3, 400])
        # the request limit still refuses a reservation of no tokens
        over = await backend.reserve(checks, _ask("h3", 0, 0), NOW)
        assert (over.refused, over.used) == (0, [3, 400])

    _run(redis, work)
    assert _values(redis, checks) == [3, 400]


def test_a_burst_of_reservations_shares_a_few_round_trips(redis: Where) -> None:
    """200 reservations asked at once go in a few pipelines, not 200 round trips, and each
    gets its own answer: exactly the limit is admitted."""
    checks = checks_for([Rule("team", {Limit.REQUESTS_PER_MINUTE: 50})], False, NOW)

    async def work(backend: RedisBackend) -> tuple[int, list[Any]]:
        before = backend._link.round_trips
        answers = await asyncio.gather(
            *(backend.reserve(checks, _ask(f"b{i}"), NOW) for i in range(200))
        )
        return backend._link.round_trips - before, answers

    trips, answers = _run(redis, work)
    assert sum(1 for a in answers if a.refused is None) == 50
    assert trips < 20, trips


def test_a_busy_event_loop_is_not_taken_for_a_slow_redis(redis: Where) -> None:
    """limits_timeout 250 ms, and the loop busy for a second while the reservation is out:
    the deadline is the Redis socket's, kept by the link's thread, so the answer
    counts (an asyncio timeout on this loop would have fired)."""
    checks = checks_for([RULE], False, NOW)

    async def work(backend: RedisBackend) -> None:
        backend._link._backstop = 10.0  # only the socket's deadline is under test
        task = asyncio.ensure_future(backend.reserve(checks, _ask("busy"), NOW))
        await asyncio.sleep(0)  # the reservation is handed to the link
        time.sleep(1.0)  # noqa: ASYNC251  # the loop busy (its own work) for a second
        answer = await task
        assert answer.refused is None

    async def run() -> None:
        # 250 ms rather than the 50 ms default: on a loaded two-core machine redis-server
        # itself may wait longer than 50 ms for a core (the burst tests do the same)
        backend = RedisBackend(redis.target, timeout=0.25, prefix=redis.prefix)
        try:
            await backend.prepare()
            await work(backend)
        finally:
            await backend.close()

    asyncio.run(run())
    assert _values(redis, checks) == [1, 100]
