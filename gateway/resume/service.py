"""Resumable streams: who may resume what, and the endpoints that serve a resume.

``Resumes`` is the relay's one contact with this feature:

- ``record(exchange, guard)``: a guarded stream of a route with ``resume = true``
  gets a log in the store and a ``StreamLog`` (``gateway.resume.recorder``); none
  when the request opts out (``X-Gateway-Resume: off``) or the store is full or
  failing (then the response says ``X-Gateway-Resume: off; reason=...``);
- ``serve(exchange)``: answers the requests that are this feature's own, under the
  route's prefix: ``GET gateway/streams/{id}`` (the resume), ``POST
  gateway/streams/{id}/cancel``, and a Responses retrieve with ``stream=true``
  (its spec's ``Retrieval``) for a response the store holds.

A stream belongs to the named client that made it, or without one to a digest of
the credential it presented, and is read only under the route that made it;
anyone else, and any other route, is told 404, as for an id that never was, at
the same cost (one look at the store: the log is written before its id is
handed out, so nothing is waited for). An id carries the second it was made, so
an id whose log can only have expired gets 410 without the store keeping
anything about it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from starlette.types import Message

from gateway.guard import StreamGuard
from gateway.observe import Metrics, RequestRecord
from gateway.policy.routing import Route
from gateway.protocols import ANY_PATH, RETRIEVABLE
from gateway.protocols.retrieval import Retrieval
from gateway.proxy.connection import abort_connection
from gateway.proxy.continuation import Rescuer
from gateway.proxy.errors import send_error
from gateway.proxy.exchange import AbortConnection, Exchange
from gateway.proxy.headers import STREAM_HEADERS, RawHeaders, get_header
from gateway.proxy.limited import with_headers
from gateway.proxy.owner import owner_of
from gateway.proxy.stages import Stage
from gateway.proxy.upstream import Upstream
from gateway.resume.ids import STREAM_ID, made_at, new_id
from gateway.resume.recorder import STREAM_ID_HEADER, StreamLog
from gateway.resume.takeover import continuation_meta, end_orphan
from gateway.settings import ANONYMOUS, Settings
from gateway.store import (
    BeyondEnd,
    End,
    Gone,
    StoreError,
    StreamInfo,
    StreamStore,
    Vanished,
    follow,
)
from gateway.streamlog import LogReader, send_within
from gateway.streamlog.head import HEAD_EVENTS

__all__ = ["Resumes", "build_resumes"]

log = logging.getLogger("gateway")

_STREAMS = "/gateway/streams/"
_CURSOR = re.compile(r"[0-9]{1,18}")
_SEQUENCE = re.compile(r"-?[0-9]{1,18}")
#: The protocols' own retrieves (the Responses API's), and the paths they start with.
_RETRIEVALS: tuple[Retrieval, ...] = tuple(
    spec.retrieval for spec in RETRIEVABLE if spec.retrieval is not None
)
_RETRIEVE_PATHS = tuple(retrieval.path for retrieval in _RETRIEVALS)


def _retrieved_as(retrieval: Retrieval, stream_id: str) -> str:
    """The store's name for the stream a retrieve names (``responses:{id}``)."""
    return f"{retrieval.path.strip('/')}:{stream_id}"


_OPT_OUT = b"x-gateway-resume"
#: How long a resume waits for a live stream's log to hold the events of its cursor.
_CATCH_UP_SECONDS = 1.0
#: How long a cancel waits for the stream's end before it answers anyway.
_CANCEL_WAIT_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class _Ask:
    """A resume request: the stream, the cursor, whether events carry ``id:`` lines."""

    stream_id: str
    after: int
    ids: bool


class BadCursor(Exception):
    pass


