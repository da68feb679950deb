"""The Redis store: stream logs shared by every worker and replica (Redis Streams).

Per stream, three keys under one hash tag (one cluster slot):

- ``{prefix}:s:{id}:log``, a Redis Stream with one entry per relayed event, its
  entry id ``0-N`` for event N (so ``XRANGE``/``XREAD`` after ``0-N`` return
  exactly what follows event N), field ``e`` the event's bytes; the end is one
  more entry with fields ``end`` (the trailer) and ``f`` (its fields, JSON);
- ``{prefix}:s:{id}:meta``, a hash: owner, the writer's ``m:*`` meta fields,
  ``total``, ``kept``, ``size``, ``stopped``, ``max_bytes``, ``end``, ``cancel``;
- ``{prefix}:s:{id}:lease``, the writer's token, with a short expiry it renews.

A writer never writes per event: ``append`` queues, and one task per writer
writes what queued meanwhile in one script call (``WRITE``: the lease is checked,
the entries added, the counters set, every key's expiry pushed back ``ttl``), at
once when idle and otherwise as soon as the call before returns; with nothing
queued, the same call renews the lease every third of it and reports a cancel
request. Live readers of one stream in one process share one ``XREAD BLOCK`` on
its log (a ``_Tail``), which wakes them all: a hundred resumers of a stream hold
one blocked connection, not a hundred.

Every call is bounded by the store's timeout (plus the wait of a blocking read);
every failure is a ``StoreError``. A writer whose write fails stops writing: its
lease runs out and the stream is an orphan (``owner_lost`` for its readers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Mapping
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.store.api import (
    READ_LIMIT,
    Batch,
    BeyondEnd,
    End,
    Gone,
    StoreError,
    StreamInfo,
    Writer,
    new_stream_id,
)
from gateway.store.budget import Budget

__all__ = ["RedisStore"]

#: Connections to Redis per process at most (one per followed stream, plus short calls).
MAX_CONNECTIONS = 4096
#: How long one shared blocking read waits before it looks again for readers.
TAIL_BLOCK_SECONDS = 1.0

#: Events written in one script call at most.
WRITE_BATCH = 256

#: KEYS: log, meta, lease. ARGV: token, ttl ms, lease ms, total, kept, size, stopped,
#: first event number, n, the n events, then "1", trailer, fields (the end) or "0".
#: Returns {owned, cancel}.
WRITE = """
if redis.call('GET', KEYS[3]) ~= ARGV[1] then return {0, 0} end
local first, n = tonumber(ARGV[8]), tonumber(ARGV[9])
for i = 1, n do
  redis.call('XADD', KEYS[1], '0-' .. (first + i - 1), 'e', ARGV[9 + i])
end
redis.call('HSET', KEYS[2], 'total', ARGV[4], 'kept', ARGV[5], 'size', ARGV[6],
  'stopped', ARGV[7])
local at = 10 + n
if ARGV[at] == '1' then
  redis.call('XADD', KEYS[1], '0-' .. (tonumber(ARGV[5]) + 1), 'end', ARGV[at + 1],
    'f', ARGV[at + 2])
  redis.call('HSET', KEYS[2], 'end', '1')
  redis.call('DEL', KEYS[3])
else
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
if redis.call('HGET', KEYS[2], 'cancel') then return {1, 1} end
return {1, 0}
"""

#: KEYS: meta, lease. ARGV: token, lease ms. Returns {} or {total, kept, size, stopped,
#: max_bytes, ttl ms} when the lease was taken (an orphan: no end, no lease).
ADOPT = """
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HGET', KEYS[1], 'end') then
  return {}
end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {} end
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
    ) -> None:
        super().__init__(stream_id, max_bytes, total, size)
        self._store = store
        self._token = token
        self._ttl_ms = max(int(ttl * 1000), 1)
        self._lease_ms = max(int(lease * 1000), 1)
        self._renew = lease / 3
        self._keys = [_key(store.prefix, stream_id, k) for k in ("log", "meta", "lease")]
        self._pending: list[bytes] = []
        self._first = self.kept + 1  # the event number of ``_pending[0]``
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._stopping = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    def _room(self, size: int) -> bool:
        return self._store.budget.take(self.id, size)

    def _add(self, event: bytes) -> None:
        if self.lost:  # nothing more is written: nothing is queued either
            return
        self._pending.append(event)
        self._wake.set()

    def _stop(self) -> None:
        self._wake.set()  # the counters say so at the next write

    async def _run(self) -> None:
        while not self._stopping and not self.lost:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._renew):
                    await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            await self._write()

    async def _write(self, end: End | None = None) -> None:
        async with self._lock:
            while not self.lost:
                batch = self._pending[:WRITE_BATCH]
                del self._pending[:WRITE_BATCH]
                first = self._first
                self._first += len(batch)
                last = not self._pending
                args: list[Any] = [
                    *(self._token, self._ttl_ms, self._lease_ms),
                    *(self.total, self.kept, self.size, int(self.stopped)),
                    *(first, len(batch), *batch),
                ]
                if end is not None and last:
                    args += ["1", end.trailer, json.dumps(dict(end.fields))]
                else:
                    args.append("0")
                try:
                    owned, cancel = await self._store.call(self._store.write, self._keys, args)
                except StoreError:
                    owned, cancel = 0, 0
                if not owned:
                    self.lost = True
                    self._pending.clear()
                    self._store.budget.expires(self.id, time.monotonic() + self._ttl_ms / 1000)
                    return
                if cancel:
                    self._cancelled()
                if last:
                    return

    async def flush(self) -> None:
        if self._pending:
            await self._write()

    async def _halt(self) -> None:
        self._stopping = True
        self._wake.set()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def finish(self, end: End) -> None:
        if self.finished:
            return
        self.finished = True
        await self._halt()
        await self._write(end)
        self._store.budget.expires(self.id, time.monotonic() + self._ttl_ms / 1000)

    async def release(self) -> None:
        if self.finished:
            return
        self.finished = True
        await self._halt()
        with contextlib.suppress(StoreError):
            await self.flush()
        self._store.budget.expires(self.id, time.monotonic() + self._ttl_ms / 1000)


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


