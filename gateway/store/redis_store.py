"""The Redis store: stream logs shared by every worker and replica (Redis Streams).

Per stream, three keys under one hash tag (one cluster slot):

- ``{prefix}:s:{id}:log``, a Redis Stream with one entry per relayed event, its
  entry id ``0-N`` for event N (so ``XRANGE``/``XREAD`` after ``0-N`` return
  exactly what follows event N), field ``e`` the event's bytes; the end is one
  more entry with fields ``end`` (the trailer) and ``f`` (its fields, JSON);
- ``{prefix}:s:{id}:meta``, a hash: owner, the writer's ``m:*`` meta fields,
  ``total``, ``kept``, ``size``, ``stopped``, ``max_bytes``, ``end``, ``cancel``;
- ``{prefix}:s:{id}:lease``, the writer's token, with a short expiry it renews.

Opening a log is one write (the meta and the lease), before its id is handed
out. A writer never writes per event: ``append`` queues, and one flusher per process
writes what every writer queued in one pipeline of script calls (``WRITE``, one
per writer: the lease is checked, the entries added, the counters set, every
key's expiry pushed back ``ttl``), ``FLUSH_SECONDS`` after the first event that
waits and again as soon as the pipeline before returns; a writer with nothing
queued gets the same call every third of its lease (renewal), and its answer
reports a cancel request. Live readers of one stream in one process share one ``XREAD BLOCK`` on
its log (a ``_Tail``), which wakes them all: a hundred resumers of a stream hold
one blocked connection, not a hundred.

Every call is bounded by the store's timeout (plus the wait of a blocking read);
every failure is a ``StoreError`` and opens the **breaker**: one log line, then
every call fails at once (no request waits on a Redis that is away) while one
PING a second looks for it; when it answers, one more line (how long, how many
calls failed) and the writers write what waited. A cluster is away only when none
of its masters answers the PING that confirms an outage: a failing master fails
only the calls to its slots (its logs wait, ``away``, and are written again every
``AWAY_RETRY_SECONDS``), and the other masters' logs never notice. A writer
whose write fails keeps its events and its end and sends them again then (the
script skips what was written), taking its lease back if it ran out meanwhile and
nobody took the log over: a client that got the whole answer never finds it ended
``owner_lost`` for want of a write. A takeover starts with a grace of one lease
for exactly that (``ADOPT``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any

from redis.backoff import NoBackoff
from redis.exceptions import (
    NoScriptError,
    RedisClusterException,
    RedisError,
)
from redis.retry import Retry

from gateway.store.api import (
    READ_LIMIT,
    Batch,
    BeyondEnd,
    End,
    Gone,
    NewLog,
    StoreError,
    StreamInfo,
    StreamStore,
    Writer,
)
from gateway.store.budget import Budget
from gateway.store.connection import RedisConnection

__all__ = ["RedisStore"]

log = logging.getLogger("gateway")

#: Connections to Redis per process at most (one per followed stream, plus short calls).
MAX_CONNECTIONS = 4096
#: How long one shared blocking read waits before it looks again for readers.
TAIL_BLOCK_SECONDS = 1.0

#: How long the flusher waits for more before it writes (the events of every stream in
#: this process that came meanwhile go in the same pipeline; more come while a pipeline
#: is in flight). Short: a resumable stream's client waits for its events' write.
FLUSH_SECONDS = 0.002
#: How often the writers' leases are looked at for a renewal.
RENEW_TICK_SECONDS = 0.1
#: While Redis is away, how often one PING asks whether it is back.
RETRY_SECONDS = 1.0
#: How often a log whose own node is away (a cluster's failing master, a demoted
#: master) is written again, while the rest of Redis answers.
AWAY_RETRY_SECONDS = 0.25

#: Every way a call can fail (a cluster client's own errors are no RedisError).
FAILURES = (RedisError, RedisClusterException, OSError, TimeoutError)
#: Events written in one script call at most.
WRITE_BATCH = 256

#: KEYS: log, meta, lease. ARGV: token, ttl ms, lease ms, the new log's meta as JSON
#: (its first write: the meta is made and the lease taken) or "", total, kept, size,
#: stopped, first event number, n, the n events, then "1", trailer, fields (the end)
#: or "0". Returns {owned, cancel}. Sent again after a failure, it does nothing twice
#: (events already logged are skipped; an end already written is the writer's own).
#: A writer whose lease ran out while it could not write (Redis away) takes it back,
#: unless the log ended, vanished or has an heir (``writer`` names the lease's holder).
#: An unended log lives ``ttl`` plus two leases after its last write (the lease runs
#: out, a takeover has its grace), an ended one ``ttl``.
WRITE = """
local owner = redis.call('HGET', KEYS[2], 'writer')
if ARGV[4] ~= '' and not owner then
  for field, value in pairs(cjson.decode(ARGV[4])) do
    redis.call('HSET', KEYS[2], field, value)
  end
  redis.call('HSET', KEYS[2], 'writer', ARGV[1], 'logged', 0)
  redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[3])
