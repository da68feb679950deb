"""The response cache: one request's way through it, and what decides an entry.

For a request on a route with ``cache = true`` its stages (``gateway.cache.stage``)
ask, in order:

- ``plan``: the request's key (``gateway.cache.key``; a body over the body
  parser's bound is hashed in its helper process, never on the loop) and its
  controls; a ``DELETE {prefix}/gateway/cache/{key}`` is answered here.
- ``serve`` (after the limits and the stream caps admitted it): an entry that
  may be served (whole, fresh, young enough for ``max-age``) is replayed byte
  for byte with a fresh trailer (a **hit**); an answer being written now by
  an identical request (the **leader**) is followed live from its log, once the
  log is seen growing (a dead leader's log, its lease running on a moment, is
  not: the request leads instead), and ends as the leader's did, whole or not,
  or with the protocol's error event (``owner_lost``) when the leader is lost;
  otherwise this request leads: its name claims the key (one leader per key,
  across workers with Redis) and every byte it sends the client is also
  appended to a new log (``Recorder``).
  A follower marks the log followed; a leader whose client leaves while its
  log is followed reads its answer on to the end, into the log alone
  (``gateway.proxy.detach``, as a resumable stream does), within the route's
  total deadline: its followers get the whole answer and the entry is kept.
- ``settle`` (the request ended): the leader's log gets its end, and the
  entry is kept only when the answer is whole with a reason in
  ``cache_reasons``, 2xx, not continued and within ``cache_max_entry_bytes``;
  a refused one stays readable a short while for its followers, and the next
  identical request learns why (``X-Gateway-Cache: REFUSED; reason=...``).

Store failures never fail a request: it goes upstream uncached.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import Any

from gateway.cache.admin import ADMIN_PATH, delete_entry
from gateway.cache.entry import (
    entry_name,
    followed_name,
    hit_trailer,
    refused_name,
    with_request_id,
)
from gateway.cache.judge import judge, streamed
from gateway.cache.key import Controls, body_digest, controls_of, key_of
from gateway.guard import Outcome, Reason, Usage, Verdict
from gateway.observe import Metrics
from gateway.proxy.detach import Detachment
from gateway.proxy.exchange import AbortConnection, Exchange
from gateway.proxy.headers import RawHeaders, get_header
from gateway.proxy.limited import with_headers
from gateway.proxy.owner import owner_of
from gateway.proxy.request_body import BodyParser
from gateway.settings import ClientConfig
from gateway.store import (
    BeyondEnd,
    End,
    Gone,
    StoreError,
    StreamInfo,
    StreamStore,
    Vanished,
    Writer,
    follow,
)
from gateway.streamlog import LogReader, Recorder

__all__ = ["Plan", "ResponseCache"]

log = logging.getLogger("gateway")

#: Bytes of a log beyond ``cache_max_entry_bytes``: the head event.
_HEAD_ROOM = 64 * 1024
#: A leader's lease on its log by default (the app hands in ``stream_lease_seconds``).
_LEASE_SECONDS = 10.0
#: How long a refused or replaced log stays readable for the requests reading it.
_REFUSED_GRACE_SECONDS = 60.0
#: A follower looks at its leader this often while no event comes.
_FOLLOW_WAIT = 1.0
#: How long a follower waits on a leader whose lease lapsed (a writer cut off from a
#: store that was away takes it back within a second of its return) before it gives up.
_ORPHAN_GRACE_SECONDS = 3 * _FOLLOW_WAIT


@dataclass(slots=True)
class Plan:
    """One request's way through the cache."""

    key: str | None
    controls: Controls
    #: Whose entries these are (a client, a credential's digest, or the route).
    owner: str
    #: The route's ``cache_ttl_seconds``.
    ttl: float = 0.0
    #: The request was answered by the cache's admin path (a DELETE).
    answered: bool = False
    #: The ``X-Gateway-Cache`` value of an answer from upstream.
    header: str = "BYPASS"
    writer: Writer | None = None
    recorder: Recorder | None = None
    #: Why the metric counts a bypass.
    bypass: str = ""
    #: A whole entry found before the limits were asked (``peek``).
    source: _Source | None = None


@dataclass(slots=True)
class _Source:
    """An entry found for a request: a whole one, or a leader's answer in flight."""

    stream_id: str
    info: StreamInfo
    age: int = 0


class _LeaderLost(Exception):
    """The leader's lease stayed lapsed past the grace: its answer ends here."""


