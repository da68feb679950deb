"""The ledger: every request's receipt, and the spend report's running totals.

A receipt is kept under its request id with its owner (``client:<name>``, or
``key:<digest>`` of the credential presented) for ``receipts_ttl_seconds``; the
report's totals are kept per UTC day and per (client, team, model, route,
evidence), in nano-dollars with a count of requests, for ``spend_retention_days``.
Both are written together, once per request, so that the report's total is the
sum of the receipts'.

``MemoryLedger`` is this process's (bounded: at most ``receipts_max`` receipts,
the oldest dropped first); ``RedisLedger`` is shared by workers and replicas and
survives a restart of the gateway (and of Redis, with append-only persistence):
a receipt is a string key that expires, a day's totals one hash that expires,
all under one hash tag so each request's write is one transaction (MULTI/EXEC).
A write that fails is tried again, a bounded number of times, until Redis answers.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import orjson

if TYPE_CHECKING:
    from gateway.redisconn import RedisTarget

__all__ = ["Entry", "Ledger", "MemoryLedger", "RedisLedger", "Row", "Total"]

log = logging.getLogger("gateway")

#: The separator of a row's fields in a Redis hash field (no label holds it).
_SEP = "\x1f"
#: Receipts waiting to be written again after a failed write, at most.
_MAX_PENDING = 10_000
#: How long the Redis ledger waits between retries of what failed.
_RETRY_SECONDS = 1.0


class Row(NamedTuple):
    """What one request adds to the report: the day and the groups it counts in."""

    day: int  # days since the epoch, UTC
    client: str
    team: str
    model: str
    route: str
    evidence: str


class Entry(NamedTuple):
    """One request's entry: its ``receipt``, kept under its request id (and each of
    ``aliases``: a WebSocket response's own id) for ``owner``, and its ``nanos`` (and one
    request) added to ``row``'s total (None: a request of nobody's, reported nowhere)."""

    request_id: str
    owner: str
    receipt: dict[str, Any]
    row: Row | None
    nanos: int
    aliases: tuple[str, ...] = ()


#: A receipt to write: its request id, its aliases, its text, its row and its money.
_Item = tuple[str, tuple[str, ...], bytes, Row | None, int]


class Total(NamedTuple):
    """A group's total: its row, its money (nano-dollars) and its count of requests."""

    row: Row
    nanos: int
    requests: int


class Ledger(Protocol):
    async def keep(self, entry: Entry) -> None:
        """Keep ``entry``: its receipt, and its money in its row's total."""
        ...

    async def receipt(self, request_id: str) -> tuple[str, dict[str, Any]] | None:
        """The receipt kept under ``request_id`` and its owner, or None."""
        ...

    async def totals(self, first_day: int, last_day: int) -> list[Total]:
        """Every row's total from ``first_day`` to ``last_day`` (both included)."""
        ...

    async def close(self) -> None: ...


@dataclass(eq=False)
class MemoryLedger:
    """One process's receipts and totals, bounded."""

    ttl: float
    max_receipts: int
    retention_days: int
    clock: Callable[[], float] = time.time
    #: request id -> (expiry, owner, the receipt as JSON), oldest first: kept as bytes,
    #: which the garbage collector never walks (a receipt's dicts and lists, kept for
    #: its TTL, were walked again at each full collection)
    _receipts: collections.OrderedDict[str, tuple[float, str, bytes]] = field(
        default_factory=collections.OrderedDict, init=False
    )
    _totals: dict[Row, list[int]] = field(default_factory=dict, init=False)

    async def keep(self, entry: Entry) -> None:
        request_id, owner, receipt, row, nanos, aliases = entry
        now = self.clock()
        receipts = self._receipts
        text = _encoded(receipt)
        for name in (request_id, *aliases):
            receipts[name] = (now + self.ttl, owner, text)
            receipts.move_to_end(name)
        while len(receipts) > self.max_receipts:
            receipts.popitem(last=False)
        while receipts:
            first = next(iter(receipts.values()))
            if first[0] > now:
                break
            receipts.popitem(last=False)
        if row is not None:
            total = self._totals.get(row)
            if total is None:
                self._forget_days(row.day)
                total = self._totals[row] = [0, 0]
            total[0] += nanos
            total[1] += 1

    def _forget_days(self, today: int) -> None:
        oldest = today - self.retention_days
        for row in [r for r in self._totals if r.day < oldest]:
            del self._totals[row]

    async def receipt(self, request_id: str) -> tuple[str, dict[str, Any]] | None:
        found = self._receipts.get(request_id)
        if found is None or found[0] <= self.clock():
            return None
        receipt: dict[str, Any] = json.loads(found[2])
        return found[1], receipt

    async def totals(self, first_day: int, last_day: int) -> list[Total]:
        return [
            Total(row, nanos, count)
            for row, (nanos, count) in self._totals.items()
            if first_day <= row.day <= last_day
        ]

    async def close(self) -> None:
        pass