@dataclass(eq=False)
class Resumes:
    settings: Settings
    store: StreamStore
    metrics: Metrics
    #: The upstream client a takeover continues a stream with.
    upstream: Upstream | None = None
    #: The stage a takeover's continuation goes through as its client's request (the
    #: named clients' limits: reserved, then charged what it added); None: no client.
    charge: Stage | None = None
    lease: float = field(init=False)
    #: How long a reader waits for news before it looks at the writer's lease.
    wait: float = field(init=False)

    def __post_init__(self) -> None:
        self.lease = self.settings.stream_lease_seconds
        self.wait = min(1.0, self.lease)

    # -- recording ---------------------------------------------------------------------

    async def record(
        self,
        exchange: Exchange,
        guard: StreamGuard,
        rescuer: Rescuer | None = None,
    ) -> StreamLog | None:
        """A log and its recorder for this stream, or None (served without resume)."""
        value = get_header(exchange.scope["headers"], _OPT_OUT)
        if value is not None and value.strip().lower() == b"off":
            return None
        config = exchange.route.config
        record = exchange.record
        meta = {
            "path": exchange.scope["path"][len(config.prefix) :],
            "request_id": record.request_id,
            "route": config.name,
            "head": "1",  # its event 1 is the response head (``gateway.streamlog``)
        }
        if rescuer is not None:  # a takeover may continue it: what that needs
            endpoint = exchange.route.endpoints[rescuer.index]
            meta |= continuation_meta(rescuer.body, rescuer.headers, endpoint.name, exchange.scope)
            if exchange.withhold_usage:  # the gateway asked for usage: not the client's
                meta["withhold_usage"] = "1"
            caller = exchange.caller
            if caller.name != ANONYMOUS:  # whom a takeover's continuation is charged to
                meta["client"] = caller.name
                if caller.team is not None:
                    meta["team"] = caller.team
        try:
            writer = await self.store.open(
                owner_of(exchange),
                meta,
                max_bytes=config.resume_max_bytes,
                ttl=config.resume_ttl_seconds,
                lease=self.lease,
                stream_id=new_id(),
            )
        except StoreError:
            writer, reason = None, "store_error"
        else:
            reason = "store_full"
        self.metrics.store_bytes(self.store.size)
        if writer is None:
            self.metrics.resume_refused(config.name, reason)
            header = b"off; reason=" + reason.encode()
            exchange.send = with_headers(exchange.send, [(_OPT_OUT, header)])
            return None
        stream_log = StreamLog(
            exchange,
            writer,
            guard,
            self.metrics,
            lambda: self.store.size,
            annotate=self.settings.annotate,
        )
        retrieval = exchange.spec.retrieval
        if retrieval is not None:
            stream_log.watch_response_id(functools.partial(self._name_response, retrieval))
        return stream_log

    def _name_response(
        self, retrieval: Retrieval, response_id: str, stream_id: str, ttl: float
    ) -> None:
        task = asyncio.get_running_loop().create_task(
            self.store.claim(_retrieved_as(retrieval, response_id), stream_id, ttl)
        )
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    # -- the endpoints -----------------------------------------------------------------

    @staticmethod
    def owns(exchange: Exchange) -> bool:
        """Whether this request may be one of the feature's own (``serve``): a cheap
        look at its path, so that every other request skips ``serve``."""
        path = exchange.scope["path"]
        return _STREAMS in path or any(p in path for p in _RETRIEVE_PATHS)

    async def serve(self, exchange: Exchange) -> bool:
        """Answer this request if it is one of the feature's own; False: it is not."""
        route = exchange.route
        rest = exchange.scope["path"][len(route.config.prefix) :]
        method = exchange.scope["method"]
        if rest.startswith(_STREAMS):
            tail = rest[len(_STREAMS) :]
            if method == "GET" and "/" not in tail:
                await self._stopping(exchange, self._resume(exchange, tail))
            elif method == "POST" and tail.endswith("/cancel") and tail.count("/") == 1:
                await self._stopping(exchange, self._cancel(exchange, tail[: -len("/cancel")]))
            elif "/" not in tail or tail.endswith("/cancel"):
                await self.error(exchange, 405, "Method not allowed here.", "method_not_allowed")
            else:
                await self.error(exchange, 404, "No such stream.", "stream_not_found")
            return True  # the gateway's own paths: never sent upstream
        for retrieval in _RETRIEVALS:
            if method == "GET" and rest.startswith(retrieval.path):
                answered = False

                async def work(retrieval: Retrieval = retrieval) -> None:
                    nonlocal answered
                    answered = await self._retrieve(
                        exchange, retrieval, rest[len(retrieval.path) :]
                    )

                await self._stopping(exchange, work())
                return answered or exchange.record.status != 0
        return False

    async def _stopping(self, exchange: Exchange, work: object) -> None:
        """Run ``work``; a client that leaves stops it (nothing more to send)."""
        assert asyncio.iscoroutine(work)
        try:
            await work
        except asyncio.CancelledError:
            if not exchange.claim_stop():
                raise
            if exchange.record.status == 0:
                exchange.record.status = 499

    def _ask(self, exchange: Exchange, stream_id: str, info: StreamInfo) -> _Ask:
        query = parse_qs(
            exchange.scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True
        )
        last = get_header(exchange.scope["headers"], b"last-event-id")
        ids = query.get("ids", [""])[0] in ("1", "true") or last is not None
        # Last-Event-ID first: an EventSource reconnects to the URL it was given
        # (starting_after included) and says in this header how far it got.
        raw = query.get("starting_after", ["0"])[0]
        if last is not None:
            raw = last.decode("latin-1").strip()
        if not _CURSOR.fullmatch(raw):
            raise BadCursor
        return _Ask(stream_id, int(raw), ids)

    async def find(self, exchange: Exchange, stream_id: str) -> StreamInfo | str:
        """The stream's info, or the result label of the refusal that was sent."""
        route = exchange.route
        info = None
        if STREAM_ID.fullmatch(stream_id):
            try:
                info = await self.store.info(stream_id)
            except StoreError:
                await self.error(exchange, 503, "The stream store is unavailable.", "store_error")
                return "store_error"
        if info is not None and _belongs(info, exchange):
            return _body(info)
        if (
            info is None
            and STREAM_ID.fullmatch(stream_id)
            and time.time() > made_at(stream_id) + route.config.resume_ttl_seconds
        ):
            await self.error(exchange, 410, "The stream has expired.", "stream_expired")
            return "expired"
        await self.error(exchange, 404, "No such stream.", "stream_not_found")
        return "not_found"

    async def _resume(self, exchange: Exchange, stream_id: str) -> None:
        route = exchange.route.name
        found = await self.find(exchange, stream_id)
        if isinstance(found, str):
            self.metrics.resumed(route, found)
            return
        try:
            ask = self._ask(exchange, stream_id, found)
            if found.stopped and found.end is None and ask.after >= found.kept:
                # A live log that stopped at its cap: Redis's count of its events
                # lags (written with kept events only), so past the kept part is gone.
                raise Gone
            if ask.after > found.total:
                found = await self._caught_up(stream_id, found, ask.after)
            if found.stopped and ask.after >= found.kept:
                raise Gone
            if ask.after > found.total and found.end is not None:
                ending = self._ending(exchange, found, found.end)
                if ask.after <= found.total + len(ending):
                    # The client holds some of the ending (the error event, the trailer
                    # comment): it gets the rest of it, maybe nothing.
                    reader = _Resumed(self, exchange, found, ask)
                    await reader.send_head(await self._head(stream_id))
                    await reader.body(b"".join(ending[ask.after - found.total :]), more=False)
                    reader.judged(found.end)
                    self.metrics.resumed(route, "ok")
                    return
                if found.end.fields.get("heir") != "1":
                    raise BadCursor
            # Past the log's events: only where its writer could not log what its client
            # got (Redis away) and died, or is catching up. The client gets what follows
            # its cursor, and the end.
        except BadCursor:
            self.metrics.resumed(route, "bad_cursor")
            await self.error(exchange, 400, "The cursor is not a count of events the "
                              "stream has.", "bad_cursor")  # fmt: skip
            return
        except Gone:
            self.metrics.resumed(route, "expired")
            await self.error(exchange, 410, "That part of the stream is no longer kept.",
                              "stream_expired")  # fmt: skip
            return
        result = await self.replay(exchange, found, ask)
        self.metrics.resumed(route, result)

    async def _retrieve(self, exchange: Exchange, retrieval: Retrieval, rest: str) -> bool:
        """A protocol's retrieve (the Responses API's, with ``stream=true``) of a stream the
        store holds for this caller, answered from the log; False: not ours (it goes
        upstream)."""
        response_id = rest.rstrip("/")
        query = parse_qs(
            exchange.scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True
        )
        if "/" in response_id or not retrieval.wants_stream(query):
            return False
        try:
            stream_id = await self.store.resolve(_retrieved_as(retrieval, response_id))
            info = await self.store.info(stream_id) if stream_id is not None else None
        except StoreError:
            return False
        if stream_id is None or info is None or not _belongs(info, exchange):
            return False
        route = exchange.route.name
        raw = query.get(retrieval.cursor, [str(retrieval.start)])[0]
        if not _SEQUENCE.fullmatch(raw):
            self.metrics.resumed(route, "bad_cursor")
            await self.error(exchange, 400, f"{retrieval.cursor} is not a sequence number.",
                             "bad_cursor")  # fmt: skip
            return True
        keep = retrieval.after(int(raw))
        result = await self.replay(exchange, info, _Ask(stream_id, 0, False), keep)
        self.metrics.resumed(route, result)
        return True

    async def _caught_up(self, stream_id: str, info: StreamInfo, after: int) -> StreamInfo:
        """A live stream's info once its log holds ``after`` events, or as it stands
        after a short wait: a writer on another replica writes in batches, so a client
        may resume there a moment before the events it got are in the store."""
        deadline = asyncio.get_running_loop().time() + _CATCH_UP_SECONDS
        while info.end is None and info.leased and info.total < after:
            if asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(0.02)
            try:
                newer = await self.store.info(stream_id)
            except StoreError:
                break
            if newer is None:
                break
            info = _body(newer)
        return info

    async def replay(
        self,
        exchange: Exchange,
        info: StreamInfo,
        ask: _Ask,
        keep: Callable[[bytes], bool] | None = None,
    ) -> str:
        """Send the events after the cursor (those ``keep`` keeps), the live tail, then
        the end; the result."""
        reader = _Resumed(self, exchange, info, ask, keep)
        try:
            await reader.read()
            return reader.result
        except (Vanished, StoreError) as exc:
            # The log vanished or the store is away under the reader: its writer is
            # lost to it. It ends as a lost owner's stream does, never with a reset.
            if not reader.started:
                await reader.send_head(None)
            spec = exchange.route.spec_for(info.meta.get("path", ""))
            await reader.lost(spec, self.settings.annotate)
            return "expired" if isinstance(exc, Vanished) else "store_error"
        except (Gone, BeyondEnd):
            # The log stopped at its byte cap under the reader: cut.
            abort_connection(exchange.scope)
            raise AbortConnection from None

    def _ending(self, exchange: Exchange, info: StreamInfo, end: End) -> list[bytes]:
        """The ending as a client counts it: its whole events (where the framing's
        decoder says each ends), and a last line (the trailer comment) as one more."""
        framing = exchange.route.spec_for(info.meta.get("path", "")).framing
        decoder = framing.new_decoder(len(end.trailer) + 1, len(end.trailer) + 1)
        pieces, start = [], 0
        for event in decoder.feed(end.trailer):
            pieces.append(end.trailer[start : event.end])
            start = event.end
        return [*pieces, end.trailer[start:]] if end.trailer[start:] else pieces

    async def orphaned(
        self, route: Route, stream_id: str, payer: RequestRecord | None = None
    ) -> str | None:
        """Take over a stream whose writer is gone (lease run out, no end) and write its
        end (``gateway.resume.takeover``); the result (``continued``, ``owner_lost``)
        when this call ended it, else None. ``payer``: the record of the request that
        takes it over, which carries a continuation's charge (its receipt, the spend
        report and the metrics say it)."""
        info = await self.store.info(stream_id)
        if info is None or info.leased or info.end is not None:
            return None
        writer = await self.store.adopt(stream_id, lease=self.lease)
        if writer is None:
            return None
        return await end_orphan(
            self.store,
            stream_id,
            info,
            writer,
            route,
            annotate=self.settings.annotate,
            upstream=self.upstream,
            metrics=self.metrics,
            limits=self.settings.limits,
            charge=self.charge,
            payer=payer,
        )

    async def _cancel(self, exchange: Exchange, stream_id: str) -> None:
        found = await self.find(exchange, stream_id)
        if isinstance(found, str):
            return
        end = found.end
        if end is None:
            await self.store.cancel(stream_id)
            end = await self._wait_end(exchange.route, stream_id, found.total)
        fields: Mapping[str, str] = end.fields if end is not None else {}
        body = b'{"id":"%s","status":"%s","outcome":"%s","reason":"%s"}' % (
            stream_id.encode(),
            b"ended" if end is not None else b"cancelling",
            fields.get("outcome", "incomplete").encode(),
            fields.get("reason", "cancelled").encode(),
        )
        await exchange.send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"),
            (b"x-request-id", exchange.record.request_id.encode()),
        ]})  # fmt: skip
        message: Message = {"type": "http.response.body", "body": body, "more_body": False}
        await send_within(exchange, message)
        exchange.record.bytes_out += len(body)
        exchange.record.status = 200

    async def _wait_end(self, route: Route, stream_id: str, after: int) -> End | None:
        """The stream's end once its writer (or an heir) wrote it, within a bound."""
        try:
            async with asyncio.timeout(_CANCEL_WAIT_SECONDS):
                async for batch in follow(self.store, stream_id, after, wait=self.wait):
                    if batch.end is not None:
                        return batch.end
                    if not batch.events:
                        await self.orphaned(route, stream_id)
        except (TimeoutError, Gone, BeyondEnd, Vanished, StoreError):
            return None
        return None

    # -- sending -----------------------------------------------------------------------

    async def _head(self, stream_id: str) -> bytes | None:
        """The log's head (event 1), or None: not read (the reader sends a default)."""
        try:
            batch = await self.store.read(stream_id, 0)
        except (StoreError, Gone, BeyondEnd):
            return None
        return batch.events[0] if batch is not None and batch.events else None

    async def error(self, exchange: Exchange, status: int, message: str, code: str) -> None:
        record = exchange.record
        record.status = status
        record.bytes_out += await send_error(
            exchange.send,
            exchange.spec.name,
            status,
            message,
            "invalid_request_error" if status < 500 else "service_unavailable",
            code,
            record.request_id,
        )