elseif owner ~= ARGV[1] then
  return {0, 0}
elseif redis.call('HGET', KEYS[2], 'end') then
  return {1, 0}
elseif redis.call('GET', KEYS[3]) ~= ARGV[1] then
  if redis.call('EXISTS', KEYS[3]) == 1 then return {0, 0} end
  redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[3])
end
redis.call('HDEL', KEYS[2], 'grace')
local logged = tonumber(redis.call('HGET', KEYS[2], 'logged'))
local first, n = tonumber(ARGV[9]), tonumber(ARGV[10])
-- events this writer had written are missing (a failover lost the master's last
-- writes): a log with a hole is never written on; it stops here (owner_lost)
if first > logged + 1 then return {0, 0} end
for i = 1, n do
  if first + i - 1 > logged then
    redis.call('XADD', KEYS[1], '0-' .. (first + i - 1), 'e', ARGV[10 + i])
  end
end
if first + n - 1 > logged then logged = first + n - 1 end
redis.call('HSET', KEYS[2], 'total', ARGV[5], 'kept', ARGV[6], 'size', ARGV[7],
  'stopped', ARGV[8], 'logged', logged)
local at = 11 + n
local ttl = tonumber(ARGV[2])
if ARGV[at] == '1' then
  redis.call('XADD', KEYS[1], '0-' .. (tonumber(ARGV[6]) + 1), 'end', ARGV[at + 1],
    'f', ARGV[at + 2])
  redis.call('HSET', KEYS[2], 'end', '1')
  redis.call('DEL', KEYS[3])
else
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
  ttl = ttl + 2 * tonumber(ARGV[3])
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
if redis.call('HGET', KEYS[2], 'cancel') then return {1, 1} end
return {1, 0}
"""

#: KEYS: meta, lease, log. ARGV: token, lease ms. Returns {} or {total, kept, size,
#: stopped, max_bytes, ttl ms} when the lease was taken (an orphan: no end, no lease).
#: The first look at an orphan only starts its grace (one lease, by Redis's clock, the
#: log kept a TTL past it): its writer may have been cut off from Redis rather than
#: dead, and takes its lease back the moment it can write (``WRITE``).
ADOPT = """
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HGET', KEYS[1], 'end') then
  return {}
end
if redis.call('EXISTS', KEYS[2]) == 1 then return {} end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local grace = tonumber(redis.call('HGET', KEYS[1], 'grace'))
if not grace then
  local keep = tonumber(ARGV[2]) + tonumber(redis.call('HGET', KEYS[1], 'ttl') or '0')
  redis.call('HSET', KEYS[1], 'grace', now + tonumber(ARGV[2]))
  if redis.call('PTTL', KEYS[1]) < keep then
    redis.call('PEXPIRE', KEYS[1], keep)
    redis.call('PEXPIRE', KEYS[3], keep)
  end
  return {}
end
if now < grace then return {} end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {} end
redis.call('HSET', KEYS[1], 'writer', ARGV[1])
return redis.call('HMGET', KEYS[1], 'total', 'kept', 'size', 'stopped', 'max_bytes', 'ttl')
"""

#: KEYS: meta. Sets the cancel flag of an existing log; returns whether it exists.
CANCEL = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'cancel', '1')
return 1
"""


