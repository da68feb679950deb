"""The memory store: stream logs in this process's memory (one process only).

Each log is a list of event bytes with its owner, meta, counters and end; a reader
that waits for more waits on the log's ``changed`` event, set by every append and
by the end. The lease is held for as long as the writer lives (``release`` or a
lost task gives it up at once: there is no other process to take over in time).
A sweeper drops, once a second, each log whose TTL has passed since its last
write; the total budget is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
from collections.abc import Mapping

from gateway.store.api import (
    READ_LIMIT,
    Batch,
    BeyondEnd,
    End,
    Gone,
    NewLog,
    StreamInfo,
    StreamStore,
    Writer,
)
from gateway.store.budget import Budget

__all__ = ["MemoryStore"]

#: How often expired logs are dropped.
SWEEP_SECONDS = 1.0


class _Log:
    __slots__ = (
        "cancel",
        "changed",
        "end",
        "events",
        "expires_at",
        "lease_until",
        "max_bytes",
        "meta",
        "owner",
        "size",
        "stopped",
        "total",
        "ttl",
        "writer",
    )

    def __init__(self, owner: str, meta: Mapping[str, str], ttl: float, max_bytes: int) -> None:
        self.owner = owner
        self.max_bytes = max_bytes
        self.meta = dict(meta)
        self.ttl = ttl
        self.events: list[bytes] = []
        self.total = 0
        self.size = 0
        self.stopped = False
        self.cancel = False
        self.end: End | None = None
        self.lease_until = math.inf
        self.expires_at = math.inf
        #: Made by the first reader that waits (most logs never have one).
        self.changed: asyncio.Event | None = None
        self.writer: _MemoryWriter | None = None

    def wake(self) -> None:
        changed = self.changed
        if changed is not None:
            changed.set()
            self.changed = None

    def waiting(self) -> asyncio.Event:
        if self.changed is None:
            self.changed = asyncio.Event()
        return self.changed


class _MemoryWriter(Writer):
    def __init__(self, store: MemoryStore, stream_id: str, log: _Log, max_bytes: int) -> None:
        super().__init__(stream_id, max_bytes, log.total, log.size)
        self.kept = len(log.events)
        self.stopped = log.stopped
        self._store = store
        self._log = log
        log.writer = self

    def _room(self, size: int) -> bool:
        return self._store.budget.take(self.id, size)

    def _add_all(self, events: list[bytes]) -> None:
        log = self._log
        log.events.extend(events)
        log.size = self.size
        log.wake()

    def append(self, event: bytes) -> None:
        super().append(event)
        self._log.total = self.total

    def extend(self, events: list[bytes]) -> None:
        super().extend(events)
        self._log.total = self.total

    def _stop(self) -> None:
        self._log.stopped = True

    async def flush(self) -> None:
        return None

    async def finish(self, end: End) -> None:
        if self.finished or self.lost:
            return
        self.finished = True
        log = self._log
        log.total, log.stopped, log.end = self.total, self.stopped, end
        self._let_go(log)

    async def release(self) -> None:
        if not self.finished:
            self.finished = True
            self._let_go(self._log)

    def _let_go(self, log: _Log) -> None:
        now = self._store.clock()
        log.lease_until = now
        log.expires_at = now + log.ttl
        log.writer = None
        log.wake()
        self._store.expires(self.id, log.expires_at)


class MemoryStore(StreamStore):
    remote = False
    down_since: float | None = None

    def __init__(self, max_bytes: int) -> None:
        self.budget = Budget(max_bytes, self.clock)
        self._logs: dict[str, _Log] = {}
        self._names: dict[str, tuple[str, float]] = {}
        #: (expiry, id) of every log that has one: the sweep looks at the due ones only.
        self._expiries: list[tuple[float, str]] = []
        self._sweeper: asyncio.Task[None] | None = None

    @staticmethod
    def clock() -> float:
        return asyncio.get_running_loop().time()

    @property
    def size(self) -> int:
        return self.budget.used

    async def available(self) -> None:
        return None

    async def prepare(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            self.sweep()

    def expires(self, stream_id: str, at: float) -> None:
        heapq.heappush(self._expiries, (at, stream_id))

    def sweep(self) -> None:
        """Drop every log (and name) whose time is up."""
        now = self.clock()
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            _, stream_id = heapq.heappop(expiries)
            log = self._logs.get(stream_id)
            if log is not None and log.expires_at <= now:  # else written again since
                self._drop(stream_id)
        for name in [n for n, (_, at) in self._names.items() if at <= now]:
            del self._names[name]

    def _drop(self, stream_id: str) -> None:
        log = self._logs.pop(stream_id, None)
        self.budget.give_back(stream_id)
        if log is not None:
            log.wake()

    def _get(self, stream_id: str) -> _Log | None:
        log = self._logs.get(stream_id)
        if log is not None and log.expires_at <= self.clock():
            self._drop(stream_id)
            return None
        return log

    async def _open(self, stream_id: str, new: NewLog) -> Writer | None:
        log = _Log(new.owner, new.meta, new.ttl, new.max_bytes)
        self._logs[stream_id] = log
        return _MemoryWriter(self, stream_id, log, new.max_bytes)

    async def adopt(self, stream_id: str, *, lease: float) -> Writer | None:
        log = self._get(stream_id)
        if log is None or log.end is not None or log.lease_until > self.clock():
            return None
        log.lease_until = math.inf
        log.expires_at = math.inf
        return _MemoryWriter(self, stream_id, log, log.max_bytes)

    async def info(self, stream_id: str) -> StreamInfo | None:
        log = self._get(stream_id)
        if log is None:
            return None
        return StreamInfo(
            owner=log.owner,
            meta=log.meta,
            total=log.total,
            kept=len(log.events),
            size=log.size,
            stopped=log.stopped,
            leased=log.end is None and log.lease_until > self.clock(),
            cancel=log.cancel,
            end=log.end,
        )

    async def read(self, stream_id: str, after: int, *, wait: float = 0.0) -> Batch | None:
        log = self._get(stream_id)
        if log is None:
            return None
        batch = _batch(log, after)
        if batch.events or batch.end is not None or wait <= 0:
            return batch
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await log.waiting().wait()
        log = self._get(stream_id)
        return None if log is None else _batch(log, after)

    async def cancel(self, stream_id: str) -> bool:
        log = self._get(stream_id)
        if log is None:
            return False
        if not log.cancel:
            log.cancel = True
            if log.writer is not None:
                log.writer._cancelled()
        return True

    async def delete(self, stream_id: str) -> None:
        self._drop(stream_id)

    async def claim(self, name: str, stream_id: str, ttl: float) -> str | None:
        now = self.clock()
        held = self._names.get(name)
        if held is not None and held[1] > now:
            return held[0]
        self._names[name] = (stream_id, now + ttl)
        return None

    async def resolve(self, name: str) -> str | None:
        held = self._names.get(name)
        return held[0] if held is not None and held[1] > self.clock() else None

    async def forget(self, name: str) -> None:
        self._names.pop(name, None)


def _batch(log: _Log, after: int) -> Batch:
    kept = len(log.events)
    if after > log.total:
        raise BeyondEnd
    if after >= kept and log.stopped:
        raise Gone
    events = log.events[after : after + READ_LIMIT]
    end = log.end if after + len(events) >= kept and not log.stopped else None
    return Batch(after, events, end)
