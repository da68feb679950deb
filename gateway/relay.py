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
from typing import Any

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
from gateway.guard.verdict import Outcome, Usage
from gateway.headers import RawHeaders, get_header, pick_request_id, strip_hop_by_hop
from gateway.lifecycle import Lifecycle
from gateway.observe import AccessLog, Metrics, ModelLabels, RequestRecord
from gateway.routing import Route
from gateway.settings import Settings
from gateway.upstream import (
    Upstream,
    chunk_reader,
    close_quietly,
    drain_for_reuse,
    is_timeout,
)

__all__ = ["Relay"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_CREDENTIAL_HEADERS = frozenset({b"authorization", b"x-api-key", b"api-key"})
_REQUEST_DROP = frozenset(
    {b"host", b"content-length", b"x-request-id", b"x-forwarded-for", b"x-forwarded-proto"}
)
# The gateway answers ``Expect: 100-continue`` itself (uvicorn does, on the first body read).
_REQUEST_DROP |= {b"expect"}
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
_TRAILER_SECONDS = 5.0  # how long the last send of a stream may wait for the client


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


def _usage_from_json(protocol: Protocol, body: bytes) -> Usage | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return usage_for(protocol, obj.get("usage")) if isinstance(obj, dict) else None


class Relay:
    """Proxies requests for the configured routes."""

    def __init__(
        self,
        *,
        settings: Settings,
        upstream: Upstream,
        metrics: Metrics,
        access_log: AccessLog,
        model_labels: ModelLabels,
        lifecycle: Lifecycle,
    ) -> None:
        self.settings = settings
        self.upstream = upstream
        self.metrics = metrics
        self.access_log = access_log
        self.model_labels = model_labels
        self.lifecycle = lifecycle
        self.admission = Admission(settings.limits, settings.client_key_sha256)

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
        )
        task = asyncio.current_task()
        assert task is not None
        exchange = _Exchange(task, route, scope, send, record)
        watcher: asyncio.Task[None] | None = None
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
            if watcher is not None:
                watcher.cancel()
            self.lifecycle.unregister(exchange)
            if record.usage is None and record.verdict is not None:
                record.usage = record.verdict.usage
            record.duration = time.monotonic() - started
            self.metrics.observe(record)
            self.access_log.write(record)

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
        record.model_label = self.model_labels.label(record.model)
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
        except ValueError:
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
        client = scope.get("client")
        client_ip = client[0] if client else None
        prior = get_header(scope["headers"], b"x-forwarded-for")
        if client_ip:
            forwarded = (prior + b", " if prior else b"") + client_ip.encode()
            headers.append((b"x-forwarded-for", forwarded))
        headers.append((b"x-forwarded-proto", scope.get("scheme", "http").encode()))
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
                timed_out = is_timeout(exc)
                record.error = "connect_timeout" if timed_out else "connect_error"
                status = 504 if timed_out else 502
                await self._fail_before_response(send, record, status, Reason.UPSTREAM_UNAVAILABLE)
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
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    record.bytes_out += len(chunk)
        except (TimeoutError, httpx.TransportError, OSError) as exc:
            # Headers are out: the only honest signal left is to break the connection.
            record.error = (
                "upstream_timeout" if isinstance(exc, TimeoutError) else ("upstream_disconnect")
            )
            raise _AbortConnection from None
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        exchange.response_done = True
        if sniff:
            record.usage = _usage_from_json(exchange.protocol, b"".join(sniff))

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
        if exchange.stop_reason is Reason.CLIENT_DISCONNECT:
            return
        trailer = guard.annotation(record.request_id) if self.settings.annotate else b""
        if record.time_to_first_byte is None and trailer:
            record.time_to_first_byte = time.monotonic() - started
        exchange.response_done = True
        try:
            # A client that stopped reading must not hold the request (or the drain)
            # past this: drop its connection instead.
            async with asyncio.timeout(_TRAILER_SECONDS):
                await send({"type": "http.response.body", "body": trailer, "more_body": False})
        except TimeoutError:
            record.error = "client_stalled"
            raise _AbortConnection from None
        record.bytes_out += len(trailer)
        if verdict.complete:
            await drain_for_reuse(read)

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


class _AbortConnection(Exception):
    """Raised to make the server drop the connection (headers already sent)."""


def _uncancel() -> None:
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def _bare_verdict(reason: Reason, detail: str = "") -> Verdict:
    return Verdict(outcome=Outcome.INCOMPLETE, reason=reason, detail=detail)