def _key(prefix: str, stream_id: str, kind: str) -> str:
    return f"{prefix}:s:{{{stream_id}}}:{kind}"


class _RedisWriter(Writer):
    """A writer whose events wait in ``_pending`` for the store's flusher, and stay
    there until a write took them (a write that failed is sent again once Redis is
    back: the client got those events, the log gets them too)."""

    def __init__(
        self,
        store: RedisStore,
        stream_id: str,
        token: str,
        *,
        max_bytes: int,
        ttl: float,
        lease: float,
        total: int = 0,
        size: int = 0,
        create: str = "",
    ) -> None:
        super().__init__(stream_id, max_bytes, total, size)
        self._store = store
        #: A new log's meta (JSON), made by its first write.
        self._create = create
        self._token = token
        self._ttl_ms = max(int(ttl * 1000), 1)
        self._lease_ms = max(int(lease * 1000), 1)
        #: Renewed by the flusher when no write renewed it for this long.
        self.renew_every = lease / 3
        self.written_at = time.monotonic()
        self.keys = [_key(store.prefix, stream_id, k) for k in ("log", "meta", "lease")]
        self._pending: list[bytes] = []
        self._first = self.kept + 1  # the event number of ``_pending[0]``
        self._end: End | None = None
        #: The end was written (or the lease lost): nothing more to write.
        self.closed = False
        #: A write failed (Redis away): the log is behind what was relayed.
        self.behind = False
        #: Its last write failed for want of its node while the rest of Redis answers:
        #: ``flush`` and ``finish`` say so at once (StoreError) rather than wait for the
        #: node, and the store writes it again every ``AWAY_RETRY_SECONDS``.
        self.away = False
        store.live.add(self)

    def _room(self, size: int) -> bool:
        return self._store.budget.take(self.id, size)

    def _add_all(self, events: list[bytes]) -> None:
        if self.lost:  # nothing more is written: nothing is queued either
            return
        self._pending.extend(events)
        self._store.dirty(self)

    def _stop(self) -> None:
        self._store.dirty(self)  # the counters say so at the next write

    def next_call(self) -> tuple[list[Any], int]:
        """The script's arguments for what is queued (at most ``WRITE_BATCH`` events,
        then the end when nothing else is), and how many events they carry."""
        batch = self._pending[:WRITE_BATCH]
        args: list[Any] = [
            *(self._token, self._ttl_ms, self._lease_ms, self._create),
            *(self.total, self.kept, self.size, int(self.stopped)),
            *(self._first, len(batch), *batch),
        ]
        end = self._end
        if end is not None and len(self._pending) == len(batch):
            args += ["1", end.trailer, json.dumps(dict(end.fields))]
        else:
            args.append("0")
        return args, len(batch)

    def written(self, answer: Any, ended: bool, sent: int) -> None:
        """The flusher's report of one call that reached Redis: its answer (or the
        script's error), for the ``sent`` events it carried."""
        self.written_at = time.monotonic()
        self.away = False
        owned, cancel = (0, 0) if isinstance(answer, Exception) else answer
        if not owned:
            self.lost = True
            if self.behind or self._pending:
                log.warning(
                    "stream %s: its log was taken over or expired while Redis was away; "
                    "%d events the client got are not in it",
                    self.id,
                    len(self._pending),
                )
            self._pending.clear()
        else:
            del self._pending[:sent]
            self._first += sent
            self._create = ""
            if cancel:
                self._cancelled()
            if self.behind and not self._pending:
                self.behind = False
                log.info("stream %s: its log caught up after Redis was away", self.id)
        if self.lost or (ended and owned):
            self.closed = True
            self._store.live.discard(self)
            self._store.budget.expires(self.id, time.monotonic() + self._ttl_ms / 1000)
        elif self._pending or self._end is not None:
            self._store.dirty(self)

    @property
    def creating(self) -> bool:
        """Its log is not made yet (its first write has not succeeded)."""
        return bool(self._create)

    @property
    def ending(self) -> bool:
        return self._end is not None and len(self._pending) <= WRITE_BATCH

    async def flush(self) -> None:
        while (self._pending or self._create) and not self.lost:
            self._store.check()
            self._check_node()
            self._store.dirty(self)
            await self._store.next_write()

    def _check_node(self) -> None:
        if self.away:  # kept, and written once its node answers
            raise StoreError("the Redis node of this log is unavailable")

    async def finish(self, end: End) -> None:
        """Write the end; StoreError when Redis is away (the end is written with the
        events before it once it is back: this writer stays queued until then)."""
        if self.finished:
            return
        self.finished = True
        self._end = end
        await self._close()

    async def release(self) -> None:
        if self.finished:
            return
        self.finished = True
        with contextlib.suppress(StoreError):
            await self.flush()
        self.closed = True
        self._store.live.discard(self)  # no more renewals: the lease runs out
        self._store.budget.expires(self.id, time.monotonic() + self._ttl_ms / 1000)

    async def _close(self) -> None:
        while not self.closed:
            self._store.check()
            self._check_node()
            self._store.dirty(self)
            await self._store.next_write()