class _Resumed(LogReader):
    """A resume (or a retrieve) of a stream: a 200 head of the stream's content type,
    the events after the cursor (numbered for an ``EventSource``, or those ``keep``
    keeps), an orphan taken over when its writer is found gone."""

    def __init__(
        self,
        resumes: Resumes,
        exchange: Exchange,
        info: StreamInfo,
        ask: _Ask,
        keep: Callable[[bytes], bool] | None = None,
    ) -> None:
        super().__init__(exchange, resumes.store, ask.stream_id, wait=resumes.wait)
        self.resumes = resumes
        self.keep = keep
        # A cursor past the log's events (see ``_resume``): what the client holds
        # beyond the log is skipped as it arrives, or never sent.
        self.jump = min(ask.after, info.total)
        self.skip = ask.after - self.jump
        framing = exchange.route.spec_for(info.meta.get("path", "")).framing
        #: The events' number so far, where the client asked for ``id:`` lines.
        self.number = ask.after if ask.ids and framing.comments else None
        self.result = "ok"

    def head(self, status: int, headers: RawHeaders) -> tuple[int, RawHeaders]:
        content_type = get_header(headers, b"content-type") or ANY_PATH.framing.media_type.encode()
        return 200, [
            (b"content-type", content_type),
            *STREAM_HEADERS,
            (b"x-request-id", self.exchange.record.request_id.encode()),
            (STREAM_ID_HEADER, self.stream_id.encode()),
        ]

    def render(self, events: list[bytes]) -> bytes:
        if self.keep is not None:
            return b"".join(event for event in events if self.keep(event))
        if self.number is not None:
            first, self.number = self.number, self.number + len(events)
            return b"".join(with_id(event, first + i) for i, event in enumerate(events, 1))
        return b"".join(events)

    async def quiet(self) -> bool:
        exchange = self.exchange
        ended = await self.resumes.orphaned(exchange.route, self.stream_id, exchange.record)
        self.result = ended or self.result
        return True