class RedisStore:
    remote = True

    def __init__(self, url: str, timeout: float, max_bytes: int, prefix: str = "gateway") -> None:
        self._redis: Any = Redis.from_url(
            url,
            socket_timeout=None,  # every call has its own bound (a blocking read is long)
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
            max_connections=MAX_CONNECTIONS,
        )
        self._tails: dict[str, _Tail] = {}
        self.timeout = timeout
        self.prefix = prefix
        self.budget = Budget(max_bytes, time.monotonic)
        self.write = self._redis.register_script(WRITE)
        self._adopt = self._redis.register_script(ADOPT)
        self._cancel = self._redis.register_script(CANCEL)

    @property
    def size(self) -> int:
        self.budget.expire()
        return self.budget.used

    async def call(self, script: Any, keys: list[str], args: list[Any], wait: float = 0.0) -> Any:
        """One script call, bounded by the timeout; any failure is a StoreError."""
        try:
            async with asyncio.timeout(self.timeout + wait):
                return await script(keys=keys, args=args)
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreError(type(exc).__name__) from None

    async def _do(self, command: str, *args: Any, wait: float = 0.0) -> Any:
        try:
            async with asyncio.timeout(self.timeout + wait):
                return await self._redis.execute_command(command, *args)
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreError(type(exc).__name__) from None

    async def prepare(self) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                for script in (self.write, self._adopt, self._cancel):
                    script.sha = await self._redis.script_load(script.script)
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreError(type(exc).__name__) from None

    async def close(self) -> None:
        await self._redis.aclose()

    def _k(self, stream_id: str, kind: str) -> str:
        return _key(self.prefix, stream_id, kind)

    async def open(
        self,
        owner: str,
        meta: Mapping[str, str],
        *,
        max_bytes: int,
        ttl: float,
        lease: float,
        stream_id: str | None = None,
    ) -> Writer | None:
        if not self.budget.room(max_bytes):
            return None
        stream_id = stream_id or new_stream_id()
        token = secrets.token_hex(8)
        fields: dict[str, Any] = {f"m:{k}": v for k, v in meta.items()}
        fields |= {"owner": owner, "total": 0, "kept": 0, "size": 0, "stopped": 0}
        fields |= {"max_bytes": max_bytes, "ttl": int(ttl * 1000)}
        meta_key = self._k(stream_id, "meta")
        try:
            async with asyncio.timeout(self.timeout):
                async with self._redis.pipeline(transaction=True) as pipe:
                    pipe.hset(meta_key, mapping=fields)
                    pipe.pexpire(meta_key, max(int(ttl * 1000), 1))
                    pipe.set(self._k(stream_id, "lease"), token, px=max(int(lease * 1000), 1))
                    await pipe.execute()
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreError(type(exc).__name__) from None
        return _RedisWriter(self, stream_id, token, max_bytes=max_bytes, ttl=ttl, lease=lease)

    async def adopt(self, stream_id: str, *, lease: float) -> Writer | None:
        token = secrets.token_hex(8)
        keys = [self._k(stream_id, "meta"), self._k(stream_id, "lease")]
        got = await self.call(self._adopt, keys, [token, max(int(lease * 1000), 1)])
        if not got:
            return None
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
        try:
            async with asyncio.timeout(self.timeout):
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.hgetall(self._k(stream_id, "meta"))
                    pipe.exists(self._k(stream_id, "lease"))
                    pipe.xrevrange(self._k(stream_id, "log"), count=1)
                    meta, leased, last = await pipe.execute()
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreError(type(exc).__name__) from None
        if not meta:
            return None
        end = None
        if meta.get(b"end") and last:
            end = _end_of(last[0][1])
        return _info(meta, bool(leased), end)

    async def read(self, stream_id: str, after: int, *, wait: float = 0.0) -> Batch | None:
        log = self._k(stream_id, "log")
        try:
            async with asyncio.timeout(self.timeout):
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.hmget(self._k(stream_id, "meta"), "total", "kept", "stopped", "end")
                    pipe.xrange(log, f"0-{after + 1}", "+", count=READ_LIMIT)
                    (total, kept, stopped, ended), entries = await pipe.execute()
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreError(type(exc).__name__) from None
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