class _Replay(LogReader):
    """A whole entry or a leader's answer in flight, as this request gets it: the stored
    head with this request's id, ``X-Gateway-Cache: HIT`` and ``Age``; a fresh trailer."""

    def __init__(self, exchange: Exchange, store: StreamStore, stream_id: str, age: int) -> None:
        super().__init__(exchange, store, stream_id, wait=_FOLLOW_WAIT)
        self.age = age
        self._orphaned_at: float | None = None
        #: The head sent is a stream's (2xx, the framing's media type): a lost leader is
        #: said in-band, with the protocol's error event.
        self.streamed = False

    def head(self, status: int, headers: RawHeaders) -> tuple[int, RawHeaders]:
        content_type = (get_header(headers, b"content-type") or b"").decode("latin-1")
        framing = self.exchange.spec.framing
        self.streamed = 200 <= status < 300 and framing.is_stream(content_type)
        headers = with_request_id(headers, self.exchange.record.request_id)
        return status, [*headers, (b"x-gateway-cache", b"HIT"), (b"age", str(self.age).encode())]

    def render(self, events: list[bytes]) -> bytes:
        self._orphaned_at = None
        return super().render(events)

    async def quiet(self) -> bool:
        """The leader wrote nothing for a while: read on while it lives, or a moment
        after its lease lapsed."""
        try:
            info = await self.store.info(self.stream_id)
        except StoreError:
            if not await self.outage():
                raise
            return True
        if info is not None and (info.end is not None or info.leased):
            return True
        if not self.started:
            return False
        now = time.monotonic()
        self._orphaned_at = self._orphaned_at or now
        if now - self._orphaned_at > _ORPHAN_GRACE_SECONDS:
            raise _LeaderLost
        return True

    async def outage(self) -> bool:
        if not self.started:
            return False
        await self.store.available()
        return True

    def trailer(self, end: End) -> bytes:
        fields = end.fields
        if fields.get("aborted") == "1":
            raise AbortConnection
        trailer, request_id = end.trailer, self.exchange.record.request_id
        if fields.get("stored") == "1":
            if trailer:
                trailer = hit_trailer(fields.get("reason", "stop"), self.age, request_id)
        elif trailer and fields.get("request_id"):
            trailer = trailer.replace(fields["request_id"].encode(), request_id.encode())
        return trailer


