"""The spend stage: a receipt for every request, and the two endpoints that read the
ledger (``gateway.proxy.stages``).

Outermost on a request's way, it answers ``GET {prefix}/gateway/receipts/{id}``
(to the request's owner only: anyone else gets the same 404 as an unknown id) and
``GET {prefix}/gateway/spend`` (the report: grouped by any of client, team, model,
route and day over a range of UTC days; a client with ``spend_admin`` sees every
client, any other named client itself only). Any other request goes on its way;
when it ends (answered, refused, cut, rescued, resumed, cached or detached) its
receipt is written, with its charge added to the report's totals, by a task of its
own so that neither the answer nor a client that left waits for it. The WebSocket
relay, which is not on this way, keeps each response's receipt (and its handshake's)
through ``keep``. A rescued answer's receipt lists each attempt's part
(``usage_by_attempt``), its cost their sum.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

from gateway.guard.verdict import Usage
from gateway.money.prices import nanos_to_usd
from gateway.observe.accesslog import charged_fields, schema_fields
from gateway.observe.record import RequestRecord
from gateway.proxy.errors import send_error
from gateway.proxy.exchange import Exchange
from gateway.proxy.owner import owner_of
from gateway.proxy.stages import Next
from gateway.settings import ANONYMOUS
from gateway.spend.ledger import Entry, Ledger, Row, Total

__all__ = ["RECEIPTS_PATH", "SPEND_PATH", "SpendStage"]

log = logging.getLogger("gateway")

#: Below every route's prefix.
RECEIPTS_PATH = "/gateway/receipts/"
SPEND_PATH = "/gateway/spend"
#: The report's groups, in the order a row names them.
GROUPS = ("day", "client", "team", "model", "route", "evidence")
#: The longest range a report covers, in days.
MAX_DAYS = 400


class SpendStage:
    """Keeps a receipt of every request and answers the receipts and the report."""

    def __init__(
        self,
        ledger: Ledger,
        admins: frozenset[str],
        version: str,
        clock: Callable[[], float] = time.time,
        teams: dict[str, str] | None = None,
    ) -> None:
        self.ledger = ledger
        #: client -> its configured team
        self._teams = teams or {}
        self._admins = admins
        self._version = version
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, exchange: Exchange, call_next: Next) -> None:
        rest = exchange.rest.split("?", 1)[0]
        if exchange.record.method == "GET":
            if rest.startswith(RECEIPTS_PATH):
                await self._receipt(exchange, rest[len(RECEIPTS_PATH) :])
                return
            if rest == SPEND_PATH:
                await self._report(exchange)
                return
        try:
            await call_next(exchange)
        finally:
            self._keep(exchange)

    # -- keeping ----------------------------------------------------------------------------

    def _keep(self, exchange: Exchange) -> None:
        self.keep(exchange.record, owner_of(exchange), exchange.caller.team)

    def keep(
        self,
        record: RequestRecord,
        owner: str,
        team: str | None = None,
        aliases: tuple[str, ...] = (),
        counted: bool = True,
    ) -> None:
        """Write ``record``'s receipt for ``owner`` (under its request id and ``aliases``)
        and add its charge to the report (``counted``: as one request) by a task of its
        own; ``team``: its caller's (an issued key's) when its client has none configured."""
        if record.team is None:  # (a request refused before it was priced)
            record.team = self._teams.get(record.client_name) or team
        spend = record.spend
        nanos = spend.nanos if spend is not None else 0
        row = (
            Row(
                int(self._clock()) // 86400,
                record.client_name,
                record.team or "none",
                (spend.model if spend is not None else None) or record.model or "none",
                record.route,
                spend.evidence.value if spend is not None else "reported",
            )
            if counted and record.client_name != ANONYMOUS
            else None
        )
        receipt = receipt_of(record, self._version, self._clock())
        aliases = tuple(_alias(name, owner) for name in aliases)
        entry = Entry(record.request_id, owner, receipt, row, nanos, aliases)
        task = asyncio.get_running_loop().create_task(self.ledger.keep(entry))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Wait a little for the receipts being written, then close the ledger."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
        await self.ledger.close()

    # -- reading ----------------------------------------------------------------------------

    async def _receipt(self, exchange: Exchange, request_id: str) -> None:
        found = None
        owner = owner_of(exchange)
        if exchange.caller.name != ANONYMOUS or exchange.caller.keyed or _has_key(exchange):
            try:
                found = await self.ledger.receipt(request_id)
                if (found is None or found[0] != owner) and _ALIAS.match(request_id):
                    found = await self.ledger.receipt(_alias(request_id, owner))
            except Exception:
                await _error(exchange, 503, "The receipts store is unavailable; retry shortly.")
                return
        if found is None or found[0] != owner:
            await _error(exchange, 404, "No such receipt.")
            return
        await _json(exchange, 200, found[1])

    async def _report(self, exchange: Exchange) -> None:
        name = exchange.caller.name
        if name == ANONYMOUS:
            await _error(exchange, 403, "The spend report is for named clients.")
            return
        query = parse_qs(exchange.scope.get("query_string", b"").decode("latin-1"))
        groups = [g for part in query.get("group_by", ["client"]) for g in part.split(",") if g]
        try:
            today = int(self._clock()) // 86400
            last = _day(query.get("to", [None])[0], today)
            first = _day(query.get("from", [None])[0], last - 30)
            if any(g not in GROUPS for g in groups) or first > last or last - first > MAX_DAYS:
                raise ValueError
        except ValueError:
            await _error(
                exchange,
                400,
                f"group_by takes {', '.join(GROUPS)}; from and to are UTC days (YYYY-MM-DD), "
                f"from not after to, at most {MAX_DAYS} days apart.",
            )
            return
        try:
            totals = await self.ledger.totals(first, last)
        except Exception:
            await _error(exchange, 503, "The spend store is unavailable; retry shortly.")
            return
        if name not in self._admins:
            totals = [t for t in totals if t.row.client == name]
        await _json(exchange, 200, report(totals, groups, first, last, self._version))


def report(
    totals: list[Total], groups: list[str], first: int, last: int, version: str
) -> dict[str, Any]:
    """The report's body: a row per group (its money, exact, and its requests), the total."""
    grouped: dict[tuple[str, ...], list[int]] = {}
    for total in totals:
        values = {**total.row._asdict(), "day": _date(total.row.day)}
        key = tuple(str(values[g]) for g in groups)
        sums = grouped.setdefault(key, [0, 0])
        sums[0] += total.nanos
        sums[1] += total.requests
    rows = [
        {**dict(zip(groups, key, strict=True)), "usd": nanos_to_usd(n), "nanos": n, "requests": r}
        for key, (n, r) in sorted(grouped.items())
    ]
    nanos = sum(t.nanos for t in totals)
    return {
        "from": _date(first),
        "to": _date(last),
        "group_by": groups,
        "rows": rows,
        "total": {
            "usd": nanos_to_usd(nanos),
            "nanos": nanos,
            "requests": sum(t.requests for t in totals),
        },
        "price_table": version,
    }


