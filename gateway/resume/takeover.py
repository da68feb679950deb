"""Taking over an orphan: a stream whose gateway process died before its end.

A resume that finds a stream's lease run out and no end adopts its log
(``StreamStore.adopt``: one heir). The logged events are judged again by the
protocol's contract, then either

- the answer is **continued** (a route with ``continue_after_cut`` whose stream
  was logged with what a continuation needs: the request, its headers without
  credentials, the upstream that served it): the existing continuation
  (``gateway.proxy.continuation.Rescuer``) asks an upstream that can continue
  for the rest of the logged text, and its events go into the log after the
  logged ones, joined as for a live cut; the end says ``continued=N``;
- or the log ends with the protocol's incomplete error event and trailer,
  reason ``owner_lost``.

A continuation is the client's request still: the usage chunk the gateway asked
for on its behalf stays withheld (the log's meta says ``withhold_usage``), and
the named client it belongs to (meta ``client``, ``team``) is charged for what
the continuation adds, through the same stage as any of its requests (``charge``,
the client limits' stage, handed in by the app): reserved first (a client its
limits refuse is not continued: the log ends ``owner_lost``), then settled with
the continuation's reported usage, or its estimate. The original answer's part
is not charged again: the dead owner's reservation holds it.

Every later reader sees the same ending: it is the log's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

import httpx
from starlette.types import Message

from gateway.guard import Reason, StreamGuard, Usage
from gateway.observe import Metrics, RequestRecord
from gateway.policy.pool import Health, Lease
from gateway.policy.routing import Endpoint, PathRejected, Route, request_target
from gateway.protocols import ContractOptions
from gateway.protocols.continuation import ContinuationStyle
from gateway.proxy.admission import Caller
from gateway.proxy.answers import Rescued
from gateway.proxy.continuation import Rescuer
from gateway.proxy.exchange import Exchange
from gateway.proxy.headers import STORED_REQUEST_DROP, RawHeaders
from gateway.proxy.request_body import continuation_body
from gateway.proxy.stages import Stage
from gateway.proxy.stream_guard import stream_guard
from gateway.proxy.upstream import Upstream
from gateway.settings import GatewayLimits
from gateway.store import End, StreamInfo, StreamStore, Writer
from gateway.streamlog.head import HEAD_EVENTS

__all__ = ["MAX_REQUEST_BYTES", "continuation_meta", "end_orphan"]

#: Headers never kept in a log: any credential (the continuation carries the upstream's
#: own), and cookies.
#: The largest request kept in a log's meta for a takeover's continuation.
MAX_REQUEST_BYTES = 256 * 1024


def continuation_meta(
    body: bytes, headers: RawHeaders, upstream: str, scope: Mapping[str, Any]
) -> dict[str, str]:
    """What a takeover needs to continue the stream (none when the request is too large,
    or not UTF-8 text): the admitted request body as it came, its headers without any
    credential, the upstream and the target."""
    if len(body) > MAX_REQUEST_BYTES:
        return {}
    try:
        request = body.decode()
    except UnicodeDecodeError:
        return {}
    kept = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
    return {
        "request": request,
        "headers": json.dumps([kv for kv in kept if kv[0].encode() not in STORED_REQUEST_DROP]),
        "upstream": upstream,
        "method": str(scope["method"]),
        "raw_path": (scope.get("raw_path") or scope["path"].encode()).decode("latin-1"),
        "query": scope.get("query_string", b"").decode("latin-1"),
    }


async def _nowhere(message: Message) -> None:
    """The heir's exchange has no client: its whole events go to the log alone."""


