"""The relay: the only place that does network I/O and keeps time.

For one client request, in layers, each with one job (like httpx's
``send`` -> ``_send_handling_auth`` -> ``_send_single_request``):

- ``handle``: the request's life: admission (path, key, body, budget), the
  disconnect watcher, the drain, and the record handed to the observers.
- ``_proxy``: what the request is: its protocol (from the registry), whether
  it asks for a stream (then the concurrency caps apply), usage injection.
- ``_send``: the policy around attempts (today: one attempt on the route's
  upstream); ``gateway.attempt`` is one attempt against one upstream.
- ``_answer``: relaying the upstream's answer, plain or guarded stream
  (``gateway.answers``), or the gateway's own error when there is none.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
from starlette.types import Receive, Scope, Send

from gateway.admission import Admission, ClientGone, Refused
from gateway.answers import relay_plain, relay_stream
from gateway.attempt import AttemptFailure, attempt
from gateway.errors import send_error
from gateway.exchange import AbortConnection, Exchange, bare_verdict
from gateway.guard import Reason, SSEDecoder, StreamGuard
from gateway.headers import (
    FORWARDING_HEADERS,
    Forwarding,
    RawHeaders,
    get_header,
    pick_request_id,
    strip_hop_by_hop,
)
from gateway.lifecycle import Lifecycle
from gateway.observe import Metrics, ModelLabels, Observers, RequestRecord, TraceHook
from gateway.protocols import ContractOptions, CredentialStyle
from gateway.routing import Route
from gateway.settings import Settings
from gateway.upstream import Upstream, close_quietly

__all__ = ["Relay"]

_CREDENTIAL_HEADERS = frozenset({b"authorization", b"x-api-key", b"api-key", b"x-goog-api-key"})
_REQUEST_DROP = (
    frozenset({b"host", b"content-length", b"x-request-id", b"expect"}) | FORWARDING_HEADERS
)
_UPSTREAM_ID_HEADERS = ("x-request-id", "request-id", "openai-request-id")
_FAILURE_MESSAGES = {
    Reason.UPSTREAM_UNAVAILABLE: "The upstream could not be reached.",
    Reason.UPSTREAM_DISCONNECT: "The upstream did not send a valid answer.",
    Reason.FIRST_BYTE_TIMEOUT: "The upstream did not answer in time (first byte).",
    Reason.TOTAL_TIMEOUT: "The upstream did not answer before the total deadline.",
}


class Relay:
    """Proxies requests for the configured routes."""

    def __init__(
        self,
        *,
        settings: Settings,
        upstream: Upstream,
        metrics: Metrics,
        observers: Observers,
        model_labels: ModelLabels,
        lifecycle: Lifecycle,
        tracer: TraceHook | None = None,
    ) -> None:
        self.settings = settings
        self.upstream = upstream
        self.metrics = metrics
        self.observers = observers
        self.model_labels = model_labels
        self.lifecycle = lifecycle
        self.admission = Admission(
            settings.limits, settings.client_key_sha256, settings.effective_routes()
        )
        self.forwarding = Forwarding(settings.trusted_proxies)
        self.tracer = tracer
        # With a trace hook, the client's trace headers give way to the hook's own.
        self._request_drop = _REQUEST_DROP | tracer.fields if tracer else _REQUEST_DROP

    # -- the request's life -------------------------------------------------------------

    async def handle(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.monotonic()
        request_id = pick_request_id(get_header(scope["headers"], b"x-request-id"))
        record = RequestRecord(
            request_id=request_id,
            route=route.name,
            method=scope["method"],
            path=scope["path"],
            started=started,
            client=self.forwarding.client(scope["headers"], _peer(scope)),
        )
        agent = get_header(scope["headers"], b"user-agent")
        if agent is not None:
            record.user_agent = agent.decode("latin-1")
        if self.tracer is not None:
            self.tracer.start(record, scope["headers"])
        task = asyncio.current_task()
        assert task is not None
        exchange = Exchange(task, route, scope, send, record)
        watcher: asyncio.Task[None] | None = None
        held = 0  # request body bytes counted in the admission's buffered budget
        self.lifecycle.register(exchange, lambda: exchange.stop(Reason.GATEWAY_SHUTDOWN))
        try:
            try:
                url, body = await self.admission.admit(
                    route, scope, receive, self.lifecycle.draining
                )
            except Refused as refused:
                await self._refuse(send, record, refused)
                return
            except ClientGone:
                record.status = 499
                return
            except asyncio.CancelledError:
                if not exchange.claim_stop():
                    raise
                await self._stopped_before_response(exchange)
                return
            held = len(body)
            watcher = asyncio.get_running_loop().create_task(
                self._watch_disconnect(receive, exchange)
            )
            await self._proxy(exchange, url, body)
        except AbortConnection:
            # Returning without finishing the response makes uvicorn drop the
            # connection: the client sees a truncated body, not a clean end.
            pass
        finally:
            exchange.response_done = True
            self.admission.release(held)
            if watcher is not None:
                watcher.cancel()
            self.lifecycle.unregister(exchange)
            if record.usage is None and record.verdict is not None:
                record.usage = record.verdict.usage
            record.duration = time.monotonic() - started
            record.model_label = self.model_labels.label(record.model, record.upstream_model)
            self.observers.observe(record)

    async def _watch_disconnect(self, receive: Receive, exchange: Exchange) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                exchange.stop(Reason.CLIENT_DISCONNECT)
                return

    # -- what the request is ------------------------------------------------------------

    async def _proxy(self, exchange: Exchange, url: str, body: bytes) -> None:
        route, scope, record = exchange.route, exchange.scope, exchange.record
        rest = scope["path"][len(route.config.prefix) :]
        spec = exchange.spec = route.spec_for(rest)
        record.protocol = spec.name
        request_json = _parse_request(body, scope["headers"])
        if request_json is not None:
            model = request_json.get("model")
            record.model = model if isinstance(model, str) else None
        record.stream = spec.wants_stream(rest, request_json)
        if (
            record.stream
            and request_json is not None
            and route.config.inject_include_usage
            and spec.ask_for_usage is not None
            and spec.ask_for_usage(request_json)
        ):
            body = json.dumps(request_json, separators=(",", ":")).encode()
            exchange.withhold_usage = True
        if record.stream:
            try:
                self.admission.start_stream(route)
            except Refused as refused:
                await self._refuse(exchange.send, record, refused)
                return
            exchange.counted = True
            self.metrics.stream_started(route.name)
        try:
            await self._send(exchange, url, body)
        finally:
            if exchange.counted:
                self.admission.end_stream(route)
                self.metrics.stream_ended(route.name)

    # -- the policy around attempts -------------------------------------------------------

    async def _send(self, exchange: Exchange, url: str, body: bytes) -> None:
        route, scope, record = exchange.route, exchange.scope, exchange.record
        timeouts = route.timeouts
        exchange.total_deadline = asyncio.get_running_loop().time() + timeouts.total
        record.upstream = route.name  # a route's one upstream is named after it
        request = self.upstream.request(
            scope["method"], url, self._upstream_headers(route, scope, record), body
        )
        record.bytes_in = len(body)
        response: httpx.Response | None = None
        try:
            result = await attempt(
                self.upstream, request, timeouts.first_byte, exchange.total_deadline
            )
            if isinstance(result, AttemptFailure):
                await self._fail_before_response(exchange, result)
                return
            response = result
            await self._answer(exchange, response)
        except asyncio.CancelledError:
            if not exchange.claim_stop():
                raise
            # stopped by a client disconnect or by the drain before any response byte
            await self._stopped_before_response(exchange)
        finally:
            if response is not None:
                await close_quietly(response)

    def _upstream_headers(self, route: Route, scope: Scope, record: RequestRecord) -> RawHeaders:
        headers = strip_hop_by_hop(scope["headers"], self._request_drop)
        if route.credential is not None:
            headers = [(k, v) for k, v in headers if k not in _CREDENTIAL_HEADERS]
            secret = route.credential.get_secret_value().encode()
            style = route.credential_style
            if style is CredentialStyle.X_API_KEY:
                headers.append((b"x-api-key", secret))
            elif style is CredentialStyle.X_GOOG_API_KEY:
                headers.append((b"x-goog-api-key", secret))
            else:
                headers.append((b"authorization", b"Bearer " + secret))
        if record.stream:
            headers = [(k, v) for k, v in headers if k != b"accept-encoding"]
            headers.append((b"accept-encoding", b"identity"))
        headers += self.forwarding.headers(
            scope["headers"], _peer(scope), scope.get("scheme", "http")
        )
        headers.append((b"x-request-id", record.request_id.encode()))
        headers.extend(record.trace_headers)  # the trace hook's (none without one)
        return headers

    # -- the answer -----------------------------------------------------------------------

    async def _answer(self, exchange: Exchange, response: httpx.Response) -> None:
        record = exchange.record
        upstream_id = None
        for name in _UPSTREAM_ID_HEADERS:
            upstream_id = response.headers.get(name)
            if upstream_id:
                break
        record.upstream_request_id = upstream_id[:200] if upstream_id else None
        draining = self.lifecycle.draining
        is_sse = (
            200 <= response.status_code < 300
            and response.status_code not in (204, 205)
            and response.headers.get("content-type", "").startswith("text/event-stream")
            and exchange.scope["method"] != "HEAD"
        )
        if not is_sse:
            if record.stream:
                record.verdict = (
                    bare_verdict(Reason.UPSTREAM_STATUS)
                    if not 200 <= response.status_code < 300
                    else bare_verdict(Reason.INVALID_SHAPE, "not an event stream")
                )
            await relay_plain(exchange, response, draining)
            return
        record.stream = True
        if not exchange.counted:
            # A stream the request did not announce (non-JSON body, GET): count it as
            # one from here on; it is too late to refuse it.
            self.admission.count_stream(exchange.route)
            self.metrics.stream_started(exchange.route.name)
            exchange.counted = True
        limits = self.settings.limits
        options = ContractOptions(
            require_finish_reason=exchange.route.config.require_finish_reason,
            withhold_usage=exchange.withhold_usage,
        )
        guard = StreamGuard(
            exchange.spec.new_contract(options),
            SSEDecoder(limits.max_line_bytes, limits.max_event_bytes),
            max_stream_bytes=limits.max_response_bytes,
        )
        await relay_stream(
            exchange, response, guard, annotate=self.settings.annotate, draining=draining
        )

    # -- errors of our own ----------------------------------------------------------------

    async def _stopped_before_response(self, exchange: Exchange) -> None:
        """The exchange was stopped before any response byte: record it, and tell the
        client why unless it is the one who left."""
        record, reason = exchange.record, exchange.stop_reason
        assert reason is not None
        if record.stream and record.verdict is None:
            record.verdict = bare_verdict(reason)
        if record.status != 0:
            return
        if reason is Reason.CLIENT_DISCONNECT:
            record.status = 499
            return
        message = (
            "The gateway is shutting down; retry on another instance."
            if reason is Reason.GATEWAY_SHUTDOWN
            else "The request was stopped before the upstream answered."
        )
        await self._send_error(
            exchange.send,
            record,
            503,
            message,
            "service_unavailable",
            str(reason),
            [(b"retry-after", b"1"), (b"connection", b"close")],
        )

    async def _refuse(self, send: Send, record: RequestRecord, refused: Refused) -> None:
        """Answer a request refused before any upstream, and count it."""
        record.rejected = refused.label
        self.metrics.reject(refused.label)
        await self._send_error(
            send,
            record,
            refused.status,
            refused.message,
            refused.type_,
            refused.label,
            refused.headers,
        )

    async def _fail_before_response(self, exchange: Exchange, failure: AttemptFailure) -> None:
        record = exchange.record
        if failure.error is not None:
            record.error = failure.error
        if record.stream:
            record.verdict = bare_verdict(failure.reason)
        await self._send_error(
            exchange.send,
            record,
            failure.status,
            _FAILURE_MESSAGES.get(failure.reason, "Upstream failure."),
            "upstream_error",
            str(failure.reason),
        )

    async def _send_error(
        self,
        send: Send,
        record: RequestRecord,
        status: int,
        message: str,
        type_: str,
        code: str,
        extra: RawHeaders | None = None,
    ) -> None:
        record.status = status
        record.bytes_out += await send_error(
            send, status, message, type_, code, record.request_id, extra
        )


def _parse_request(body: bytes, headers: list[tuple[bytes, bytes]]) -> dict[str, Any] | None:
    """The request body as a JSON object, or None (not JSON, or not parseable by us)."""
    if not body or body[:1] not in (b"{", b" ", b"\n", b"\r", b"\t"):
        return None
    ctype = get_header(headers, b"content-type") or b""
    if ctype and b"json" not in ctype:
        return None
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        # Anything the gateway cannot parse is "not JSON": forwarded unchanged.
        return None
    return obj if isinstance(obj, dict) else None


def _peer(scope: Scope) -> str | None:
    client = scope.get("client")
    return client[0] if client else None