def receipt_of(record: RequestRecord, version: str, now: float) -> dict[str, Any]:
    """What a request's receipt says (no prompt, no answer, no credential)."""
    verdict = record.verdict
    usage = record.usage if record.usage is not None else verdict.usage if verdict else None
    spend = record.spend
    return {
        "request_id": record.request_id,
        "time": dt.datetime.fromtimestamp(now, dt.UTC).isoformat(timespec="milliseconds"),
        "client": record.client_name,
        "team": record.team,
        "route": record.route,
        "model": record.model,
        "stream": record.stream,
        "status": record.status,
        "verdict": None
        if verdict is None
        else {"outcome": verdict.outcome.value, "reason": verdict.reason.value},
        "schema": schema_fields(record),
        "rejected": record.rejected,
        "cache": record.cache,
        "continued": record.continued,
        "detached": record.detached,
        "transport": record.transport,
        "websocket": record.websocket,
        "attempts": [
            {"upstream": a.upstream, "result": a.result, "model": record.upstream_model}
            if a.upstream == record.upstream
            else {"upstream": a.upstream, "result": a.result}
            for a in record.attempts
        ],
        "usage": usage.as_dict() if usage is not None else None,
        "usage_by_attempt": _by_attempt(record, usage),
        "charged": charged_fields(record),
        "cost": {
            "usd": nanos_to_usd(spend.nanos if spend is not None else 0),
            "nanos": spend.nanos if spend is not None else 0,
            "evidence": spend.evidence.value if spend is not None else None,
            "priced_as": spend.model if spend is not None else None,
            "prices": spend.table or None if spend is not None else None,
            "price_table": version,
            "note": "a cache hit costs nothing" if record.cache == "hit" else None,
        },
        "budgets": None
        if record.budgets is None
        else [
            {
                "scope": scope,
                "limit": limit,
                "value": nanos_to_usd(value) if money else value,
                "left": nanos_to_usd(max(left, 0)) if money else max(left, 0),
            }
            for scope, limit, value, left, money in record.budgets
        ],
    }