async def _logged_guard(
    store: StreamStore, stream_id: str, info: StreamInfo, route: Route
) -> tuple[StreamGuard, int]:
    """The logged events judged again, as the original guard saw them; the bytes of the
    log's head."""
    contract = route.spec_for(info.meta.get("path", "")).new_contract(
        ContractOptions(
            require_finish_reason=route.config.require_finish_reason,
            end_on_finish=route.config.termination == "finish",
            withhold_usage=info.meta.get("withhold_usage") == "1",
        )
    )
    if route.config.continue_after_cut and hasattr(contract, "keep_text"):
        contract.keep_text = True
    guard = StreamGuard(contract)
    after = head = 0
    while after < info.kept:
        batch = await store.read(stream_id, after)
        if batch is None or not batch.events:
            break
        events = batch.events
        if after < HEAD_EVENTS:  # the head: no event of the body
            head, events = len(events[0]), events[HEAD_EVENTS:]
        guard.feed(b"".join(events))
        after += len(batch.events)
    return guard, head


async def end_orphan(
    store: StreamStore,
    stream_id: str,
    info: StreamInfo,
    writer: Writer,
    route: Route,
    *,
    annotate: bool,
    upstream: Upstream | None,
    metrics: Metrics,
    limits: GatewayLimits,
    charge: Stage | None = None,
    payer: RequestRecord | None = None,
) -> str:
    """Write the adopted log's end: continued, or ``owner_lost``; the resume result.
    ``charge``: the stage a named client's continuation goes through (its limits);
    ``payer``: the record that then carries the continuation's charge."""
    guard, head = await _logged_guard(store, stream_id, info, route)
    writer.max_bytes += head  # the log's bound is its body's, as its recorder kept it
    logged = guard.verdict  # the logged events may hold a whole answer: then it stands
    request_id = info.meta.get("request_id", "-")
    ending = None
    if upstream is not None and "request" in info.meta and logged is None:
        ending = await _continue(
            info, head, writer, route, guard, upstream, metrics, limits, charge, payer
        )
    if ending is not None:
        continued, trailer, verdict_guard = ending
        if annotate:
            trailer += verdict_guard.annotation(request_id, continued)
        result = "continued"
    else:
        verdict_guard = guard
        if logged is None or not logged.complete:
            guard.abort(Reason.OWNER_LOST, force=True)
        trailer = guard.withheld + guard.annotation(request_id) if annotate else b""
        result = "owner_lost"
    verdict = verdict_guard.verdict
    assert verdict is not None
    # ``heir``: the ending is a takeover's, not the owner's (a client may hold events
    # its owner relayed but could not log: ``service`` answers its cursor all the same).
    await writer.finish(End(trailer, {"outcome": str(verdict.outcome),
                                      "reason": str(verdict.reason), "heir": "1"}))  # fmt: skip
    return result