def _encoded(receipt: dict[str, Any]) -> bytes:
    """A receipt (or Redis's record of one) as JSON, for both ledgers (orjson: a
    fifteenth of the standard library's time; what it does not write, such as an
    integer beyond 64 bits, goes the standard way)."""
    try:
        return orjson.dumps(receipt)
    except orjson.JSONEncodeError:
        return json.dumps(receipt, separators=(",", ":")).encode()


class RedisLedger:
    """Receipts and totals in Redis, shared by every worker and replica."""

    def __init__(
        self,
        redis: RedisTarget | str,
        timeout: float,
        ttl: float,
        retention_days: int,
        prefix: str = "gateway",
    ) -> None:
        # imported here: the redis client (and what it imports) only where Redis is used
        from gateway.redisconn import as_target
        from gateway.redisconn.clients import async_client

        self._redis: Any = async_client(
            as_target(redis), socket_timeout=timeout, connect_timeout=timeout, max_connections=256
        )
        self._timeout = timeout
        self._ttl = max(int(ttl), 1)
        self._retention = retention_days
        # one hash tag: a request's receipt and its day's totals are written in one
        # transaction, on one slot of a cluster
        self._prefix = f"{prefix}:{{spend}}:"
        self._pending: collections.deque[_Item] = collections.deque(maxlen=_MAX_PENDING)
        self._retrying: asyncio.Task[None] | None = None
        #: When the current outage started (monotonic; None while Redis answers), and the
        #: receipts kept since: the outage is logged when it starts and when it ends.
        self._down_since: float | None = None
        self._kept = 0

    def _receipt_key(self, request_id: str) -> str:
        return f"{self._prefix}receipt:{request_id}"

    def _day_key(self, day: int) -> str:
        return f"{self._prefix}day:{day}"

    async def keep(self, entry: Entry) -> None:
        text = _encoded({"owner": entry.owner, "receipt": entry.receipt})
        item = (entry.request_id, entry.aliases, text, entry.row, entry.nanos)
        try:
            await self._write(item)
        except Exception as exc:  # any failure of Redis: kept to be written when it is back
            self._pending.append(item)
            self._kept += 1
            if self._down_since is None:  # logged once an outage, not once a receipt
                self._down_since = time.monotonic()
                log.warning(
                    "spend ledger: Redis does not answer (%s): receipts are kept (%d at most) "
                    "and written when it answers",
                    type(exc).__name__,
                    _MAX_PENDING,
                )
            if self._retrying is None or self._retrying.done():
                self._retrying = asyncio.get_running_loop().create_task(self._retry())

    async def _write(self, item: _Item) -> None:
        request_id, aliases, text, row, nanos = item
        async with asyncio.timeout(self._timeout * 4):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(self._receipt_key(request_id), text, ex=self._ttl)
                for alias in aliases:
                    pipe.set(self._receipt_key(alias), text, ex=self._ttl)
                if row is not None:
                    key = self._day_key(row.day)
                    field = _SEP.join(row[1:])
                    pipe.hincrby(key, "n" + _SEP + field, nanos)
                    pipe.hincrby(key, "r" + _SEP + field, 1)
                    pipe.expire(key, (self._retention + 1) * 86400)
                await pipe.execute()

    async def _retry(self) -> None:
        while self._pending:
            await asyncio.sleep(_RETRY_SECONDS)
            while self._pending:
                item = self._pending[0]
                try:
                    await self._write(item)
                except Exception:
                    break
                self._pending.popleft()
        if self._down_since is not None:
            log.warning(
                "spend ledger: Redis answers again after %.1f s; the %d receipts kept "
                "meanwhile are written",
                time.monotonic() - self._down_since,
                self._kept,
            )
            self._down_since, self._kept = None, 0

    async def receipt(self, request_id: str) -> tuple[str, dict[str, Any]] | None:
        async with asyncio.timeout(self._timeout * 4):
            text = await self._redis.get(self._receipt_key(request_id))
        if text is None:
            return None
        found = json.loads(text)
        return str(found["owner"]), dict(found["receipt"])

    async def totals(self, first_day: int, last_day: int) -> list[Total]:
        days = list(range(max(first_day, last_day - self._retention), last_day + 1))
        async with asyncio.timeout(self._timeout * 4 + 0.01 * len(days)):
            async with self._redis.pipeline(transaction=False) as pipe:
                for day in days:
                    pipe.hgetall(self._day_key(day))
                answers = await pipe.execute()
        found: list[Total] = []
        for day, fields in zip(days, answers, strict=True):
            found.extend(_rows(day, fields.items()))
        return found

    async def close(self) -> None:
        if self._retrying is not None:
            self._retrying.cancel()
        with contextlib.suppress(Exception):
            await self._redis.aclose()


def _rows(day: int, fields: Iterable[tuple[Any, Any]]) -> list[Total]:
    nanos: dict[tuple[str, ...], int] = {}
    counts: dict[tuple[str, ...], int] = {}
    for raw, value in fields:
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        kind, _, rest = name.partition(_SEP)
        parts = tuple(rest.split(_SEP))
        (nanos if kind == "n" else counts)[parts] = int(value)
    return [
        Total(Row(day, *parts), nanos.get(parts, 0), counts.get(parts, 0))
        for parts in nanos.keys() | counts.keys()
        if len(parts) == 5
    ]