#: What an alias (a WebSocket response's ``resp_`` id) may look like.
_ALIAS = re.compile(r"[A-Za-z0-9._-]{1,128}")


def _alias(name: str, owner: str) -> str:
    """Where an alias is kept: under its owner, so that an id the upstream gave two
    owners' responses (or a request id another client chose) never hides one's receipt.
    (A request id is ``[A-Za-z0-9._-]``: never with an ``@``.)"""
    return f"{name}@{owner}"


def _by_attempt(record: RequestRecord, usage: Usage | None) -> list[dict[str, Any]]:
    """Each attempt that relayed the answer (or part of it): its upstream, model,
    outcome, usage and cost; the receipt's cost is their sum. A rescued answer has one
    per attempt; a request no upstream answered, none."""
    spend = record.spend
    if record.continued and record.parts:
        nanos = record.part_nanos
        return [
            {
                "upstream": part.upstream,
                "model": part.model,
                "outcome": part.outcome,
                "usage": part.usage.as_dict(),
                "evidence": part.evidence
                if index < len(nanos) and nanos[index] is not None
                else "unpriced",
                "cost": _money(nanos[index] if index < len(nanos) else None),
            }
            for index, part in enumerate(record.parts)
        ]
    if record.upstream is None or record.cache == "hit" or (usage is None and spend is None):
        return []
    verdict = record.verdict
    return [
        {
            "upstream": record.upstream,
            "model": record.upstream_model,
            "outcome": str(record.status)
            if verdict is None
            else "complete"
            if verdict.complete
            else str(verdict.reason),
            "usage": usage.as_dict() if usage is not None else None,
            "evidence": spend.evidence.value if spend is not None else None,
            "cost": _money(spend.nanos if spend is not None else None),
        }
    ]


def _money(nanos: int | None) -> dict[str, Any]:
    return {"usd": nanos_to_usd(nanos or 0), "nanos": nanos or 0}


def _has_key(exchange: Exchange) -> bool:
    from gateway.proxy.admission import presented_key

    return bool(presented_key(exchange.scope["headers"]))


def _day(text: str | None, default: int) -> int:
    if not text:
        return default
    return (dt.date.fromisoformat(text) - dt.date(1970, 1, 1)).days


def _date(day: int) -> str:
    return (dt.date(1970, 1, 1) + dt.timedelta(days=day)).isoformat()


async def _json(exchange: Exchange, status: int, body: dict[str, Any]) -> None:
    record = exchange.record
    data = json.dumps(body, separators=(",", ":")).encode()
    record.status = status
    record.bytes_out += len(data)
    await exchange.send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(data)),
                (b"x-request-id", record.request_id.encode()),
            ],
        }
    )
    await exchange.send({"type": "http.response.body", "body": data, "more_body": False})


async def _error(exchange: Exchange, status: int, message: str) -> None:
    record = exchange.record
    record.status = status
    type_ = {404: "not_found_error", 403: "permission_error", 400: "invalid_request_error"}.get(
        status, "service_unavailable"
    )
    record.bytes_out += await send_error(
        exchange.send, exchange.spec.name, status, message, type_, type_, record.request_id
    )


async def status_rows(ledger: Ledger, now: float) -> list[tuple[str, str, str, str]]:
    """Each client's spend today and this month (UTC), with its team, for ``/status``;
    the teams' sums too (client ``team:<name>``). Empty when the ledger does not answer."""
    today = int(now) // 86400
    month_start = _day(_date(today)[:8] + "01", today)
    try:
        totals = await ledger.totals(month_start, today)
    except Exception:
        return []
    sums: dict[tuple[str, str], list[int]] = {}
    for total in totals:
        row = total.row
        for key in ((row.client, row.team), (f"team:{row.team}", row.team)):
            if key[0] == "team:none":
                continue
            found = sums.setdefault(key, [0, 0])
            found[1] += total.nanos
            if row.day == today:
                found[0] += total.nanos
    return [
        (client, team, nanos_to_usd(day), nanos_to_usd(month))
        for (client, team), (day, month) in sorted(sums.items())
    ]