async def _continue(
    info: StreamInfo,
    head: int,
    writer: Writer,
    route: Route,
    guard: StreamGuard,
    upstream: Upstream,
    metrics: Metrics,
    limits: GatewayLimits,
    charge: Stage | None,
    payer: RequestRecord | None,
) -> tuple[int, bytes, StreamGuard] | None:
    """The rest of the logged answer, by the existing continuation; None: not continued
    (the log then ends ``owner_lost``)."""
    meta = info.meta
    try:
        document = json.loads(meta["request"])
        headers: RawHeaders = [
            (k.encode("latin-1"), v.encode("latin-1")) for k, v in json.loads(meta["headers"])
        ]
        path = meta["path"]
        target = request_target(
            route, route.config.prefix + path, meta["raw_path"].encode("latin-1"),
            meta["query"].encode("latin-1"),
        )  # fmt: skip
    except (KeyError, ValueError, PathRejected):
        return None
    index = next((i for i, e in enumerate(route.endpoints) if e.name == meta.get("upstream")), 0)
    task = asyncio.current_task()
    assert task is not None
    spec = route.spec_for(path)
    record = RequestRecord(
        request_id=meta.get("request_id", "-"),
        route=route.name,
        method=meta.get("method", "POST"),
        path=route.config.prefix + path,
        started=time.monotonic(),
    )
    # What its client got before (the body): the continuation's condition.
    record.bytes_out = info.size - head
    record.model = document.get("model") if isinstance(document.get("model"), str) else None
    record.stream = True
    scope = {"type": "http", "method": record.method, "path": record.path, "headers": headers}
    exchange = Exchange(task, route, scope, _nowhere, record)
    exchange.events.add(writer)
    exchange.spec = spec
    exchange.body = meta["request"].encode()  # (a strict budget's cap rewrites it)
    exchange.request_json = document
    client = meta.get("client")
    if client:  # the named client whose request this is: its limits, its charge
        exchange.caller = Caller(client, True, None, meta.get("team") or None)
        record.client_name = client
    # The usage chunk the gateway asked for on the client's behalf stays withheld.
    exchange.withhold_usage = meta.get("withhold_usage") == "1"
    exchange.total_deadline = asyncio.get_running_loop().time() + route.timeouts.total
    # What the continuation asks of the cut: a reason that blames the upstream's side.
    guard.abort(Reason.UPSTREAM_DISCONNECT)

    def done(endpoint: Endpoint, lease: Lease, health: Health) -> None:
        metrics.upstream_ended(route.name, endpoint.name)
        route.pool.done(lease, health)

    def new_guard(response: httpx.Response) -> StreamGuard | None:
        return stream_guard(exchange, response, limits)

    async def build(
        style: ContinuationStyle, text: str, model: str | None
    ) -> tuple[bytes, str] | None:
        # at most MAX_REQUEST_BYTES: built on the loop
        return continuation_body(exchange.body, spec.protocol, style, text, model)

    rescuer = Rescuer(
        exchange=exchange,
        upstream=upstream,
        metrics=metrics,
        index=index,
        target=target,
        headers=headers,
        request_json=document,
        build=build,
        body_size=len(meta["request"]),
        new_guard=new_guard,
        done=done,
    )
    got: list[Rescued] = []

    async def go(exchange: Exchange) -> None:
        rescued = await rescuer.rescue(guard)
        if rescued is not None and rescued.continued:
            _bill(exchange, rescued, rescuer.first_cut, rescuer.body_size)
            got.append(rescued)

    try:
        if charge is not None:
            await charge(exchange, go)  # reserved, then settled (or refused: not continued)
        else:
            await go(exchange)
    finally:
        await rescuer.aclose()
    if payer is not None and record.charge is not None:
        _hand_over(record, payer)
    if not got or got[0].guard.verdict is None:
        return None
    return got[0].continued, exchange.events.pending, got[0].guard


def _bill(exchange: Exchange, rescued: Rescued, first: Usage | None, body_size: int) -> None:
    """The takeover's record says what its continuation added (what the client is
    charged): a whole continuation's reported usage, else its estimate (its input from
    the body, an output token per content event); the original answer's part
    (``first``) is the dead owner's reservation's, never charged again."""
    record = exchange.record
    guard = rescued.guard
    record.verdict = guard.verdict
    if first is not None:
        del record.parts[:1]  # the original answer's part (priced by the owner's account)
    if rescued.usage is not None:  # whole: ``guard`` is the continuation's own
        reported = (guard.verdict.usage if guard.verdict else None) or Usage()
        record.billed = Usage(
            input_tokens=reported.input_tokens
            if reported.input_tokens is not None else max(1, body_size // 4),
            output_tokens=reported.output_tokens
            if reported.output_tokens is not None else guard.contract.content_events,
        )  # fmt: skip
        return
    billed, before = rescued.billed or Usage(), first or Usage()
    record.billed = Usage(
        input_tokens=max((billed.input_tokens or 0) - (before.input_tokens or 0), 0),
        output_tokens=max((billed.output_tokens or 0) - (before.output_tokens or 0), 0),
    )


def _hand_over(takeover: RequestRecord, payer: RequestRecord) -> None:
    """The request that took the stream over carries what its continuation was charged:
    its receipt, the spend report, the access log and the metrics say it."""
    payer.charge = takeover.charge
    payer.spend = takeover.spend
    payer.team = payer.team or takeover.team
    payer.budgets = takeover.budgets
    payer.parts = takeover.parts
    payer.part_nanos = takeover.part_nanos