def _retrieved(future: asyncio.Future[Any]) -> None:
    """A PING no one waits for any more: its failure, if any, is taken (not logged)."""
    if not future.cancelled():
        future.exception()


class _Tail:
    """The one blocking read of a followed stream in this process."""

    __slots__ = ("changed", "last", "readers")

    def __init__(self, last: int) -> None:
        self.last = last
        self.readers = 0
        self.changed = asyncio.Event()

    def wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class RedisStore(StreamStore):
    remote = True

    def __init__(
        self, redis: RedisConnection, timeout: float, max_bytes: int, prefix: str = "gateway"
    ) -> None:
        """``redis``: the clients, built by the store's owner (``gateway.app``) with the
        one client factory; the asyncio one without a socket timeout (every call here
        has its own bound, a blocking read a long one) and up to ``MAX_CONNECTIONS``."""
        self._connection = redis
        #: Whether a call's error (raised, or a pipeline's answer) says its node is away,
        #: not that the script refused: the call is sent again, its events kept.
        self._away = redis.away
        #: The probe's own blocking client (made in its thread, when first needed).
        self._pinger: Any = None
        #: A cluster's failing master fails a pipeline whole (``_each`` then sorts it).
        self._cluster = redis.cluster
        self._redis: Any = redis.client
        self._tails: dict[str, _Tail] = {}
        #: Writers with something to write, in the order they asked.
        self._dirty: dict[_RedisWriter, None] = {}
        #: Writers whose lease is held (renewed by the flusher).
        self.live: set[_RedisWriter] = set()
        self._wake = asyncio.Event()
        self._written: asyncio.Future[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.timeout = timeout
        self.prefix = prefix
        self.budget = Budget(max_bytes, time.monotonic)
        self.write = self._redis.register_script(WRITE)
        self._adopt = self._redis.register_script(ADOPT)
        self._cancel = self._redis.register_script(CANCEL)
        #: The breaker: when the current outage started (monotonic), None while Redis
        #: answers. While it is open every call fails at once (``check``) and one
        #: background PING a ``RETRY_SECONDS`` says when Redis is back.
        self.down_since: float | None = None
        #: Calls that failed or were refused during the current outage.
        self._failures = 0
        self._back = asyncio.Event()
        self._back.set()
        self._prober: asyncio.Task[None] | None = None
        #: Resolved once the probe's first PING said whether Redis is away.
        self._confirming: asyncio.Future[None] | None = None

    @property
    def size(self) -> int:
        self.budget.expire()
        return self.budget.used

    def check(self) -> None:
        """Raise StoreError at once while Redis is known to be away (the breaker)."""
        if self.down_since is not None:
            self._failures += 1
            raise StoreError("Redis is unavailable")

    def _trip(self, exc: BaseException) -> StoreError:
        """A call failed: one PING (``_ping``) confirms that Redis is away before the
        breaker opens (a deadline kept on a busy event loop can fire with the answer
        already on the socket); the StoreError for the caller."""
        self._failures += 1
        if self.down_since is None and self._prober is None:
            loop = asyncio.get_running_loop()
            self._confirming = loop.create_future()
            self._prober = loop.create_task(self._probe(exc))
        written, self._written = self._written, None  # a flush waiting on it looks again
        if written is not None and not written.done():
            written.set_result(None)
        return StoreError(type(exc).__name__)

    def _make_pinger(self) -> None:
        if self._pinger is None:
            self._pinger = self._connection.blocking()

    def _blocking_ping(self) -> None:
        self._make_pinger()
        self._pinger.ping()

    def _masters(self) -> list[Any]:
        """A cluster's masters as the probe's client knows them, each with its own
        client (built here, in a thread: a seed that fails to answer waits its timeout),
        which tries a PING once (redis-py's node clients would try it ten times)."""
        self._make_pinger()
        pinger = self._pinger
        clients = [pinger.get_redis_connection(node) for node in pinger.get_primaries()]
        for client in clients:
            client.set_retry(Retry(NoBackoff(), 0))
        return clients

    async def _ping(self) -> bool:
        """One PING from a thread, its deadline the socket's own: it measures Redis,
        not this event loop (a burst of streams keeps the loop busy for longer than
        the timeout, and a deadline kept on it would call a healthy Redis away).

        A cluster is up while one of its masters answers: every master is PINGed at
        once, each through its own client (no cluster retries), and the first answer
        says so. A failing master's slots wait for its failover (each call to them
        fails on its own) while the other masters' logs go on being written; a PING
        to all masters at once failed with the failing one, and stopped every log."""
        try:
            if not self._cluster:
                await asyncio.to_thread(self._blocking_ping)
                return True
            masters = await asyncio.to_thread(self._masters)
        except FAILURES:
            return False
        pings = {asyncio.ensure_future(asyncio.to_thread(m.ping)) for m in masters}
        while pings:
            done, pings = await asyncio.wait(pings, return_when=asyncio.FIRST_COMPLETED)
            if [p for p in done if not p.exception()]:  # (every failure taken)
                for late in pings:  # each ends within its socket's timeout
                    late.add_done_callback(_retrieved)
                return True
        return False

    async def _probe(self, exc: BaseException) -> None:
        """Confirm an outage (then the breaker opens, logged once), and PING every
        ``RETRY_SECONDS`` (never on a request's way) until Redis answers; then the
        breaker closes (logged with the outage's length) and what waits is written."""
        up = await self._ping()
        confirming, self._confirming = self._confirming, None
        if up:
            self._prober = None
            self._failures = 0
            self._wake.set()
        else:
            self.down_since = time.monotonic()
            self._back.clear()
        if confirming is not None and not confirming.done():
            confirming.set_result(None)
        if up:
            return
        since = time.monotonic()
        log.warning(
            "stream store: Redis unavailable (%s): new streams go without resume and "
            "answers uncached, and the logs being written wait in memory, until it "
            "answers again",
            type(exc).__name__,
        )
        while True:
            await asyncio.sleep(RETRY_SECONDS)
            if await self._ping():
                break
        behind = sum(1 for writer in self.live if writer.behind)
        log.warning(
            "stream store: Redis answers again after %.1f s (%d calls failed or refused "
            "meanwhile); %d logs being written catch up",
            time.monotonic() - since,
            self._failures,
            behind,
        )
        self.down_since, self._failures, self._prober = None, 0, None
        self._back.set()
        self._wake.set()

    async def call(self, script: Any, keys: list[str], args: list[Any], wait: float = 0.0) -> Any:
        """One script call, bounded by the timeout; any failure is a StoreError."""
        self.check()
        try:
            async with asyncio.timeout(self.timeout + wait):
                return await script(keys=keys, args=args)
        except FAILURES as exc:
            raise self._trip(exc) from None

    async def _do(self, command: str, *args: Any, wait: float = 0.0) -> Any:
        self.check()
        try:
            async with asyncio.timeout(self.timeout + wait):
                return await self._redis.execute_command(command, *args)
        except FAILURES as exc:
            raise self._trip(exc) from None

    def _start(self) -> None:
        """The flusher and the renewer, once there is a writer."""
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._flusher()), loop.create_task(self._renewer())]

    def dirty(self, writer: _RedisWriter) -> None:
        """``writer`` has something to write: the next pipeline takes it (one whose node
        is away: its retry does)."""
        if writer.away:
            return
        self._start()
        self._dirty[writer] = None
        self._wake.set()

    def _node_away(self, writer: _RedisWriter) -> None:
        """A write of ``writer`` failed for want of its node, while the rest of Redis may
        answer: kept, and written again in a moment (not at once: no pipeline a
        millisecond at a node that is away)."""
        writer.behind = writer.away = True
        asyncio.get_running_loop().call_later(AWAY_RETRY_SECONDS, self._retry, writer)

    def _retry(self, writer: _RedisWriter) -> None:
        if not writer.closed and not writer.lost:
            self._dirty[writer] = None
            self._wake.set()

    def next_write(self) -> asyncio.Future[None]:
        """Resolved once the next pipeline (one that starts after now) was written."""
        if self._written is None:
            self._written = asyncio.get_running_loop().create_future()
        return self._written

    async def _flusher(self) -> None:
        """One pipeline for every writer with something to write, then the next: the
        events of every stream in this process reach Redis in one round trip per
        ``FLUSH_SECONDS`` at most, never one per event. While Redis is away nothing is
        sent; what waits is written once the probe saw it back."""
        while True:
            await self._wake.wait()
            await self._back.wait()
            await asyncio.sleep(FLUSH_SECONDS)  # what comes meanwhile goes in the same one
            self._wake.clear()
            writers = [w for w in self._dirty if not w.closed]
            self._dirty.clear()
            done, self._written = self._written, None
            calls = [(w, w.ending, *w.next_call()) for w in writers]
            try:
                async with asyncio.timeout(self.timeout + len(calls) * 0.001):
                    async with self._redis.pipeline(transaction=False) as pipe:
                        for writer, _, args, _ in calls:
                            await self.write(keys=writer.keys, args=args, client=pipe)
                        answers = await pipe.execute(raise_on_error=False)
            except FAILURES as exc:
                if not self._cluster:
                    self._trip(exc)
                    for writer in writers:  # kept, and sent again once Redis is back
                        writer.behind = True
                        self._dirty[writer] = None
                elif len(calls) == 1:  # its node failed, or all of Redis: the PING says
                    self._trip(exc)
                    self._node_away(calls[0][0])
                elif not await self._each(calls):
                    self._trip(exc)  # none was written: the PING says whether Redis is away
            else:
                if any(isinstance(answer, NoScriptError) for answer in answers):
                    await self._reload()  # a promoted replica: scripts are not replicated
                for (writer, ended, _, sent), answer in zip(calls, answers, strict=True):
                    if isinstance(answer, NoScriptError):  # again, once the scripts are in
                        writer.behind = True
                        self._dirty[writer] = None
                    elif self._away(answer):
                        self._node_away(writer)
                    else:
                        writer.written(answer, ended, sent)
            if done is not None and not done.done():
                done.set_result(None)

    async def _reload(self) -> None:
        """Load the scripts again (on every master of a cluster): a replica promoted by a
        failover has none of them (a cluster pipeline answers NOSCRIPT; a plain one loads
        them itself)."""
        with contextlib.suppress(*FAILURES):
            async with asyncio.timeout(self.timeout):
                for script in (self.write, self._adopt, self._cancel):
                    script.sha = await self._redis.script_load(script.script)

    async def _each(self, calls: list[tuple[_RedisWriter, bool, list[Any], int]]) -> bool:
        """A cluster's pipeline failed: one node (a failing master) fails it whole. Each
        call again on its own, so the logs on the other masters' slots never notice:
        those that failed wait (``behind``, ``away``) and go again in a moment. False
        when every one failed (the PING then says whether Redis is away)."""

        async def one(writer: _RedisWriter, args: list[Any]) -> Any:
            try:
                async with asyncio.timeout(self.timeout):
                    return await self.write(keys=writer.keys, args=args)
            except FAILURES as exc:
                if self._away(exc):
                    return None  # its node is away: behind
                return exc  # the script's own error: written() says what it means

        answers = await asyncio.gather(*(one(w, args) for w, _, args, _ in calls))
        for (writer, ended, _, sent), answer in zip(calls, answers, strict=True):
            if answer is None:
                self._node_away(writer)
            else:
                writer.written(answer, ended, sent)
        return any(answer is not None for answer in answers)

    async def _renewer(self) -> None:
        """Every writer whose lease no write renewed lately gets an empty write."""
        while True:
            await asyncio.sleep(RENEW_TICK_SECONDS)
            now = time.monotonic()
            for writer in list(self.live):
                if now - writer.written_at >= writer.renew_every:
                    self.dirty(writer)

    async def available(self) -> None:
        await self._back.wait()

    async def prepare(self) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                for script in (self.write, self._adopt, self._cancel):
                    script.sha = await self._redis.script_load(script.script)
        except FAILURES as exc:
            raise self._trip(exc) from None
        # The probe's client built while Redis answers: a cluster client asks its seeds as
        # it is built, each for up to the timeout, which at an outage's first failure
        # would add one wait a seed to the request that met it.
        with contextlib.suppress(*FAILURES):
            await asyncio.to_thread(self._make_pinger)

    async def close(self) -> None:
        for task in [*self._tasks, *([self._prober] if self._prober else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self._redis.aclose()
        if self._pinger is not None:
            self._pinger.close()

    def _k(self, stream_id: str, kind: str) -> str:
        return _key(self.prefix, stream_id, kind)

    async def _open(self, stream_id: str, new: NewLog) -> Writer | None:
        token = secrets.token_hex(8)
        fields: dict[str, Any] = {f"m:{k}": v for k, v in new.meta.items()}
        fields |= {"owner": new.owner, "total": 0, "kept": 0, "size": 0, "stopped": 0}
        fields |= {"max_bytes": new.max_bytes, "ttl": int(new.ttl * 1000)}
        self._start()
        writer = _RedisWriter(
            self,
            stream_id,
            token,
            max_bytes=new.max_bytes,
            ttl=new.ttl,
            lease=new.lease,
            create=json.dumps(fields),
        )
        # The log is made (meta and lease, by the next pipeline: a burst of new streams
        # shares one round trip) before its id is handed out: an id the store has not
        # taken is never given to a client.
        # A failed pipeline is tried again until the probe confirmed an outage (at
        # most about twice the timeout; a busy loop's false timeout costs nothing).
        while writer.creating and not writer.lost:
            if self._confirming is not None:  # a failure is being looked at: its verdict
                await asyncio.shield(self._confirming)
            try:
                self.check()
            except StoreError:
                writer.closed = True
                self.live.discard(writer)
                self._dirty.pop(writer, None)
                raise
            self.dirty(writer)
            await self.next_write()
        return None if writer.lost else writer

    async def adopt(self, stream_id: str, *, lease: float) -> Writer | None:
        token = secrets.token_hex(8)
        keys = [self._k(stream_id, k) for k in ("meta", "lease", "log")]
        got = await self.call(self._adopt, keys, [token, max(int(lease * 1000), 1)])
        if not got:
            return None
        self._start()
        total, kept, size, stopped, max_bytes, ttl = (int(v or 0) for v in got)
        writer = _RedisWriter(
            self,
            stream_id,
            token,
            max_bytes=max_bytes,
            ttl=ttl / 1000,
            lease=lease,
            total=kept,
            size=size,
        )
        writer.total, writer.stopped = total, bool(stopped)
        return writer

    async def info(self, stream_id: str) -> StreamInfo | None:
        self.check()
        try:
            async with asyncio.timeout(self.timeout):
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.hgetall(self._k(stream_id, "meta"))
                    pipe.exists(self._k(stream_id, "lease"))
                    pipe.xrevrange(self._k(stream_id, "log"), count=1)
                    meta, leased, last = await pipe.execute()
        except FAILURES as exc:
            raise self._trip(exc) from None
        if not meta:
            return None
        end = None
        if meta.get(b"end") and last:
            end = _end_of(last[0][1])
        return _info(meta, bool(leased), end)

    async def read(self, stream_id: str, after: int, *, wait: float = 0.0) -> Batch | None:
        log = self._k(stream_id, "log")
        self.check()
        try:
            async with asyncio.timeout(self.timeout):
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.hmget(self._k(stream_id, "meta"), "total", "kept", "stopped", "end")
                    pipe.xrange(log, f"0-{after + 1}", "+", count=READ_LIMIT)
                    (total, kept, stopped, ended), entries = await pipe.execute()
        except FAILURES as exc:
            raise self._trip(exc) from None
        if total is None:
            return None
        if after > int(total):
            raise BeyondEnd
        if after >= int(kept) and stopped == b"1":
            raise Gone
        if not entries and not ended and wait > 0:
            await self._wait(stream_id, after, wait)
            return await self.read(stream_id, after)
        return _batch(after, entries, stopped == b"1")

    async def _wait(self, stream_id: str, after: int, wait: float) -> None:
        """Wait up to ``wait`` seconds for news of ``stream_id`` (the shared tail)."""
        tail = self._tails.get(stream_id)
        if tail is None:
            tail = self._tails[stream_id] = _Tail(after)
            task = asyncio.get_running_loop().create_task(self._tail(stream_id, tail))
            task.add_done_callback(lambda _: self._tails.pop(stream_id, None))
        tail.readers += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await tail.changed.wait()
        finally:
            tail.readers -= 1

    async def _tail(self, stream_id: str, tail: _Tail) -> None:
        log = self._k(stream_id, "log")
        block = max(int(TAIL_BLOCK_SECONDS * 1000), 1)
        try:
            while tail.readers > 0 or not tail.changed.is_set():
                got = await self._do(
                    "XREAD", "BLOCK", block, "STREAMS", log, f"0-{tail.last}",
                    wait=TAIL_BLOCK_SECONDS,
                )  # fmt: skip
                if got:
                    entries = got[0][1]
                    tail.last = int(entries[-1][0].split(b"-")[1])
                    tail.wake()
                if tail.readers == 0:
                    return
        except StoreError:
            tail.wake()  # the readers look again themselves (and meet the error)

    async def cancel(self, stream_id: str) -> bool:
        return bool(await self.call(self._cancel, [self._k(stream_id, "meta")], []))

    async def delete(self, stream_id: str) -> None:
        await self._do("DEL", *(self._k(stream_id, k) for k in ("log", "meta", "lease")))
        self.budget.give_back(stream_id)

    def _name(self, name: str) -> str:
        return f"{self.prefix}:n:{name}"

    async def claim(self, name: str, stream_id: str, ttl: float) -> str | None:
        key = self._name(name)
        ms = max(int(ttl * 1000), 1)
        if await self._do("SET", key, stream_id, "NX", "PX", ms):
            return None
        held = await self._do("GET", key)
        return held.decode() if held is not None else None

    async def resolve(self, name: str) -> str | None:
        held = await self._do("GET", self._name(name))
        return held.decode() if held is not None else None

    async def forget(self, name: str) -> None:
        await self._do("DEL", self._name(name))


def _end_of(fields: Mapping[bytes, bytes]) -> End | None:
    trailer = fields.get(b"end")
    if trailer is None:
        return None
    return End(trailer, json.loads(fields.get(b"f", b"{}")))


def _batch(after: int, entries: list[tuple[bytes, Mapping[bytes, bytes]]], stopped: bool) -> Batch:
    events: list[bytes] = []
    end = None
    for _, fields in entries:
        event = fields.get(b"e")
        if event is not None:
            events.append(event)
        elif not stopped:
            end = _end_of(fields)
    return Batch(after, events, end)


def _info(meta: Mapping[bytes, bytes], leased: bool, end: End | None) -> StreamInfo:
    return StreamInfo(
        owner=meta[b"owner"].decode(),
        meta={k[2:].decode(): v.decode() for k, v in meta.items() if k.startswith(b"m:")},
        total=int(meta[b"total"]),
        kept=int(meta[b"kept"]),
        size=int(meta[b"size"]),
        stopped=meta[b"stopped"] == b"1",
        leased=leased,
        cancel=b"cancel" in meta,
        end=end,
    )