def _body(info: StreamInfo) -> StreamInfo:
    """The log as a client counts it: its body's events, without the head."""
    return dataclasses.replace(
        info, total=max(info.total - HEAD_EVENTS, 0), kept=max(info.kept - HEAD_EVENTS, 0)
    )


def _belongs(info: StreamInfo, exchange: Exchange) -> bool:
    """Whether this request may read the stream: its owner's, on the route that made it
    (another route has its own error shape, continuation upstream and credentials), and
    written as this version writes a log (a log of a version that kept no head is not
    read: its events would be miscounted)."""
    meta = info.meta
    return (
        info.owner == owner_of(exchange)
        and meta.get("route") == exchange.route.name
        and meta.get("head") == "1"
    )


def build_resumes(
    settings: Settings,
    metrics: Metrics,
    upstream: Upstream | None,
    store: StreamStore | None,
    charge: Stage | None = None,
) -> Resumes | None:
    """The feature, when a route has ``resume = true``; else None (nothing is paid). The
    store is the relay's (shared with the response cache), opened and closed by its owner;
    ``charge`` is the named clients' limits stage a takeover's continuation goes through."""
    if store is None or not any(route.resume for route in settings.effective_routes()):
        return None
    return Resumes(settings, store, metrics, upstream, charge)


def with_id(event: bytes, number: int) -> bytes:
    """``event`` (an SSE block) with an ``id: number`` line first, for a browser
    ``EventSource`` to reconnect with."""
    return b"id: %d\n%s" % (number, event)
