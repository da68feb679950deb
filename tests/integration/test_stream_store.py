"""The stream store's API on both backends: memory, and a real redis-server.

Events come back byte for byte after any cursor, the live tail wakes readers,
the caps stop a log (then ``Gone``) or refuse a new one, a cancel reaches the
writer, an orphan is adopted once its lease ran out, the writer writes Redis in
batches (not one call per event), and nothing is left once the TTLs passed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.app import store_connection
from gateway.redisconn import RedisTarget
from gateway.store import BeyondEnd, End, Gone, MemoryStore, StreamStore, Writer, follow
from gateway.store.redis_store import RedisStore
from tests.integration.helpers import until
from tests.integration.redis_server import RedisServer, redis_server
from tests.integration.redis_sets import (
    cluster_target,
    redis_cluster,  # noqa: F401 (a fixture)
    redis_sentinel,  # noqa: F401 (a fixture)
    sentinel_target,
)

#: Every test here is Redis-backed: run against a cluster too (make test-redis-cluster).
pytestmark = pytest.mark.redis

EVENTS = [b'data: {"n": %d}\r\n\r\n' % i for i in range(1, 41)] + [b": ping\n\n", b"\x00\xff\r\r"]


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


Make = Callable[..., StreamStore]


@pytest.fixture(params=["memory", "redis", "cluster", "sentinel"])
def make(request: pytest.FixtureRequest) -> Make:
    """Each test on each backend; on a Redis Cluster, a command that touched two slots
    would fail (CROSSSLOT), and the stream ids spread the logs over every master."""
    where: RedisTarget | str | None = None
    if request.param == "redis":
        where = request.getfixturevalue("redis").target
    elif request.param == "cluster":
        where = cluster_target(request.getfixturevalue("redis_cluster"))
    elif request.param == "sentinel":
        where = sentinel_target(request.getfixturevalue("redis_sentinel"))

    def build(max_bytes: int = 1 << 20) -> StreamStore:
        if where is None:
            return MemoryStore(max_bytes)
        return RedisStore(store_connection(where, 5.0), 5.0, max_bytes, prefix=f"t{id(request)}")

    return build


def run(make: Make, body: Callable[[StreamStore], Any], **kw: Any) -> Any:
    async def main() -> Any:
        store = make(**kw)
        await store.prepare()
        try:
            return await body(store)
        finally:
            await store.close()

    return asyncio.run(main())


async def _open(
    store: StreamStore, max_bytes: int = 1 << 20, ttl: float = 30, lease: float = 3
) -> Writer:
    writer = await store.open(
        "alice", {"content-type": "text/event-stream"}, max_bytes=max_bytes, ttl=ttl, lease=lease
    )
    assert writer is not None
    return writer


async def _all(
    store: StreamStore, stream_id: str, after: int, started: list[int] | None = None
) -> tuple[list[bytes], End]:
    """Every event after ``after``, and the end (``started``: one entry added once the
    first batch came, so a test can wait for a reader to be on the live tail)."""
    events: list[bytes] = []
    async for batch in follow(store, stream_id, after, wait=5):
        if started is not None and not events:
            started.append(1)
        events += batch.events
        if batch.end is not None:
            return events, batch.end
    raise AssertionError("no end")


def _write(writer: Writer, events: list[bytes], per_call: int) -> None:
    """Log ``events`` one ``append`` each (``per_call`` 1) or ``extend``s of ``per_call``
    (the events a relayed chunk carries): the log must be the same."""
    if per_call == 1:
        for event in events:
            writer.append(event)
        return
    for at in range(0, len(events), per_call):
        writer.extend(events[at : at + per_call])


BATCHES = pytest.mark.parametrize("per_call", [1, 7, 42])


@BATCHES
def test_every_cursor_reads_exactly_what_follows(make: Make, per_call: int) -> None:
    async def body(store: StreamStore) -> None:
        writer = await _open(store)
        _write(writer, EVENTS, per_call)
        await writer.finish(End(b": gateway outcome=complete\n\n", {"verdict": "stop"}))
        info = await store.info(writer.id)
        assert info is not None
        assert (info.owner, info.total, info.kept, info.stopped, info.leased) == (
            "alice",
            42,
            42,
            False,
            False,
        )
        assert info.meta == {"content-type": "text/event-stream"}
        assert info.size == sum(map(len, EVENTS))
        for after in range(len(EVENTS) + 1):
            events, end = await _all(store, writer.id, after)
            assert events == EVENTS[after:]
            assert end == End(b": gateway outcome=complete\n\n", {"verdict": "stop"})
        with pytest.raises(BeyondEnd):
            await store.read(writer.id, 43)
        assert await store.read("no-such-stream", 0) is None
        assert await store.info("no-such-stream") is None

    run(make, body)


def test_a_reader_follows_the_live_tail(make: Make) -> None:
    async def body(store: StreamStore) -> None:
        writer = await _open(store)
        writer.append(EVENTS[0])
        await writer.flush()
        started: list[int] = []
        readers = [asyncio.create_task(_all(store, writer.id, 0, started)) for _ in range(100)]
        await until(lambda: len(started) == 100, "every reader read the first event")
        assert not any(r.done() for r in readers)  # each waits on the live tail
        for event in EVENTS[1:]:
            writer.append(event)
            await asyncio.sleep(0)
        with pytest.raises(BeyondEnd):  # nobody can hold an event that was not relayed
            await store.read(writer.id, len(EVENTS) + 1)
        await writer.finish(End(b"end"))
        for events, end in await asyncio.gather(*readers):
            assert events == EVENTS
            assert end.trailer == b"end"

    run(make, body)


@BATCHES
def test_the_per_stream_cap_stops_the_log(make: Make, per_call: int) -> None:
    async def body(store: StreamStore) -> None:
        cap = sum(map(len, EVENTS[:10]))
        writer = await _open(store, max_bytes=cap)
        _write(writer, EVENTS, per_call)  # a call that passes the cap keeps what fits
        assert (writer.total, writer.kept, writer.stopped) == (42, 10, True)
        await writer.finish(End(b"end"))
        info = await store.info(writer.id)
        assert info is not None
        assert (info.total, info.kept, info.stopped) == (42, 10, True)
        batch = await store.read(writer.id, 4)
        assert batch is not None
        assert batch.events == EVENTS[4:10]
        assert batch.end is None
        for after in (10, 11, 42):
            with pytest.raises(Gone):
                await store.read(writer.id, after)
        with pytest.raises(BeyondEnd):
            await store.read(writer.id, 43)

    run(make, body)


def test_the_total_budget_refuses_new_logs(make: Make) -> None:
    async def body(store: StreamStore) -> None:
        first = await _open(store)
        for event in EVENTS[:5]:
            first.append(event)
        assert not first.stopped
        assert store.size == sum(map(len, EVENTS[:5]))
        second = await _open(store)
        # More than the budget left: this log stops at the event that does not fit.
        second.extend([b"w" * 10, b"x" * 1000, b"v"])
        assert second.stopped
        assert (second.total, second.kept) == (3, 1)
        assert store.size <= 300
        first.append(b"y" * 300)
        assert first.stopped
        assert await store.open("bob", {}, max_bytes=1000, ttl=30, lease=3) is not None
        third = await _open(store)
        third.append(b"z" * (300 - store.size))  # the budget is spent, to the byte
        assert not third.stopped
        assert store.size == 300
        assert await store.open("bob", {}, max_bytes=1000, ttl=30, lease=3) is None
        for writer in (first, second, third):
            await writer.finish(End(b""))

    run(make, body, max_bytes=300)


def test_cancel_reaches_the_writer_and_is_idempotent(make: Make) -> None:
    async def body(store: StreamStore) -> None:
        writer = await _open(store, lease=0.6)
        await writer.flush()  # others see the log once it is written
        seen = asyncio.Event()
        writer.on_cancel = seen.set
        assert await store.cancel(writer.id)
        assert await store.cancel(writer.id)
        async with asyncio.timeout(10):
            await seen.wait()
        assert writer.cancelled
        info = await store.info(writer.id)
        assert info is not None
        assert info.cancel
        await writer.finish(End(b"cancelled"))
        assert not await store.cancel("no-such-stream")

    run(make, body)


def test_an_orphan_is_adopted_once_its_lease_ran_out(make: Make) -> None:
    async def body(store: StreamStore) -> None:
        writer = await _open(store, lease=0.5)
        for event in EVENTS[:3]:
            writer.append(event)
        await writer.flush()
        assert await store.adopt(writer.id, lease=1) is None  # the lease is alive
        await writer.release()  # the owner stops renewing (as a dead process would)
        deadline = asyncio.get_running_loop().time() + 10
        heir = None
        while heir is None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
            heir = await store.adopt(writer.id, lease=1)
        assert heir is not None
        assert (heir.total, heir.kept) == (3, 3)
        assert await store.adopt(writer.id, lease=1) is None  # one heir only
        heir.append(EVENTS[3])
        await heir.finish(End(b"owner_lost", {"reason": "owner_lost"}))
        events, end = await _all(store, writer.id, 0)
        assert events == EVENTS[:4]
        assert end.fields == {"reason": "owner_lost"}
        assert await store.adopt(writer.id, lease=1) is None  # ended

    run(make, body)


def test_names_point_at_one_stream(make: Make) -> None:
    async def body(store: StreamStore) -> None:
        assert await store.claim("req-key", "s1", 30) is None
        assert await store.claim("req-key", "s2", 30) == "s1"
        assert await store.resolve("req-key") == "s1"
        await store.forget("req-key")
        assert await store.resolve("req-key") is None

    run(make, body)


def test_nothing_is_left_after_the_ttl(redis: RedisServer) -> None:
    client = redis.client()

    async def body(store: StreamStore) -> None:
        done = await _open(store, ttl=1)
        for event in EVENTS:
            done.append(event)
        await done.finish(End(b"end"))
        orphan = await _open(store, ttl=1, lease=0.3)
        orphan.append(EVENTS[0])
        await orphan.release()
        assert await store.claim("name", done.id, 1) is None
        assert client.keys("ttl:*")
        # An ended log lives its TTL; an unended one two leases more (its lease runs
        # out, then a takeover's grace), whatever the TTL.
        ended = [k for k in client.keys("ttl:*") if done.id.encode() in k or b":n:" in k]
        assert all(0 < client.pttl(key) <= 1000 for key in ended)
        assert all(0 < client.pttl(key) <= 1600 for key in client.keys("ttl:*"))
        assert any(client.pttl(key) > 1000 for key in client.keys("ttl:*"))
        for _ in range(100):  # bounded: 10 s
            if not client.keys("ttl:*"):
                break
            await asyncio.sleep(0.1)
        assert client.keys("ttl:*") == []
        assert await store.info(done.id) is None
        assert store.size == 0

    async def main() -> None:
        store = RedisStore(store_connection(redis.target, 5.0), 5.0, 1 << 20, prefix="ttl")
        await store.prepare()
        try:
            await body(store)
        finally:
            await store.close()

    asyncio.run(main())


def test_the_memory_store_forgets_after_the_ttl() -> None:
    async def main() -> None:
        store = MemoryStore(1 << 20)
        writer = await _open(store, ttl=0.2)
        writer.append(EVENTS[0])
        await writer.finish(End(b""))
        assert store.size == len(EVENTS[0])

        def swept() -> bool:
            store.sweep()
            return store.size == 0

        await until(swept, "the sweep found the log expired")
        assert await store.info(writer.id) is None
        assert store.size == 0

    asyncio.run(main())


def test_redis_writes_are_batched(redis: RedisServer) -> None:
    def calls() -> int:
        return int(redis.calls("evalsha", "eval"))

    async def main() -> None:
        store = RedisStore(store_connection(redis.target, 5.0), 5.0, 1 << 24, prefix="batch")
        await store.prepare()
        try:
            before = calls()
            writer = await _open(store)
            for i in range(1000):
                writer.append(b"data: %d\n\n" % i)
                if i % 50 == 0:
                    await asyncio.sleep(0)  # the flusher runs now and then, as in a relay
            await writer.finish(End(b""))
            used = calls() - before
            assert used <= 60, used  # 1,000 events: a few dozen calls, not 1,000
            events, _ = await _all(store, writer.id, 0)
            assert events == [b"data: %d\n\n" % i for i in range(1000)]
        finally:
            await store.close()

    asyncio.run(main())


def test_a_log_that_lost_written_events_is_not_written_on(redis: RedisServer) -> None:
    """A failover can lose a master's last writes: the log (and its count) on the promoted
    replica ends before events its writer had written. The writer's next events would
    leave a hole a resume would skip in silence: the writer stops instead, and the log
    ends where it is (its readers get ``owner_lost``)."""
    client = redis.client()

    async def main() -> None:
        store = RedisStore(store_connection(redis.target, 5.0), 5.0, 1 << 20, prefix="hole")
        await store.prepare()
        try:
            writer = await _open(store)
            for i in range(5):
                writer.append(b"data: %d\n\n" % i)
            await writer.flush()
            log, meta = (f"hole:s:{{{writer.id}}}:{k}" for k in ("log", "meta"))
            client.xdel(log, "0-4", "0-5")  # as if events 4 and 5 never replicated
            client.hset(meta, "logged", 3)
            writer.append(b"data: 5\n\n")
            await writer.flush()
            assert writer.lost
            batch = await store.read(writer.id, 0)
            assert batch is not None
            assert batch.events == [b"data: %d\n\n" % i for i in range(3)]
            assert batch.end is None  # no end: its readers end it owner_lost
        finally:
            await store.close()

    asyncio.run(main())