@dataclass(eq=False)
class ResponseCache:
    """The routes' response cache over one stream store."""

    store: StreamStore
    metrics: Metrics
    bodies: BodyParser
    clients: InitVar[list[ClientConfig]]
    _: KW_ONLY
    clock: Callable[[], float] = time.time
    #: A leader's lease on its log (``stream_lease_seconds``): how long a leader that
    #: died looks alive (renewed while it lives).
    lease: float = _LEASE_SECONDS
    #: Whether a follower's lost ending carries the trailer comment (``annotate``).
    annotate: bool = True
    _admins: frozenset[str] = field(init=False)
    #: Deletions of refused logs, waiting for their followers; leaders whose client
    #: left, asking whether they are followed.
    _pending: set[asyncio.Task[None]] = field(init=False, default_factory=set)

    def __post_init__(self, clients: list[ClientConfig]) -> None:
        self._admins = frozenset(c.name for c in clients if c.cache_admin)

    async def close(self) -> None:
        """Stop what it has under way (the store is its owner's to close)."""
        for task in list(self._pending):
            task.cancel()

    # -- before the request goes anywhere -----------------------------------------------

    async def plan(
        self, exchange: Exchange, rest: str, request_json: Mapping[str, Any] | None
    ) -> Plan:
        """The request's key and controls; a DELETE of the admin path is answered."""
        route, scope = exchange.route, exchange.scope
        config = route.config
        headers = scope["headers"]
        owner = owner_of(exchange)
        if rest.startswith(ADMIN_PATH) and scope["method"] == "DELETE":
            key = rest[len(ADMIN_PATH) :]
            await delete_entry(self.store, self.metrics, self._admins, exchange, key, owner)
            return Plan(None, Controls(), owner, answered=True)
        controls = controls_of(
            get_header(headers, b"cache-control"), get_header(headers, b"x-gateway-cache")
        )
        if controls.off:
            return Plan(None, controls, owner, bypass="off")
        body = exchange.body
        digest = None if request_json is None else await self.bodies.run(body_digest, body)
        if digest is None:
            return Plan(None, controls, owner, bypass="not_json")
        spec = exchange.spec
        model = request_json.get("model") if request_json is not None else None
        model = model if isinstance(model, str) else exchange.record.model or ""
        pool = []
        for endpoint in route.endpoints:
            mapped = endpoint.models.get(model, endpoint.models.get("*")) if model else None
            pool.append(f"{endpoint.name}={mapped or model}")
        query = scope.get("query_string", b"").decode("latin-1")
        parts = [
            "gateway-cache/1",
            spec.name,
            route.name,
            config.cache_namespace,
            scope["method"],
            rest + ("?" + query if query else ""),
            "stream" if exchange.record.stream else "plain",
            owner if config.cache_scope == "client" else "route",
            "\x00".join(pool),
            model,
            digest,
        ]
        names = spec.answer_headers
        if not exchange.record.stream:  # a plain answer is replayed in its content coding
            names = (*names, b"accept-encoding")
        for name in names:
            value = get_header(headers, name)
            parts.append(name.decode() + "=" + (value or b"").decode("latin-1"))
        return Plan(key_of(parts), controls, owner, ttl=config.cache_ttl_seconds)

    # -- hit, follow, or lead ------------------------------------------------------------

    async def peek(self, plan: Plan) -> bool:
        """Whether a whole entry would answer the request (what is found is kept for
        ``serve``): the limits then count the request and no tokens."""
        if plan.key is None or not plan.controls.reads:
            return False
        try:
            source = await self._find(entry_name(plan.key), plan.controls, plan.ttl)
        except StoreError:
            return False
        plan.source = source  # serve starts from it (no second look-up)
        return source is not None and source.info.end is not None

    async def serve(self, exchange: Exchange, plan: Plan) -> bool:
        """Answer from the cache (True), or make ready to go upstream (False): the
        request then leads (its answer is recorded) or bypasses the cache."""
        route = exchange.route.name
        if plan.key is None:
            self.metrics.cached(route, "bypass", plan.bypass)
            self._record(exchange, plan, None)
            return False
        try:
            return await self._serve(exchange, plan)
        except StoreError:  # the store logs its outages (once each), the metric counts
            self.metrics.cached(route, "bypass", "store_error")
            if plan.writer is not None:
                writer, plan.writer = plan.writer, None
                with contextlib.suppress(Exception):
                    await writer.release()
            plan.header = "BYPASS"
            self._record(exchange, plan, None)
            return False

    async def _serve(self, exchange: Exchange, plan: Plan) -> bool:
        route, config = exchange.route.name, exchange.route.config
        assert plan.key is not None
        name = entry_name(plan.key)
        store = self.store
        controls = plan.controls
        for _ in range(3):
            if controls.reads:
                source = plan.source or await self._find(name, controls, plan.ttl)
                plan.source = None
                if source is not None:
                    whole = source.info.end is not None
                    kind = exchange.record.cache = "hit" if whole else "follow"
                    try:
                        served = await (
                            self._replay(exchange, source)
                            if whole
                            else self._follow(exchange, source)
                        )
                    except AbortConnection:  # begun, then cut: counted all the same
                        self.metrics.cached(route, kind)
                        raise
                    if served:
                        self.metrics.cached(route, kind)
                        return True
                    if not whole and await self._alive(source.stream_id):
                        break  # the leader gave nothing: go upstream alone
                    # (a leader that died before it gave this one anything: lead instead)
            if not controls.stores:
                break
            writer = await store.open(
                plan.owner,
                {"key": plan.key, "route": route, "scope": config.cache_scope},
                max_bytes=config.cache_max_entry_bytes + _HEAD_ROOM,
                ttl=config.cache_ttl_seconds,
                lease=self.lease,
            )
            if writer is None:  # the store's budget is spent
                plan.bypass = "store_full"
                break
            # The log exists before its name points at it (a store may write a new log
            # lazily, with its first events): a follower that finds the name finds the log.
            await writer.flush()
            if await self._claim(name, writer.id, config.cache_ttl_seconds):
                plan.writer = writer
                break
            await writer.release()
            await store.delete(writer.id)
            if not controls.reads:
                break  # an identical request leads already: this one goes alone
        refused = await store.resolve(refused_name(plan.key))
        if plan.writer is not None:
            plan.header = f"REFUSED; reason={refused}" if refused else "MISS"
            self.metrics.cached(route, "refused" if refused else "miss", refused or "")
        else:
            plan.header = "BYPASS"
            self.metrics.cached(route, "bypass", plan.bypass or "not_led")
        self._record(exchange, plan, plan.writer)
        return False

    def _record(self, exchange: Exchange, plan: Plan, writer: Writer | None) -> None:
        exchange.record.cache = plan.header.split(";", 1)[0].lower()
        extra: RawHeaders = [(b"x-gateway-cache", plan.header.encode())]
        if plan.key is not None and writer is not None:
            extra.append((b"x-gateway-cache-key", plan.key.encode()))
        if writer is None:
            exchange.send = with_headers(exchange.send, extra)
            return
        # The leader's client leaving does not stop it at once: see ``_leader_left``.
        detachment = Detachment.of(exchange, self.metrics)
        exchange.detach = lambda: self._leader_left(exchange, writer.id, detachment)
        plan.recorder = Recorder(exchange, writer, extra, detachment)

    def _leader_left(self, exchange: Exchange, stream_id: str, detachment: Detachment) -> None:
        """The leader's client left: its answer is read on when others follow it, else
        the request stops as any whose client left."""
        exchange.detach = _once  # told once: a second notice changes nothing

        async def read_on_if_followed() -> None:
            try:
                followed = await self.store.resolve(followed_name(stream_id)) is not None
            except StoreError:
                followed = False
            if followed and not exchange.response_done:
                # (the total deadline is set once the request goes upstream)
                loop = asyncio.get_running_loop()
                total = exchange.total_deadline
                detachment.start(total or loop.time() + exchange.route.timeouts.total)
            else:
                exchange.stop(Reason.CLIENT_DISCONNECT)

        task = asyncio.get_running_loop().create_task(read_on_if_followed())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _find(self, name: str, controls: Controls, ttl: float) -> _Source | None:
        """The entry or the answer in flight under ``name`` that this request may read."""
        store = self.store
        stream_id = await store.resolve(name)
        if stream_id is None:
            return None
        info = await store.info(stream_id)
        if info is None:
            await self._forget_if(name, stream_id)
            return None
        end = info.end
        if end is None:
            if not info.leased or info.stopped:
                if not info.leased:  # an orphan: its leader died
                    await self._forget_if(name, stream_id)
                return None
            return _Source(stream_id, info)
        if end.fields.get("stored") != "1":
            return None
        age = max(int(self.clock() - float(end.fields.get("at", "0"))), 0)
        if age >= ttl or (controls.max_age is not None and age > controls.max_age):
            return None
        return _Source(stream_id, info, age)

    async def _forget_if(self, name: str, stream_id: str) -> None:
        if await self.store.resolve(name) == stream_id:
            await self.store.forget(name)

    async def _claim(self, name: str, stream_id: str, ttl: float) -> bool:
        """Lead under ``name``; an entry this request would not read (no-cache, too old
        for its max-age, refused) or an orphan is replaced. False: a live leader has it."""
        store = self.store
        other = await store.claim(name, stream_id, ttl)
        if other is None:
            return True
        info = await store.info(other)
        if info is not None and info.end is None and info.leased:
            return False
        await self._forget_if(name, other)
        if info is not None:  # replaced: its bytes go once its readers had time
            self._later_delete(other)
        return await store.claim(name, stream_id, ttl) is None

    # -- answering from a log --------------------------------------------------------------

    async def _replay(self, exchange: Exchange, source: _Source) -> bool:
        """Send a whole entry: its head, its bytes, a fresh trailer."""
        end = source.info.end
        assert end is not None
        if not await self._relay_log(exchange, source, age=source.age):
            return False
        fields = end.fields
        self.metrics.cache_saved(
            exchange.route.name, _int(fields.get("input")) + _int(fields.get("output"))
        )
        return True

    async def _follow(self, exchange: Exchange, source: _Source) -> bool:
        """Send a leader's answer as it is written, and end it as the leader did. The log
        is marked followed: its leader reads on if its own client leaves."""
        await self.store.claim(
            followed_name(source.stream_id),
            exchange.record.request_id,
            exchange.route.timeouts.total + self.lease,
        )
        return await self._relay_log(exchange, source, age=0)

    async def _relay_log(self, exchange: Exchange, source: _Source, *, age: int) -> bool:
        """Send the log (``_Replay``), then its ending; False when nothing was sent (no
        head, or a leader's log that is not being written: the request goes upstream).
        A leader's answer is followed only once its log is seen growing (or ending): a
        leader that died leaves a log whose lease runs on a moment, and a request that
        waits on it is never labelled a hit. A store that goes away under a follower is
        waited for (its leader's writer logs what it relayed meanwhile once the store
        is back), as is a leader whose lease lapsed, a moment
        (``_ORPHAN_GRACE_SECONDS``); then a stream ends with the protocol's error event
        and trailer (``owner_lost``). All of it within the route's total."""
        record = exchange.record
        reader = _Replay(exchange, self.store, source.stream_id, age)
        reader.until = exchange.task.get_loop().time() + exchange.route.timeouts.total
        try:
            if source.info.end is None and not await self._writes_on(source):
                return False
            return await reader.read()
        except (Vanished, StoreError, _LeaderLost):
            # expired, deleted, unreachable, or its leader gone: its answer is lost here
            if not reader.started:
                return False
            await self._lost(reader)
            return True
        except (Gone, BeyondEnd):
            # stopped at its byte bound (an answer longer than cache_max_entry_bytes):
            # nothing more can be read of it
            if not reader.started:
                return False
            raise AbortConnection from None
        except asyncio.CancelledError:
            if not exchange.claim_stop():
                raise
            assert exchange.stop_reason is not None
            if record.stream:  # the client left, or the drain ended it
                record.verdict = Verdict(Outcome.INCOMPLETE, exchange.stop_reason)
            record.status = record.status or 499
            return True

    async def _writes_on(self, source: _Source) -> bool:
        """Whether a leader's log is being written: it grows past the events it had when
        it was found, or ends, before its lease lapses."""
        try:
            async for batch in follow(
                self.store, source.stream_id, source.info.total, wait=_FOLLOW_WAIT
            ):
                if batch.events or batch.end is not None:
                    return True
                if not await self._alive(source.stream_id):
                    return False
        except (Vanished, StoreError, Gone, BeyondEnd):
            return False
        return False

    async def _alive(self, stream_id: str) -> bool:
        info = await self.store.info(stream_id)
        return info is not None and (info.end is not None or info.leased)

    async def _lost(self, reader: _Replay) -> None:
        """A follower whose leader's answer can no longer be read: a stream ends with the
        protocol's error event and trailer (``owner_lost``); any other answer is cut."""
        if not reader.streamed:
            raise AbortConnection
        await reader.lost(reader.exchange.spec, self.annotate)

    # -- the leader's end ------------------------------------------------------------------

    async def settle(self, exchange: Exchange, plan: Plan) -> None:
        """The leader's request ended: end its log; keep the entry or say why not."""
        writer, recorder = plan.writer, plan.recorder
        if writer is None or recorder is None:
            return
        plan.writer = None
        route = exchange.route
        config = route.config
        assert plan.key is not None
        stream = streamed(exchange, recorder)
        trailer = recorder.trailer(stream)
        refusal, reason = judge(exchange, recorder, writer, stream)
        verdict = exchange.record.verdict
        usage = exchange.record.usage or (verdict.usage if verdict is not None else None)
        fields = {
            "stored": "0" if refusal else "1",
            "reason": refusal or reason,
            "at": repr(self.clock()),
            "streamed": "1" if stream else "0",
            "request_id": exchange.record.request_id,
            **_usage_fields(usage),
        }
        if not recorder.ended:
            fields["aborted"] = "1"
        store = self.store
        name, refused = entry_name(plan.key), refused_name(plan.key)
        try:
            await writer.finish(End(trailer, fields))
            if refusal is None:
                await store.forget(refused)
                self.metrics.cached(route.name, "stored", fields["reason"])
                return
            self.metrics.cached(route.name, "refused", refusal)
            await self._forget_if(name, writer.id)
            await store.forget(refused)
            if exchange.record.rejected is None:
                # the upstream's answer is not kept, and says why to the next; a refusal
                # of the gateway's own (a late stream over the cap) is no answer of it
                await store.claim(refused, refusal, config.cache_ttl_seconds)
        except StoreError:
            log.warning("route %s: the stream store failed at an answer's end", route.name)
            return
        self._later_delete(writer.id)

    def _later_delete(self, stream_id: str) -> None:
        """Delete a refused or replaced log once its readers had time to read it."""

        async def delete() -> None:
            await asyncio.sleep(_REFUSED_GRACE_SECONDS)
            with contextlib.suppress(StoreError):
                await self.store.delete(stream_id)

        task = asyncio.get_running_loop().create_task(delete())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    # -- invalidation ----------------------------------------------------------------------


def _once() -> None:
    """A leader's client left already: the question is asked (``_leader_left``)."""


def _usage_fields(usage: Usage | None) -> dict[str, str]:
    if usage is None:
        return {}
    out = {}
    if usage.input_tokens is not None:
        out["input"] = str(usage.input_tokens)
    if usage.output_tokens is not None:
        out["output"] = str(usage.output_tokens)
    return out


def _int(value: str | None) -> int:
    return int(value) if value and value.isdigit() else 0
