"""The relay: the only place that does network I/O and keeps time.

For one client request it checks the path, credentials, admission and body
size, forwards the request to the route's upstream, and relays the answer.
A streamed answer (``text/event-stream``) goes through a ``StreamGuard``:
upstream chunks are pulled only as fast as the client takes them
(backpressure: ``await send`` returns once uvicorn's transport accepted the
bytes), only event-aligned bytes are forwarded, deadlines are enforced, a
client disconnect closes the upstream at once, and the annotation is
appended at the end. Everything else is relayed unchanged.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, NoReturn

import httpx

from gateway.admission import Admission, ClientGone, Refused
from gateway.deadlines import Watchdog
from gateway.errors import send_error
from gateway.guard import (
    ChatContract,
    CompletionsContract,
    Contract,
    FramingOnly,
    Protocol,
    Reason,
    SSEDecoder,
    StreamGuard,
    Verdict,
)
from gateway.guard.usage import usage_for
from gateway.guard.verdict import Outcome
from gateway.headers import (
    FORWARDING_HEADERS,
    Forwarding,
    RawHeaders,
    get_header,
    pick_request_id,
    strip_hop_by_hop,
)
from gateway.lifecycle import Lifecycle
from gateway.observe import Metrics, ModelLabels, Observers, RequestRecord
from gateway.routing import Route
from gateway.settings import Settings
from gateway.upstream import (
    Upstream,
    chunk_reader,
    close_quietly,
    drain_for_reuse,
    send_failure,
)

__all__ = ["Relay"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_CREDENTIAL_HEADERS = frozenset({b"authorization", b"x-api-key", b"api-key"})
_REQUEST_DROP = frozenset({b"host", b"content-length", b"x-request-id"}) | FORWARDING_HEADERS
_RESPONSE_DROP = frozenset({b"x-request-id", b"server", b"date"})
# SSE bodies are forwarded decoded (the guard must read them), so no Content-Encoding.
_STREAM_RESPONSE_DROP = _RESPONSE_DROP | {
    b"content-length",
    b"content-encoding",
    b"cache-control",
    b"x-accel-buffering",
}
_UPSTREAM_ID_HEADERS = (b"x-request-id", b"request-id", b"openai-request-id")
_JSON_SNIFF_LIMIT = 8 * 1024 * 1024  # non-streamed bodies up to this size are read for usage
_DRAIN_SEND_SECONDS = 5.0  # while draining, how long a last send may wait for the client
_SEND_FAILURES = {
    "connect_timeout": (504, Reason.UPSTREAM_UNAVAILABLE),
    "connect_error": (502, Reason.UPSTREAM_UNAVAILABLE),
    "upstream_bad_response": (502, Reason.UPSTREAM_DISCONNECT),
}


@dataclass(slots=True, eq=False)
class _Exchange:
    """One request in flight: what the relay's steps share, and what the
    disconnect watcher, the deadlines and the drain act on (``stop``)."""

    task: asyncio.Task[Any]
    route: Route
    scope: Scope
    send: Send
    record: RequestRecord
    protocol: Protocol = Protocol.SSE
    withhold_usage: bool = False
    total_deadline: float = 0.0
    counted: bool = False  # counted in the active streams (admission, gauge)
    stop_reason: Reason | None = None
    response_done: bool = False

    def stop(self, reason: Reason) -> None:
        if self.stop_reason is None and not self.response_done:
            self.stop_reason = reason
            self.task.cancel()


def _read_answer(protocol: Protocol, body: bytes, record: RequestRecord) -> None:
    """Usage and model of a whole non-streamed 2xx JSON answer, into ``record``.

    An answer that does not parse is recorded as ``invalid_json``: the client
    got it unchanged, but it is not the clean 200 it looks like.
    """
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        record.error = "invalid_json"
        return
    if isinstance(obj, dict):
        record.usage = usage_for(protocol, obj.get("usage"))
        model = obj.get("model")
        if isinstance(model, str):
            record.upstream_model = model


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

    # -- entry point --------------------------------------------------------------

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
        task = asyncio.current_task()
        assert task is not None
        exchange = _Exchange(task, route, scope, send, record)
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
                if exchange.stop_reason is None:
                    raise
                _uncancel()
                await self._stopped_before_response(exchange)
                return
            held = len(body)
            watcher = asyncio.get_running_loop().create_task(
                self._watch_disconnect(receive, exchange)
            )
            await self._proxy(exchange, url, body)
        except _AbortConnection:
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

    async def _watch_disconnect(self, receive: Receive, exchange: _Exchange) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                exchange.stop(Reason.CLIENT_DISCONNECT)
                return

    # -- the exchange -----------------------------------------------------------------

    async def _proxy(self, exchange: _Exchange, url: str, body: bytes) -> None:
        route, scope, send, record = exchange.route, exchange.scope, exchange.send, exchange.record
        protocol = exchange.protocol = route.protocol_for(scope["path"][len(route.config.prefix) :])
        request_json = self._parse_request(body, scope["headers"])
        if request_json is not None:
            model = request_json.get("model")
            record.model = model if isinstance(model, str) else None
            record.stream = request_json.get("stream") is True
        if (
            record.stream
            and request_json is not None
            and route.config.inject_include_usage
            and protocol is Protocol.CHAT
        ):
            options = request_json.get("stream_options")
            if not (isinstance(options, dict) and options.get("include_usage") is True):
                new_options = dict(options) if isinstance(options, dict) else {}
                new_options["include_usage"] = True
                request_json["stream_options"] = new_options
                body = json.dumps(request_json, separators=(",", ":")).encode()
                exchange.withhold_usage = True
        if record.stream:
            try:
                self.admission.start_stream(route)
            except Refused as refused:
                await self._refuse(send, record, refused)
                return
            exchange.counted = True
            self.metrics.stream_started(route.name)
        try:
            await self._forward(exchange, url, body)
        finally:
            if exchange.counted:
                self.admission.end_stream(route)
                self.metrics.stream_ended(route.name)

    @staticmethod
    def _parse_request(body: bytes, headers: list[tuple[bytes, bytes]]) -> dict[str, Any] | None:
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

    def _upstream_headers(
        self, route: Route, scope: Scope, record: RequestRecord
    ) -> list[tuple[bytes, bytes]]:
        headers = strip_hop_by_hop(scope["headers"], _REQUEST_DROP)
        if route.credential is not None:
            headers = [(k, v) for k, v in headers if k not in _CREDENTIAL_HEADERS]
            secret = route.credential.get_secret_value().encode()
            style = route.config.credential_style
            if style == "auto":
                style = (
                    "x-api-key"
                    if route.protocol_for("") is Protocol.MESSAGES
                    or ("anthropic" in route.upstream)
                    else "bearer"
                )
            if style == "x-api-key":
                headers.append((b"x-api-key", secret))
            else:
                headers.append((b"authorization", b"Bearer " + secret))
        if record.stream:
            headers = [(k, v) for k, v in headers if k != b"accept-encoding"]
            headers.append((b"accept-encoding", b"identity"))
        headers += self.forwarding.headers(
            scope["headers"], _peer(scope), scope.get("scheme", "http")
        )
        headers.append((b"x-request-id", record.request_id.encode()))
        return headers

    async def _forward(self, exchange: _Exchange, url: str, body: bytes) -> None:
        route, scope, send, record = exchange.route, exchange.scope, exchange.send, exchange.record
        timeouts = route.timeouts
        loop = asyncio.get_running_loop()
        total_deadline = exchange.total_deadline = loop.time() + timeouts.total
        request = self.upstream.request(
            scope["method"], url, self._upstream_headers(route, scope, record), body
        )
        record.bytes_in = len(body)
        response: httpx.Response | None = None
        try:
            try:
                async with asyncio.timeout_at(
                    min(loop.time() + timeouts.first_byte, total_deadline)
                ):
                    response = await self.upstream.send(request)
            except TimeoutError:
                reason = (
                    Reason.TOTAL_TIMEOUT
                    if loop.time() >= total_deadline
                    else Reason.FIRST_BYTE_TIMEOUT
                )
                await self._fail_before_response(send, record, 504, reason)
                return
            except (httpx.TransportError, OSError) as exc:
                record.error = failure = send_failure(exc)
                # Connected but no valid answer: the HTTP exchange broke, like a body cut
                # mid-way (upstream_disconnect); upstream_unavailable is "could not connect".
                status, reason = _SEND_FAILURES[failure]
                await self._fail_before_response(send, record, status, reason)
                return
            await self._relay_response(exchange, response)
        except asyncio.CancelledError:
            if exchange.stop_reason is None:
                raise
            _uncancel()
            # stopped by a client disconnect or by the drain before any response byte
            await self._stopped_before_response(exchange)
        finally:
            if response is not None:
                await close_quietly(response)

    async def _relay_response(self, exchange: _Exchange, response: httpx.Response) -> None:
        record = exchange.record
        upstream_id = None
        for name in _UPSTREAM_ID_HEADERS:
            upstream_id = response.headers.get(name.decode())
            if upstream_id:
                break
        record.upstream_request_id = upstream_id[:200] if upstream_id else None
        ctype = response.headers.get("content-type", "")
        is_sse = (
            200 <= response.status_code < 300
            and response.status_code not in (204, 205)
            and ctype.startswith("text/event-stream")
            and exchange.scope["method"] != "HEAD"
        )
        if is_sse:
            await self._relay_stream(exchange, response)
            return
        if record.stream:
            if response.status_code >= 300 or response.status_code < 200:
                record.verdict = _bare_verdict(Reason.UPSTREAM_STATUS)
            else:
                record.verdict = _bare_verdict(Reason.INVALID_SHAPE, "not an event stream")
        await self._relay_plain(exchange, response)

    def _response_headers(
        self, response: httpx.Response, record: RequestRecord, drop: frozenset[bytes]
    ) -> RawHeaders:
        headers = strip_hop_by_hop(response.headers.raw, drop)
        headers.append((b"x-request-id", record.request_id.encode()))
        if record.upstream_request_id:
            headers.append((b"x-upstream-request-id", record.upstream_request_id.encode()))
        return headers

    async def _relay_plain(self, exchange: _Exchange, response: httpx.Response) -> None:
        """Relay a non-SSE answer unchanged (status, headers, body)."""
        send, record = exchange.send, exchange.record
        record.status = response.status_code
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": self._response_headers(response, record, _RESPONSE_DROP),
            }
        )
        sniff: list[bytes] | None = (
            []
            if 200 <= response.status_code < 300
            and "json" in response.headers.get("content-type", "")
            and not response.headers.get("content-encoding")
            else None
        )
        sniffed = 0
        loop = asyncio.get_running_loop()
        client_send = exchange.route.timeouts.client_send
        try:
            async with asyncio.timeout_at(exchange.total_deadline):
                async for chunk in response.aiter_raw():
                    if not chunk:
                        continue
                    if record.time_to_first_byte is None:
                        record.time_to_first_byte = time.monotonic() - record.started
                    if sniff is not None:
                        sniffed += len(chunk)
                        if sniffed <= _JSON_SNIFF_LIMIT:
                            sniff.append(chunk)
                        else:
                            sniff = None
                    send_deadline = loop.time() + client_send
                    async with asyncio.timeout_at(send_deadline):
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    record.bytes_out += len(chunk)
        except (TimeoutError, httpx.TransportError, OSError) as exc:
            if isinstance(exc, TimeoutError) and loop.time() >= send_deadline:
                self._drop_stalled_client(exchange)
            # Headers are out: the only honest signal left is to break the connection.
            record.error = (
                "upstream_timeout" if isinstance(exc, TimeoutError) else ("upstream_disconnect")
            )
            raise _AbortConnection from None
        try:
            async with asyncio.timeout(self._last_send_timeout(exchange)):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except TimeoutError:
            self._drop_stalled_client(exchange)
        exchange.response_done = True
        if sniff:
            _read_answer(exchange.protocol, b"".join(sniff), record)

    async def _relay_stream(self, exchange: _Exchange, response: httpx.Response) -> None:
        send, record = exchange.send, exchange.record
        limits = self.settings.limits
        guard = StreamGuard(
            self._contract(exchange.route, exchange.protocol, exchange.withhold_usage),
            SSEDecoder(limits.max_line_bytes, limits.max_event_bytes),
            max_stream_bytes=limits.max_response_bytes,
        )
        record.stream = True
        if not exchange.counted:
            # A stream the request did not announce (non-JSON body, GET): count it as
            # one from here on; it is too late to refuse it.
            self.admission.count_stream(exchange.route)
            self.metrics.stream_started(exchange.route.name)
            exchange.counted = True
        record.status = response.status_code
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": [
                    *self._response_headers(response, record, _STREAM_RESPONSE_DROP),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        loop = asyncio.get_running_loop()
        started = record.started
        last_content: float | None = None
        content_seen = 0
        read = chunk_reader(response)
        # One timer for the first-byte, idle and total deadlines, re-armed only when
        # it fires: cheaper than rescheduling a timeout on every chunk.
        watchdog = Watchdog(loop, exchange.stop, exchange.route.timeouts, exchange.total_deadline)
        try:
            while True:
                chunk = await read()
                if not chunk:
                    guard.eof()
                    if guard.final:
                        watchdog.last = loop.time()
                        watchdog.sending = True
                        await send(
                            {"type": "http.response.body", "body": guard.final, "more_body": True}
                        )
                        watchdog.sending = False
                        record.bytes_out += len(guard.final)
                    break
                if watchdog.got_chunk:
                    watchdog.last = loop.time()
                else:
                    watchdog.first_chunk()
                out = guard.feed(chunk)
                if guard.content_events != content_seen:
                    now = time.monotonic()
                    content_seen = guard.content_events
                    if last_content is None:
                        record.time_to_first_token = now - started
                    else:
                        record.chunk_gaps.append(now - last_content)
                    last_content = now
                if out:
                    if record.time_to_first_byte is None:
                        record.time_to_first_byte = time.monotonic() - started
                    watchdog.sending = True
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                    watchdog.sending = False
                    record.bytes_out += len(out)
                    # Time spent waiting for a slow client is not upstream silence.
                    watchdog.last = loop.time()
                if guard.done:
                    break
        except httpx.DecodingError:
            guard.abort(Reason.INVALID_SHAPE, "the upstream's content encoding is broken")
        except httpx.TransportError:
            guard.abort(Reason.UPSTREAM_DISCONNECT)
        except asyncio.CancelledError:
            if exchange.stop_reason is None:
                raise
            _uncancel()
            # Bytes whose send was interrupted may never have reached the client: a
            # verdict reached on them (even "complete") does not stand.
            guard.abort(exchange.stop_reason, force=watchdog.sending)
        finally:
            watchdog.cancel()
        verdict = guard.verdict
        assert verdict is not None
        record.verdict = verdict
        record.upstream_model = guard.contract.model
        if exchange.stop_reason is Reason.CLIENT_DISCONNECT:
            return
        if exchange.stop_reason is Reason.CLIENT_STALLED:
            self._drop_stalled_client(exchange)
        trailer = guard.annotation(record.request_id) if self.settings.annotate else b""
        if record.time_to_first_byte is None and trailer:
            record.time_to_first_byte = time.monotonic() - started
        exchange.response_done = True
        try:
            # A client that stopped reading must not hold the request (or the drain)
            # past this: drop its connection instead.
            async with asyncio.timeout(self._last_send_timeout(exchange)):
                await send({"type": "http.response.body", "body": trailer, "more_body": False})
        except TimeoutError:
            # What the verdict was reached on may still sit in the send buffer.
            record.verdict = guard.abort(Reason.CLIENT_STALLED, force=True)
            self._drop_stalled_client(exchange)
        record.bytes_out += len(trailer)
        if verdict.complete:
            await drain_for_reuse(read)

    def _last_send_timeout(self, exchange: _Exchange) -> float:
        """How long the last send of a response may wait for the client (less when draining)."""
        seconds = exchange.route.timeouts.client_send
        return min(seconds, _DRAIN_SEND_SECONDS) if self.lifecycle.draining else seconds

    def _drop_stalled_client(self, exchange: _Exchange) -> NoReturn:
        """The client stopped taking bytes: abort its connection (RST), never wait on it."""
        exchange.record.error = "client_stalled"
        abort_connection(exchange.scope)
        raise _AbortConnection

    def _contract(self, route: Route, protocol: Protocol, withhold_usage: bool) -> Contract:
        require = route.config.require_finish_reason
        if protocol is Protocol.CHAT:
            return ChatContract(require_finish_reason=require, withhold_usage=withhold_usage)
        if protocol is Protocol.COMPLETIONS:
            return CompletionsContract(require_finish_reason=require)
        if protocol is Protocol.RESPONSES:
            from gateway.guard.responses import ResponsesContract

            return ResponsesContract()
        if protocol is Protocol.MESSAGES:
            from gateway.guard.messages import MessagesContract

            return MessagesContract()
        return FramingOnly()

    # -- errors of our own -------------------------------------------------------------

    async def _stopped_before_response(self, exchange: _Exchange) -> None:
        """The exchange was stopped before any response byte: record it, and tell the
        client why unless it is the one who left."""
        record, reason = exchange.record, exchange.stop_reason
        assert reason is not None
        if record.stream and record.verdict is None:
            record.verdict = _bare_verdict(reason)
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

    async def _fail_before_response(
        self, send: Send, record: RequestRecord, status: int, reason: Reason
    ) -> None:
        if record.stream:
            record.verdict = _bare_verdict(reason)
        messages = {
            Reason.UPSTREAM_UNAVAILABLE: "The upstream could not be reached.",
            Reason.UPSTREAM_DISCONNECT: "The upstream did not send a valid answer.",
            Reason.FIRST_BYTE_TIMEOUT: "The upstream did not answer in time (first byte).",
            Reason.TOTAL_TIMEOUT: "The upstream did not answer before the total deadline.",
        }
        await self._send_error(
            send,
            record,
            status,
            messages.get(reason, "Upstream failure."),
            "upstream_error",
            str(reason),
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


def abort_connection(scope: Scope) -> bool:
    """Abort the client's TCP connection (RST) through the edge's hook, if it has one."""
    abort = (scope.get("extensions") or {}).get("gateway.abort")
    if abort is None:
        return False
    abort()
    return True


class _AbortConnection(Exception):
    """Raised to make the server drop the connection (headers already sent)."""


def _peer(scope: Scope) -> str | None:
    client = scope.get("client")
    return client[0] if client else None


def _uncancel() -> None:
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def _bare_verdict(reason: Reason, detail: str = "") -> Verdict:
    return Verdict(outcome=Outcome.INCOMPLETE, reason=reason, detail=detail)
