"""The relay: one proxied request's life, from admission to the record.

For one client request, in layers, each with one job (like httpx's
``send`` -> ``_send_handling_auth`` -> ``_send_single_request``):

- ``handle``: the request's life: admission (path, key, body, budget), the
  disconnect watcher, the drain, and the record handed to the observers.
- ``_proxy``: what the request is: its protocol (from the registry), model,
  stream flag and body summary; then the app's stages (``gateway.proxy.stages``:
  resume, the cache, usage, a client's limits, the stream slot, ...) around the
  relay's own last step. The relay names no feature.
- ``_send``: the policy around attempts (``_attempt`` each): which upstream
  of the route's pool (``gateway.policy.pool``), failover to another one while
  nothing has reached the client (``gateway.policy.failover``), passive health;
  ``gateway.proxy.attempt`` is one attempt against one upstream.
- ``_answer``: relaying the upstream's answer, plain or guarded stream
  (``gateway.proxy.answers``), or the gateway's own error when there is none.

Failover: an attempt that fails with a cause in the route's ``retry_on`` is
retried on another upstream of the pool (one this request has not tried,
not ejected, not cooling down) while attempts (``max_attempts``) and the
total deadline remain, and only while nothing of the answer has reached
the client. So that a stream that breaks before its first event can still be
retried, its head is held until that event whenever a retry is possible
(``answers.hold_stream``); on the last possible attempt nothing is held.
When every attempt fails, the client gets the last one's answer or error.

The I/O and the clocks of the layers live in their own modules: one attempt
(``attempt``, ``upstream``) and its account (``tally``), the answer's relay and
deadlines (``answers``, ``deadlines``), a continuation (``continuation``), the
gateway's own errors before an answer (``own_errors``). A stage that follows a
stream registers on the exchange (``Exchange.on_stream``, ``Exchange.events``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import httpx
from starlette.types import Receive, Scope, Send

from gateway.guard import Reason, StreamGuard
from gateway.lifecycle import Lifecycle
from gateway.logsetup import LogGate
from gateway.observe import Metrics, ModelLabels, Observers, RequestRecord, TraceHook
from gateway.policy.errors import RequestError
from gateway.policy.failover import (
    RETRY_ELSEWHERE,
    AttemptFailure,
    Result,
    is_context_length,
    result_of_failure,
    result_of_held,
    result_of_status,
)
from gateway.policy.pool import Health, Lease
from gateway.policy.retry import Retry, next_attempt
from gateway.policy.routing import Endpoint, Route, Target
from gateway.protocols import UPSTREAM_REQUEST_ID_HEADERS
from gateway.protocols.continuation import ContinuationStyle
from gateway.proxy.admission import (
    Admission,
    Caller,
    ClientGone,
    Refused,
    body_weight,
    presented_key,
)
from gateway.proxy.answers import (
    Held,
    hold_plain,
    hold_stream,
    read_refusal,
    relay_plain,
    relay_stream,
)
from gateway.proxy.attempt import attempt
from gateway.proxy.connection import peer_of, watch_connection
from gateway.proxy.continuation import Rescuer
from gateway.proxy.exchange import AbortConnection, Exchange, bare_verdict
from gateway.proxy.headers import (
    REQUEST_DROP,
    Forwarding,
    RawHeaders,
    get_header,
    request_id_of,
    strip_hop_by_hop,
    with_credential,
    without_key,
)
from gateway.proxy.own_errors import client_left, fail_before_response, stopped_before_response
from gateway.proxy.partial import PartialEvents
from gateway.proxy.refusal import send_refusal
from gateway.proxy.request_body import BodyParser
from gateway.proxy.rewrite import Rewriter
from gateway.proxy.stages import Next, Stage, chain
from gateway.proxy.stream_guard import stream_guard
from gateway.proxy.tally import Tally, attempt_done, cool_down, may_hold, settle
from gateway.proxy.upstream import Upstream, close_quietly
from gateway.settings import Settings

__all__ = ["Relay", "arrived"]

log = logging.getLogger("gateway")

#: A held plain answer that broke before its first byte, with no retry left: the
#: client has nothing of it yet, so it gets the gateway's own error.
_HELD_PLAIN_FAILURES = {
    Reason.FIRST_BYTE_TIMEOUT: AttemptFailure(None, 504, Reason.FIRST_BYTE_TIMEOUT),
    Reason.TOTAL_TIMEOUT: AttemptFailure(None, 504, Reason.TOTAL_TIMEOUT),
}
_HELD_PLAIN_BROKEN = AttemptFailure(
    RequestError.UPSTREAM_DISCONNECT, 502, Reason.UPSTREAM_DISCONNECT
)


def arrived(route: Route, scope: Scope, forwarding: Forwarding, method: str) -> RequestRecord:
    """The record of a request (or a WebSocket connection) as it arrives: its start, id,
    route, method, path, client and user agent."""
    started = time.monotonic()
    record = RequestRecord(
        request_id=request_id_of(scope),
        route=route.name,
        method=method,
        path=scope["path"],
        started=started,
        client=forwarding.client(scope["headers"], peer_of(scope)),
    )
    agent = get_header(scope["headers"], b"user-agent")
    if agent is not None:
        record.user_agent = agent.decode("latin-1")
    return record


@dataclass(kw_only=True, eq=False)
class Relay:
    """Proxies requests for the configured routes."""

    settings: Settings
    upstream: Upstream
    metrics: Metrics
    observers: Observers
    model_labels: ModelLabels
    lifecycle: Lifecycle
    admission: Admission
    bodies: BodyParser
    forwarding: Forwarding
    #: What all streams may hold of events not yet whole (gateway.proxy.partial).
    partial: PartialEvents
    tracer: TraceHook | None = None
    #: The app's stages around the relay's own way (gateway.proxy.stages), outermost first.
    stages: Sequence[Stage] = ()
    rewriter: Rewriter = field(init=False)
    _request_drop: frozenset[bytes] = field(init=False)
    _forged_log: LogGate = field(init=False, default_factory=LogGate)
    _stages: Next = field(init=False)

    def __post_init__(self) -> None:
        self.rewriter = Rewriter(self.bodies, self.admission)
        # With a trace hook, the client's trace headers give way to the hook's own.
        tracer = self.tracer
        self._request_drop = REQUEST_DROP | tracer.fields if tracer else REQUEST_DROP
        self.stages = tuple(self.stages)
        self._stages = chain(self.stages, self._last)

    # -- the request's life -------------------------------------------------------------

    async def handle(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        record = arrived(route, scope, self.forwarding, scope["method"])
        started = record.started
        if self.tracer is not None:
            self.tracer.start(record, scope["headers"])
        task = asyncio.current_task()
        assert task is not None
        exchange = Exchange(task, route, scope, send, record)
        exchange.partial = self.partial
        # Known from the path before admission: its refusals speak the protocol too.
        exchange.spec = route.spec_for(scope["path"][len(route.config.prefix) :])
        watcher: asyncio.Task[None] | None = None
        unwatch: Callable[[], None] | None = None
        held = 0  # request body bytes counted in the admission's buffered budget
        self.lifecycle.register(exchange, lambda: exchange.stop(Reason.GATEWAY_SHUTDOWN))
        try:
            try:
                target, body, caller = await self.admission.admit(
                    route, scope, receive, self.lifecycle.draining
                )
                exchange.caller = caller
                record.client_name = caller.name
            except Refused as refused:
                await self._refuse(exchange, refused)
                return
            except ClientGone:
                client_left(record, scope)
                return
            except asyncio.CancelledError:
                if not exchange.claim_stop():
                    raise
                await stopped_before_response(exchange)
                return
            held = body_weight(route) * len(body)
            # A lost client connection stops the exchange: told by the edge when the
            # server is ours (no task per request), else by a task on ``receive()``.
            unwatch = watch_connection(scope, exchange.client_gone)
            if unwatch is None:
                watcher = asyncio.get_running_loop().create_task(
                    self._watch_disconnect(receive, exchange)
                )
            # The exchange holds the body from here: a rewritten body replaces it.
            exchange.body = body
            del body
            await self._proxy(exchange, target)
        except AbortConnection:
            # Returning without finishing the response makes uvicorn drop the
            # connection: the client sees a truncated body, not a clean end.
            pass
        finally:
            exchange.response_done = True
            self.admission.release(held + exchange.held_copies)
            if unwatch is not None:
                unwatch()
            if watcher is not None:
                watcher.cancel()
            self.lifecycle.unregister(exchange)
            if record.usage is None and record.verdict is not None:
                record.usage = record.verdict.usage
            record.duration = time.monotonic() - started
            record.model_label = self.model_labels.label(
                record.model, record.upstream_model, configured=_mapped(route, record.model)
            )
            self.observers.observe(record)
            exchange.release(send)

    async def _watch_disconnect(self, receive: Receive, exchange: Exchange) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                exchange.client_gone()
                return

    # -- what the request is ------------------------------------------------------------

    async def _proxy(self, exchange: Exchange, target: Target) -> None:
        """What the request is, then the app's stages around the rest of its way."""
        route, scope, record = exchange.route, exchange.scope, exchange.record
        exchange.target = target
        exchange.rest = rest = scope["path"][len(route.config.prefix) :]
        spec = exchange.spec
        record.protocol = spec.name
        # The body's small top-level members only: the document itself is never kept.
        exchange.request_json = request_json = await self.bodies.summary(exchange.body)
        record.model = spec.request_model(rest, request_json)
        record.stream = spec.wants_stream(rest, request_json)
        await self._stages(exchange)

    async def _last(self, exchange: Exchange) -> None:
        """The relay's own last step, inside every stage: the attempts."""
        target = exchange.target
        assert target is not None
        body, exchange.body = exchange.body, b""
        await self._send(exchange, target, body, exchange.request_json)

    # -- the policy around attempts -------------------------------------------------------

    async def _send(
        self,
        exchange: Exchange,
        target: Target,
        body: bytes,
        request_json: dict[str, Any] | None,
    ) -> None:
        route = exchange.route
        exchange.total_deadline = asyncio.get_running_loop().time() + route.timeouts.total
        headers = self._upstream_headers(exchange.scope, exchange.record, exchange.caller)
        outgoing = _Outgoing(target, headers, body, request_json)
        tried: list[int] = []
        # A request's first pick is never empty (panic routing).
        first = route.pool.pick(model=exchange.record.model)
        assert first is not None
        retry: Retry | None = Retry(first)
        try:
            while retry is not None:
                if retry.wait > 0:
                    await self._wait(exchange, retry)
                tried.append(retry.lease.index)
                retry = await self._attempt(exchange, retry.lease, tried, outgoing)
        except asyncio.CancelledError:
            if not exchange.claim_stop():
                raise
            # stopped by a client disconnect or by the drain before any response byte
            await stopped_before_response(exchange)

    async def _wait(self, exchange: Exchange, retry: Retry) -> None:
        """A retry's backoff or Retry-After, holding its claim on the upstream."""
        try:
            await asyncio.sleep(retry.wait)
        except BaseException:
            exchange.route.pool.done(retry.lease, Health.NEUTRAL)
            raise

    async def _attempt(
        self,
        exchange: Exchange,
        lease: Lease,
        tried: list[int],
        outgoing: _Outgoing,
    ) -> Retry | None:
        """One attempt on the leased upstream, in two layers: get an answer or a failure
        (``_exchange``), then account for it (``_account``). Returns the next
        upstream's lease (and wait) when this one failed before anything reached the client."""
        route = exchange.route
        endpoint = route.endpoints[lease.index]
        exchange.timeouts = endpoint.timeouts
        content = await self.rewriter.for_endpoint(
            exchange, endpoint.models, outgoing.body, outgoing.request_json
        )
        exchange.record.bytes_in += len(content)
        self.metrics.upstream_started(route.name, endpoint.name)
        # uvloop's loop.time() counts whole milliseconds; the position keeps the access
        # log's attempts in the order they started (a continuation's ends first).
        tally = Tally(time.monotonic(), len(exchange.record.attempts), endpoint, lease)
        try:
            return await self._exchange(exchange, endpoint, tried, tally, outgoing, content)
        except asyncio.CancelledError:
            tally.stopped()
            raise
        finally:
            settle(exchange, tally, self.metrics)

    async def _exchange(
        self,
        exchange: Exchange,
        endpoint: Endpoint,
        tried: list[int],
        tally: Tally,
        outgoing: _Outgoing,
        content: bytes,
    ) -> Retry | None:
        """Send the request; relay the answer, or fail, or claim the retry's upstream.
        Its one cleanup: the response is closed, whatever happened."""
        timeouts = endpoint.timeouts
        # Built in the call: no local keeps the request alive while a stream lasts.
        outcome = await attempt(
            self.upstream,
            self.upstream.request(
                exchange.scope["method"],
                endpoint.url_for(outgoing.target),
                _signed_for(exchange, endpoint, outgoing, content),
                content,
                timeouts.connect,
            ),
            timeouts.first_byte,
            exchange.total_deadline,
        )
        if isinstance(outcome, AttemptFailure):
            tally.result, tally.reason = result_of_failure(outcome), outcome.reason
            silent = outcome.error is RequestError.CONNECT_TIMEOUT
            retry = self._retry(exchange, tally, tried, silent=silent)
            if retry is None:
                await fail_before_response(exchange, outcome)
            return retry
        retry = None
        try:
            retry = await self._answer_or_retry(exchange, endpoint, tried, tally, outcome, outgoing)
            return retry
        finally:
            try:
                await close_quietly(outcome)
            except BaseException:
                if retry is not None:  # claimed, but this request will not get to use it
                    exchange.route.pool.done(retry.lease, Health.NEUTRAL)
                raise

    async def _answer_or_retry(
        self,
        exchange: Exchange,
        endpoint: Endpoint,
        tried: list[int],
        tally: Tally,
        response: httpx.Response,
        outgoing: _Outgoing,
    ) -> Retry | None:
        """A response head came back: retry it, hold it, or relay it to the client."""
        tally.result = result = result_of_status(response.status_code)
        held: Held | None = None
        if result is Result.STATUS_429 or result is Result.STATUS_5XX:
            wait = cool_down(exchange, tried[-1], response)
            retry = self._retry(exchange, tally, tried, retry_after=wait)
            if retry is not None:
                return retry
        elif response.status_code == 400 and "context_length" in exchange.route.retry_on:
            held = await read_refusal(response)
            if held.failure is None and is_context_length(held.out):
                tally.result = Result.CONTEXT_LENGTH
                retry = self._retry(exchange, tally, tried)
                if retry is not None:
                    return retry
        guard = stream_guard(exchange, response, self.settings.limits)
        gated = guard is not None and exchange.hold_gate is not None  # a stage holds it
        if result is Result.OK and (gated or may_hold(exchange, tried)):
            if guard is not None:
                held = await hold_stream(exchange, response, guard)
            else:
                held = await hold_plain(
                    exchange, response, self.settings.limits.max_buffered_answer_bytes
                )
            if held.failure is not None:
                tally.result, tally.reason = result_of_held(held.failure), held.failure
                retry = self._retry(exchange, tally, tried, broke=held.failure in RETRY_ELSEWHERE)
                if retry is not None:
                    return retry
                if guard is None and not held.whole:  # a whole one: its 502 is relay_plain's
                    failure = _HELD_PLAIN_FAILURES.get(held.failure, _HELD_PLAIN_BROKEN)
                    await fail_before_response(exchange, failure)
                    return None
        if guard is not None and not await self._count_late_stream(exchange):
            return None  # refused: the stream cap is full (the upstream is closed)
        exchange.record.upstream = endpoint.name
        tally.answered = held is None or held.failure is None  # else: its result stands
        rescuer = self._rescuer(exchange, tally, outgoing) if guard is not None else None
        try:
            await self._answer(exchange, response, guard, held, rescuer)
        finally:
            if rescuer is not None:
                await rescuer.aclose()
        if rescuer is not None and rescuer.original is not None:
            # this attempt was cut: the continuation's result is its own attempt's
            tally.answered = False
            tally.result, tally.reason = Result.INCOMPLETE, rescuer.original
        return None

    def _rescuer(self, exchange: Exchange, tally: Tally, outgoing: _Outgoing) -> Rescuer | None:
        """A continuation helper for a route that continues cut streams, else None."""
        if not exchange.route.config.continue_after_cut:
            return None
        route = exchange.route
        protocol = exchange.spec.protocol

        def done(endpoint: Endpoint, lease: Lease, health: Health) -> None:
            attempt_done(route, endpoint, lease, health, self.metrics)

        def cut(reason: Reason) -> None:  # the cut attempt, before any candidate
            tally.answered = False
            tally.result, tally.reason = Result.INCOMPLETE, reason
            settle(exchange, tally, self.metrics)

        def build(
            style: ContinuationStyle, text: str, model: str | None
        ) -> Awaitable[tuple[bytes, str] | None]:
            return self.bodies.continuation(outgoing.body, protocol, style, text, model)

        return Rescuer(
            exchange=exchange,
            upstream=self.upstream,
            metrics=self.metrics,
            index=tally.lease.index,
            target=outgoing.target,
            headers=outgoing.headers,
            request_json=outgoing.request_json,
            build=build,
            body_size=len(outgoing.body),
            new_guard=lambda response: stream_guard(exchange, response, self.settings.limits),
            done=done,
            settle=cut,
            body=outgoing.body,
        )

    def _retry(
        self,
        exchange: Exchange,
        tally: Tally,
        tried: list[int],
        *,
        retry_after: float | None = None,
        silent: bool = False,
        broke: bool = False,
    ) -> Retry | None:
        """The next attempt (claimed, with its wait) when the attempt's result may be
        retried, else None (``gateway.policy.retry``). The failed attempt is accounted
        for first: a retry never goes to an upstream its failure just ejected."""
        route = exchange.route
        settle(exchange, tally, self.metrics)
        return next_attempt(
            route.pool,
            route.retry,
            result=tally.result,
            tried=tried,
            model=exchange.record.model,
            time_left=exchange.total_deadline - asyncio.get_running_loop().time(),
            retry_after=retry_after,
            silent=silent,
            broke=broke,
        )

    def _upstream_headers(self, scope: Scope, record: RequestRecord, caller: Caller) -> RawHeaders:
        """The request's headers for any upstream (each one's credential is added later)."""
        headers = strip_hop_by_hop(scope["headers"], self._request_drop)
        if caller.keyed:
            headers = without_key(headers, presented_key(scope["headers"]))
        if record.stream:
            headers = [(k, v) for k, v in headers if k != b"accept-encoding"]
            headers.append((b"accept-encoding", b"identity"))
        headers += self.forwarding.headers(
            scope["headers"], peer_of(scope), scope.get("scheme", "http")
        )
        headers.append((b"x-request-id", record.request_id.encode()))
        headers.extend(record.trace_headers)  # the trace hook's (none without one)
        return headers

    # -- the answer -----------------------------------------------------------------------

    async def _answer(
        self,
        exchange: Exchange,
        response: httpx.Response,
        guard: StreamGuard | None,
        held: Held | None = None,
        rescuer: Rescuer | None = None,
    ) -> None:
        record = exchange.record
        upstream_id = None
        for name in UPSTREAM_REQUEST_ID_HEADERS:
            upstream_id = response.headers.get(name)
            if upstream_id:
                break
        record.upstream_request_id = upstream_id[:200] if upstream_id else None
        draining = self.lifecycle.draining
        if guard is None:
            if record.stream:
                record.verdict = (
                    bare_verdict(Reason.UPSTREAM_STATUS)
                    if not 200 <= response.status_code < 300
                    else bare_verdict(
                        Reason.INVALID_SHAPE, f"not {exchange.spec.framing.media_type}"
                    )
                )
            await relay_plain(
                exchange,
                response,
                draining,
                held,
                buffer_limit=self.settings.limits.max_buffered_answer_bytes,
            )
            return
        record.stream = True
        closers = []
        for opener in exchange.on_stream:  # the stages that follow a stream (its log)
            content_type = response.headers.get("content-type", "")
            closer = await opener(guard, content_type, rescuer)
            if closer is not None:
                closers.append(closer)
        try:
            await relay_stream(
                exchange,
                response,
                guard,
                annotate=self.settings.annotate,
                draining=draining,
                held=held,
                rescue=rescuer.rescue if rescuer is not None else None,
            )
        finally:
            for close in closers:
                await close()
            if guard.forged_comments:
                self._forged(exchange, guard.forged_comments)

    def _forged(self, exchange: Exchange, count: int) -> None:
        """The upstream sent comment lines posing as the annotation: dropped, counted,
        and logged at most once a minute."""
        route = exchange.route.name
        self.metrics.forged_annotations_dropped(route, count)
        if self._forged_log.open():
            log.warning(
                "route %s: the upstream sent %d comment line(s) that began with the "
                "annotation's prefix; dropped, never relayed (request %s)",
                route,
                count,
                exchange.record.request_id,
            )

    async def _count_late_stream(self, exchange: Exchange) -> bool:
        """An answer that is a stream the request did not announce (a GET, a body that
        is not JSON): counted against the caps now, before its head goes out; False
        when a cap is full (the client got 503, the caller closes the upstream)."""
        if exchange.counted:
            return True
        exchange.record.stream = True
        try:
            self.admission.start_stream(exchange.route)
        except Refused as refused:
            await self._refuse(exchange, refused)
            return False
        self.metrics.stream_started(exchange.route.name)
        exchange.counted = True
        return True

    # -- errors of our own ----------------------------------------------------------------

    async def _refuse(self, exchange: Exchange, refused: Refused) -> None:
        """Answer a request refused before any upstream, and count it."""
        await send_refusal(exchange, refused, self.metrics)


class _Outgoing(NamedTuple):
    """What one request sends upstream, the same for each of its attempts."""

    target: Target
    headers: RawHeaders
    body: bytes  # the client's, as admitted (a continuation parses it again)
    request_json: dict[str, Any] | None


def _mapped(route: Route, model: str | None) -> bool:
    """Whether an upstream of ``route`` maps ``model`` (a configured, bounded name)."""
    return model is not None and any(model in endpoint.models for endpoint in route.endpoints)


def _signed_for(
    exchange: Exchange, endpoint: Endpoint, outgoing: _Outgoing, content: bytes
) -> RawHeaders:
    """The request's headers with ``endpoint``'s credential (a signature, for an upstream
    that signs: over its method, URL and ``content``)."""
    return with_credential(
        outgoing.headers,
        endpoint,
        exchange.spec,
        method=exchange.scope["method"],
        url=endpoint.url_for(outgoing.target),
        body=content,
    )
