"""The Responses API over WebSocket: one client connection, relayed and verified.

A route whose protocol is ``responses`` accepts ``GET <prefix>/responses``
with ``Upgrade: websocket``. The admission of today applies to the handshake
(path, client key, the drain); then the upstream socket is opened to the
same path on an upstream of the route's pool (``ws_upstream``: failover on
a failed connect or handshake), and only then is the client's accepted.
Text messages are relayed both ways, one for one, unchanged.

Each client ``response.create`` starts one response, judged by the
Responses contract through ``MessageGuard`` (the WebSocket message framing):
one verdict, one access-log line and the stream metrics per response, the
connection counted as a stream for admission while a response is in flight.
A response created with a ``stream_id`` is its own lane; events name their
lane the same way (an event that names none, or does not parse, belongs to
the oldest response in flight). A second ``response.create`` on a lane that is busy is
refused with an ``error`` event (``response_in_progress``), not forwarded.

Ends, each with one ``Close`` (the ``close`` label of
``gateway_websocket_connections_total``) and a close code:

- a response cut (the upstream closed or broke mid-response, a deadline,
  invalid JSON, a contract violation, a message over the limit): the client
  gets one ``error`` event carrying the reason, then both sockets close with
  1011 (``incomplete``);
- the client left: the upstream socket is closed at once (within
  ``CLOSE_TIMEOUT``), a response in flight is ``client_disconnect``;
- the client stopped reading: a send to it that waits ``timeouts.client_send``
  ends the connection as ``client_stalled``; while a send waits the upstream
  is not read, so its deadlines wait too and it is never blamed;
- the upstream sent a message outside any response (after one ended, before
  the next was created; an ``error`` event, its answer to a client message,
  excepted): it is withheld, as anything after ``[DONE]`` over HTTP, and both
  sockets close (1011, ``invalid_shape``);
- the drain: a connection with no response in flight closes with 1001 at
  once, one with a response closes after it; past the drain timeout the
  response gets the ``gateway_shutdown`` error first;
- limits: binary message 1003, over ``ws_max_client_messages_per_second``
  1008, over ``max_ws_message_bytes`` 1009 (``gateway.server.wsedge``),
  ``ws_idle_seconds`` without a response and ``ws_max_connection_seconds``
  1000 (with a response in flight: its ``total_timeout`` error, 1011).

Deadlines are stamped times read by one watchdog per connection, which
sleeps until the earliest of them (no timer per message).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Receive, Scope, Send
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK

from gateway.guard import Action, Event, Protocol, Reason, ResponsesContract
from gateway.guard.jsonparse import loads
from gateway.guard.wsmessage import MessageGuard
from gateway.lifecycle import Lifecycle
from gateway.limits import Limiter
from gateway.observe import AccessLog, Metrics, ModelLabels, Observers, RequestRecord
from gateway.observe.record import Attempt
from gateway.observe.ws_metrics import WsMetrics
from gateway.policy.failover import Result
from gateway.policy.pool import Health
from gateway.policy.quota import Cost, cost_of, output_estimate
from gateway.policy.routing import Route, Target
from gateway.protocols import spec_for
from gateway.proxy.admission import Admission, Caller, Refused, presented_key
from gateway.proxy.connection import WS_EXTENSION, peer_of
from gateway.proxy.errors import error_body, error_headers
from gateway.proxy.headers import (
    HANDSHAKE_DROP,
    Forwarding,
    RawHeaders,
    new_request_id,
    strip_hop_by_hop,
    without_key,
)
from gateway.proxy.owner import owner_from
from gateway.proxy.pricing import Receipts, Spend
from gateway.proxy.relay import arrived
from gateway.proxy.request_body import input_estimate
from gateway.proxy.schema_stage import reader_for, turned_off
from gateway.proxy.tally import attempt_done
from gateway.proxy.ws_upstream import (
    Opened,
    Refusal,
    close_upstream,
    open_upstream,
)
from gateway.settings import ANONYMOUS, Settings

__all__ = ["Close", "WebSocketRelay", "is_websocket_path"]

log = logging.getLogger("gateway")


class Close(enum.StrEnum):
    """Why a WebSocket connection ended (a bounded metric label)."""

    CLIENT = "client_closed"  # the client closed or left
    UPSTREAM = "upstream_closed"  # the upstream closed between responses
    INCOMPLETE = "incomplete"  # a response was cut: error event, 1011
    MESSAGE_TOO_BIG = "message_too_big"  # 1009
    BINARY = "binary_refused"  # 1003
    RATE_LIMITED = "rate_limited"  # 1008: messages or pings per second
    IDLE = "idle"  # ws_idle_seconds without a response: 1000
    MAX_DURATION = "max_duration"  # ws_max_connection_seconds: 1000
    SHUTDOWN = "shutdown"  # the drain: 1001
    CLIENT_STALLED = "client_stalled"  # the client stopped reading: aborted
    #: The upstream sent a message outside any response (after one ended, before the
    #: next was created): withheld, both sockets closed (1011).
    INVALID_SHAPE = "invalid_shape"
    PING_TIMEOUT = "ping_timeout"  # a keepalive ping to the client went unanswered: 1011
    REFUSED = "refused"  # the handshake was refused (no route, key, drain)
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"  # no upstream completed the handshake


@dataclass(frozen=True, slots=True)
class _End:
    close: Close
    #: The close code the client gets (None: it is gone, nothing is sent).
    client_code: int | None
    client_reason: str = ""
    upstream_code: int = 1000
    #: What a response still in flight ends with (None: its verdict is already final).
    reason: Reason | None = None
    detail: str = ""


def is_websocket_path(route: Route, rest: str) -> bool:
    """Whether a path below a route's prefix takes the Responses WebSocket mode."""
    return rest.rstrip("/").endswith("/responses") and route.spec_for(rest).name == "responses"


@dataclass(slots=True, eq=False)
class _Response:
    """One response in flight on a connection."""

    record: RequestRecord
    guard: MessageGuard
    lane: str | None
    contract: ResponsesContract
    last: float | None = None  # the upstream's last message of this response
    last_content: float | None = None
    #: The schema check's reader of a response that asked for a schema (None: none).
    schema: Any = None


@dataclass(slots=True, eq=False)
class _Connection:
    """What one connection's tasks share."""

    route: Route
    scope: Scope
    receive: Receive
    send: Send
    opened: Opened
    record: RequestRecord
    started: float
    responses: dict[str | None, _Response] = field(default_factory=dict)
    count: int = 0  # responses started
    last_activity: float = 0.0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    stop_reason: Reason | None = None
    counted: bool = False  # counted as a stream in admission
    window: float = 0.0  # the rate limit's one-second window and its messages
    window_messages: int = 0
    failed: bool = False  # a response the upstream broke: its health
    #: When a send to the client began that has not finished (it stopped reading):
    #: the upstream is not read meanwhile, so its deadlines wait; ``client_send`` runs.
    sending_since: float | None = None
    #: When the last send to the client finished: the upstream is read again from then.
    resumed: float = 0.0
    #: Whose the responses' receipts are (``gateway.proxy.owner``), and the
    #: team of the caller's issued key.
    owner: str = ""
    team: str | None = None

    @property
    def facts(self) -> dict[str, object]:
        facts = self.scope.get("extensions", {}).get(WS_EXTENSION)
        return facts if isinstance(facts, dict) else {}


@dataclass(kw_only=True, eq=False)
class WebSocketRelay:
    """Relays Responses WebSocket connections for the routes that speak that protocol."""

    settings: Settings
    admission: Admission
    metrics: Metrics
    observers: Observers
    access_log: AccessLog
    model_labels: ModelLabels
    lifecycle: Lifecycle
    forwarding: Forwarding
    #: Named clients' limits are settled per HTTP request: a limited client's
    #: upgrade is refused (its SDK falls back to HTTP), never let past its budget.
    limiter: Limiter | None = None
    #: Prices each response of a named client, as over HTTP (``gateway.spend``).
    spend: Spend | None = None
    #: Keeps each response's receipt (under its request id and its ``resp_`` id)
    #: and the handshake's (a refusal's, or the connection's end), as over HTTP.
    receipts: Receipts | None = None
    ws_metrics: WsMetrics = field(init=False)
    _connections: set[_Connection] = field(init=False, default_factory=set)
    #: Connections admitted and not yet ended (``max_websocket_connections``), in
    #: all and by named client.
    _open: int = field(init=False, default=0)
    _open_by_client: dict[str, int] = field(init=False, default_factory=dict)
    _client_caps: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.ws_metrics = self.metrics.websocket
        self._client_caps = {
            c.name: c.max_websocket_connections
            for c in self.settings.clients
            if c.max_websocket_connections is not None
        }
        self.lifecycle.on_drain(self._drain_started)

    def _drain_started(self) -> None:
        for conn in list(self._connections):
            conn.wake.set()

    # -- the handshake --------------------------------------------------------------

    async def handle(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        record = arrived(route, scope, self.forwarding, "GET")
        record.transport, record.protocol = "websocket", "responses"
        started, request_id = record.started, record.request_id
        close = Close.REFUSED
        slot: str | None = None  # the client whose connection slot this one holds
        facts: dict[str, Any] = {"connection_id": request_id, "responses": 0}
        record.websocket = facts
        opened: Opened | None = None
        blamed = False  # a response the upstream broke: its health
        team: str | None = None
        message_type = ""
        try:
            message = await receive()
            message_type = message["type"]
            if message_type != "websocket.connect":
                return
            admitted = self._admit(route, scope, record)
            if isinstance(admitted, Refused):
                await _refuse(send, scope, admitted, self.metrics, request_id, record)
                return
            target, caller = admitted
            record.client_name = caller.name
            team = caller.team
            capped = self._take_slot(caller.name)
            if capped is not None:
                await _refuse(send, scope, capped, self.metrics, request_id, record)
                return
            slot = caller.name
            result = await open_upstream(
                route,
                target,
                self._upstream_headers(scope, request_id, caller),
                self.metrics,
                record.attempts,
                max_size=self.settings.max_ws_message_bytes,
                ping_interval=self.settings.ws_ping_interval_seconds,
            )
            if isinstance(result, Refusal):
                close = Close.UPSTREAM_UNAVAILABLE
                record.error = result.error
                await _deny_upstream(send, scope, result, request_id, record)
                return
            opened = result
            record.upstream = opened.endpoint.name
            await send(
                {"type": "websocket.accept", "headers": [(b"x-request-id", request_id.encode())]}
            )
            record.status = 101
            self.ws_metrics.opened(route.name)
            conn = _Connection(route, scope, receive, send, opened, record, started)
            conn.last_activity = started
            conn.owner, conn.team = owner_from(caller.name, scope["headers"]), team
            self._connections.add(conn)
            try:
                end = await self._run(conn)
            finally:
                self._connections.discard(conn)
                for response in list(conn.responses.values()):  # cancelled: count them out
                    self._finish(conn, response)
            close, blamed = end.close, conn.failed
            facts.update(
                responses=conn.count,
                close=str(end.close),
                client_close_code=end.client_code,
                upstream_close_code=end.upstream_code,
                close_reason=end.client_reason or None,
            )
        finally:
            if slot is not None:
                self._release_slot(slot)
            if opened is not None:
                health = Health.FAILED if blamed else Health.OK
                record.attempts.append(
                    Attempt(opened.endpoint.name, Result.OK, time.monotonic() - opened.started)
                )
                attempt_done(route, opened.endpoint, opened.lease, health, self.metrics)
            for attempt in record.attempts:
                self.metrics.upstream_attempts.labels(
                    route.name, attempt.upstream, attempt.result
                ).inc()
            self.ws_metrics.ended(
                route.name, str(close), opened is not None and record.status == 101
            )
            record.duration = time.monotonic() - started
            self.access_log.write(record)
            if self.receipts is not None and message_type == "websocket.connect":
                # the handshake's own: a refusal's, or the connection's end (its
                # responses, each on its own receipt, are what it cost)
                self.receipts.keep(
                    record,
                    owner_from(record.client_name, scope["headers"]),
                    team,
                    counted=record.status != 101,
                )

    def _take_slot(self, client: str) -> Refused | None:
        """Count a connection in, or Refused beyond ``max_websocket_connections`` (503 for
        the gateway's, 429 for its client's): each is an upstream socket held open."""
        cap = self.settings.limits.max_websocket_connections
        if cap is not None and self._open >= cap:
            return Refused(
                503,
                "websocket_connections",
                "Too many WebSocket connections; retry shortly.",
                "service_unavailable",
            )
        client_cap = self._client_caps.get(client)
        held = self._open_by_client.get(client, 0)
        if client_cap is not None and held >= client_cap:
            return Refused(
                429,
                "websocket_connections",
                f"This client's max_websocket_connections ({client_cap}) is reached; "
                "close one first.",
                "rate_limit_error",
            )
        self._open += 1
        self._open_by_client[client] = held + 1
        return None

    def _release_slot(self, client: str) -> None:
        self._open -= 1
        held = self._open_by_client[client] - 1
        if held:
            self._open_by_client[client] = held
        else:
            del self._open_by_client[client]

    def _admit(
        self, route: Route, scope: Scope, record: RequestRecord
    ) -> tuple[Target, Caller] | Refused:
        if self.lifecycle.draining:
            return Refused(
                503,
                "shutting_down",
                "The gateway is shutting down; retry on another instance.",
                "service_unavailable",
            )
        try:
            caller = self.admission.check_key(route, scope["headers"])
        except Refused as refused:
            return refused
        record.client_name = caller.name  # a refusal from here on is the client's
        if self.limiter is not None and self.limiter.limited(caller.name):
            return Refused(
                403,
                "limited_client_websocket",
                "This client's limits are enforced on HTTP requests: "
                "use HTTP streaming (POST /v1/responses) instead of a WebSocket.",
                "permission_error",
            )
        try:
            return self.admission.target_of(route, scope), caller
        except Refused as refused:
            return refused

    def _upstream_headers(self, scope: Scope, request_id: str, caller: Caller) -> RawHeaders:
        headers = strip_hop_by_hop(scope["headers"], HANDSHAKE_DROP)
        if caller.keyed:  # a gateway key is the gateway's: never the upstream's
            headers = without_key(headers, presented_key(scope["headers"]))
        headers += self.forwarding.headers(
            scope["headers"], peer_of(scope), "https" if scope.get("scheme") == "wss" else "http"
        )
        headers.append((b"x-request-id", request_id.encode()))
        return headers

    # -- the connection ---------------------------------------------------------------

    async def _run(self, conn: _Connection) -> _End:
        tasks = [
            asyncio.ensure_future(self._from_client(conn)),
            asyncio.ensure_future(self._from_upstream(conn)),
            asyncio.ensure_future(self._watchdog(conn)),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task
        try:
            end = next(iter(done)).result()
        except Exception:
            log.exception("websocket connection %s failed", conn.record.request_id)
            end = _End(
                Close.INCOMPLETE,
                1011,
                "gateway error",
                1011,
                Reason.UPSTREAM_DISCONNECT,
                "gateway error",
            )
        await self._end(conn, end)
        return end

    async def _end(self, conn: _Connection, end: _End) -> None:
        """Finish the responses in flight, tell the client why, close both sockets."""
        client_code = end.client_code
        responses = list(conn.responses.values())
        # A response cut by another one's end (its lane's neighbour was rejected) ends
        # with that one's reason.
        fallback = end.reason or next(
            (r.guard.verdict.reason for r in responses if r.guard.verdict is not None),
            Reason.UPSTREAM_DISCONNECT,
        )
        for response in responses:
            if end.reason is not None or response.guard.verdict is None:
                response.guard.abort(fallback, end.detail)
            text = response.guard.error_message(response.record.request_id, response.lane)
            if text is not None and client_code is not None and self.settings.annotate:
                if await self._to_client_bounded(conn, text):
                    response.record.bytes_out += len(text)
                else:
                    client_code = None
            self._finish(conn, response)
        upstream = asyncio.ensure_future(
            close_upstream(conn.opened.ws, end.upstream_code, end.client_reason[:120])
        )
        if client_code is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    conn.send(
                        {
                            "type": "websocket.close",
                            "code": client_code,
                            "reason": end.client_reason[:120],
                        }
                    ),
                    1.0,
                )
        await upstream

    async def _to_client_bounded(self, conn: _Connection, text: str) -> bool:
        try:
            await asyncio.wait_for(conn.send({"type": "websocket.send", "text": text}), 1.0)
        except Exception:
            return False
        return True

    # -- client -> upstream -------------------------------------------------------------

    async def _from_client(self, conn: _Connection) -> _End:
        settings = self.settings
        limit = settings.ws_max_client_messages_per_second
        upstream = conn.opened.ws
        while True:
            message = await conn.receive()
            if message["type"] == "websocket.disconnect":
                return self._client_gone(conn, message.get("code", 1005))
            text = message.get("text")
            if text is None:
                return _End(
                    Close.BINARY,
                    1003,
                    "binary messages are not accepted",
                    reason=Reason.CLIENT_DISCONNECT,
                    detail="binary message",
                )
            now = time.monotonic()
            conn.last_activity = now
            if now - conn.window >= 1.0:
                conn.window, conn.window_messages = now, 0
            conn.window_messages += 1
            if conn.window_messages > limit:
                return _End(
                    Close.RATE_LIMITED,
                    1008,
                    "too many messages per second",
                    reason=Reason.LIMIT_EXCEEDED,
                    detail="client message rate",
                )
            if "response.create" in text:
                text_or_end = await self._on_create(conn, text, now)
                if isinstance(text_or_end, _End):
                    return text_or_end
                if text_or_end is None:
                    continue
                text = text_or_end
            try:
                await upstream.send(text)
            except ConnectionClosed as exc:
                return self._upstream_closed(conn, exc)

    def _client_gone(self, conn: _Connection, code: int) -> _End:
        facts = conn.facts
        if facts.get("stalled"):
            return _End(Close.CLIENT_STALLED, None, "client stalled", 1011, Reason.CLIENT_STALLED)
        if code == 1009:
            return _End(
                Close.MESSAGE_TOO_BIG,
                None,
                "message too big",
                1011,
                Reason.LIMIT_EXCEEDED,
                "a client message was over the limit",
            )
        if facts.get("ping_timeout"):
            return _End(
                Close.PING_TIMEOUT,
                None,
                "keepalive ping timeout",
                1011,
                Reason.CLIENT_STALLED,
                "a keepalive ping went unanswered",
            )
        if facts.get("ping_flood"):
            return _End(Close.RATE_LIMITED, None, "too many pings", 1011, Reason.LIMIT_EXCEEDED)
        upstream_code = code if 1000 <= code <= 4999 and code not in (1005, 1006, 1015) else 1000
        return _End(Close.CLIENT, None, "client closed", upstream_code, Reason.CLIENT_DISCONNECT)

    async def _on_create(self, conn: _Connection, text: str, now: float) -> str | _End | None:
        """A client message that may be a ``response.create``: the text to forward
        (None: refused here), or how the connection ends."""
        try:
            obj = loads(text)
        except (ValueError, RecursionError):
            return text
        if not isinstance(obj, dict) or obj.get("type") != "response.create":
            return text
        lane_raw = obj.get("stream_id")
        lane = lane_raw if isinstance(lane_raw, str) else None
        request_id = new_request_id()
        if self.lifecycle.draining:
            await self._refuse_response(
                conn,
                request_id,
                503,
                "gateway_shutdown",
                "The gateway is shutting down; reconnect to another instance.",
            )
            return _End(Close.SHUTDOWN, 1001, "the gateway is shutting down")
        if lane in conn.responses:
            await self._refuse_response(
                conn,
                request_id,
                409,
                "response_in_progress",
                "A response is already in progress on this connection.",
            )
            return None
        if not conn.responses:
            try:
                self.admission.start_stream(conn.route)
            except Refused as refused:
                self.metrics.reject(refused.label)
                await self._refuse_response(
                    conn, request_id, refused.status, refused.label, refused.message
                )
                return None
            conn.counted = True
            self.metrics.stream_started(conn.route.name)
            self.lifecycle.register(conn, lambda: self._stop(conn))
        model = obj.get("model")
        endpoint = conn.opened.endpoint
        if isinstance(model, str) and model in endpoint.models:
            text = json.dumps({**obj, "model": endpoint.models[model]}, separators=(",", ":"))
        record = RequestRecord(
            request_id=request_id,
            route=conn.route.name,
            method="GET",
            path=conn.record.path,
            started=now,
            client=conn.record.client,
            client_name=conn.record.client_name,
            status=101,
            model=model if isinstance(model, str) else None,
            user_agent=conn.record.user_agent,
            stream=True,
            bytes_in=len(text),
            upstream=endpoint.name,
            protocol="responses",
            transport="websocket",
            websocket={"connection_id": conn.record.request_id, "response": conn.count},
        )
        contract = ResponsesContract()
        guard = MessageGuard(contract, max_message_bytes=self.settings.max_ws_message_bytes)
        schema = await self._schema_reader(conn, obj, text)
        conn.responses[lane] = _Response(record, guard, lane, contract, schema=schema)
        conn.count += 1
        conn.wake.set()
        return text

    async def _schema_reader(self, conn: _Connection, obj: dict[str, Any], text: str) -> Any:
        """The schema check of a ``response.create`` that asks for a schema (its
        ``text.format`` or ``tools``, as the Responses body over HTTP), or None. A
        WebSocket response has no head to hold: ``hold`` ends it as ``end`` does."""
        config = conn.route.config
        structured = spec_for("responses").structured
        if (
            config.schema_check == "off"
            or structured is None
            or not any(marker.decode() in text for marker in structured.markers)
            or turned_off(conn.scope.get("headers", ()))
        ):
            return None
        return await reader_for(
            obj, structured, config.schema_check, config.schema_max_answer_bytes
        )

    async def _refuse_response(
        self, conn: _Connection, request_id: str, status: int, code: str, message: str
    ) -> None:
        payload = {
            "type": "error",
            "status": status,
            "error": {
                "type": "invalid_request_error" if status < 500 else "service_unavailable",
                "code": code,
                "message": f"{message} (request_id={request_id})",
                "param": None,
            },
        }
        await self._to_client_bounded(conn, json.dumps(payload, separators=(",", ":")))
        if self.receipts is not None:  # a refusal is a request too: it has its receipt
            record = conn.record
            refused = RequestRecord(
                request_id=request_id,
                route=record.route,
                method="GET",
                path=record.path,
                started=time.monotonic(),
                client=record.client,
                client_name=record.client_name,
                status=status,
                rejected=code,
                user_agent=record.user_agent,
                protocol="responses",
                transport="websocket",
                websocket={"connection_id": record.request_id, "response": None},
            )
            self.receipts.keep(refused, conn.owner, conn.team)

    def _stop(self, conn: _Connection) -> None:
        """The drain's timeout: the responses in flight end with ``gateway_shutdown``."""
        conn.stop_reason = Reason.GATEWAY_SHUTDOWN
        conn.wake.set()

    # -- upstream -> client ---------------------------------------------------------------

    async def _from_upstream(self, conn: _Connection) -> _End:
        upstream = conn.opened.ws
        send = conn.send
        responses = conn.responses
        while True:
            try:
                text = await upstream.recv()
            except ConnectionClosed as exc:
                return self._upstream_closed(conn, exc)
            now = time.monotonic()
            if isinstance(text, bytes):
                return _End(
                    Close.INCOMPLETE,
                    1011,
                    "the upstream sent a binary message",
                    1003,
                    Reason.INVALID_SHAPE,
                    "binary message",
                )
            lane = _lane_of(text) if '"stream_id"' in text else None
            response = responses.get(lane)
            if response is None and responses and lane is None:
                # No lane to read (none named, or the message does not parse): the
                # oldest response in flight is judged on it.
                response = next(iter(responses.values()))
            if response is None:
                if not _is_error(text):
                    return self._outside_response(conn)
                # The upstream's answer to a client message that started no response.
                if not await self._relay(conn, send, text):
                    return self._client_gone(conn, 1006)
                continue
            record, guard = response.record, response.guard
            if record.time_to_first_byte is None:
                record.time_to_first_byte = now - record.started
                conn.wake.set()  # the first-byte deadline gives way to the idle one
            before = guard.content_events
            action = guard.feed(text)
            response.last = now
            if response.schema is not None and action is not Action.REJECT:
                # a message names no event type; its JSON value is the contract's parse
                refusal = response.schema.judge(Event(data=text), guard.contract.parsed)
                if refusal is not None:  # the message is withheld: the response ends
                    guard.abort(refusal.reason, refusal.detail, force=True)
                    action = Action.REJECT
            if action is Action.REJECT:
                return _End(
                    Close.INCOMPLETE,
                    1011,
                    f"response incomplete: {guard.verdict.reason}"
                    if guard.verdict
                    else "response incomplete",
                    1011,
                )
            if guard.content_events != before:
                if response.last_content is None:
                    record.time_to_first_token = now - record.started
                else:
                    record.chunk_gaps.append(now - response.last_content)
                response.last_content = now
            if not await self._relay(conn, send, text):
                return self._client_gone(conn, 1006)
            record.bytes_out += len(text)
            if action is Action.FINISH:
                del responses[lane]
                self._finish(conn, response)
                conn.last_activity = now
                conn.wake.set()

    async def _relay(self, conn: _Connection, send: Send, text: str) -> bool:
        """Send one message to the client; False when it is gone. While the send waits
        (the client stopped reading), the upstream is not read: its deadlines wait."""
        conn.sending_since = time.monotonic()
        try:
            await send({"type": "websocket.send", "text": text})
        except OSError:
            return False
        finally:
            conn.sending_since = None
            # The upstream's idle clock restarts when the send ends, taken or failed: a
            # send the edge cut (a stalled client) must not leave the upstream looking
            # silent since before it, for the watchdog to blame it first.
            conn.resumed = time.monotonic()
        return True

    def _outside_response(self, conn: _Connection) -> _End:
        """The upstream sent a message that belongs to no response in flight (after the
        last one ended, before the next was created): as after ``[DONE]`` over HTTP it
        is never relayed. An upstream that does this cannot be trusted with the next
        response either: the connection ends, and the upstream is blamed."""
        conn.failed = True
        log.warning(
            "websocket connection %s: the upstream sent a message outside any response; "
            "withheld, connection closed",
            conn.record.request_id,
        )
        return _End(
            Close.INVALID_SHAPE,
            1011,
            "upstream message outside a response",
            1008,
            Reason.INVALID_SHAPE,
            "a message outside any response",
        )

    def _upstream_closed(self, conn: _Connection, exc: ConnectionClosed) -> _End:
        received = exc.rcvd
        if (received is not None and received.code == 1009) or (
            exc.sent is not None and exc.sent.code == 1009
        ):
            return _End(
                Close.INCOMPLETE,
                1011,
                "upstream message too big",
                1009,
                Reason.LIMIT_EXCEEDED,
                "an upstream message was over the limit",
            )
        if not conn.responses:
            code = received.code if received is not None else 1011
            if code in (1005, 1006, 1015) or not 1000 <= code <= 4999:
                code = 1011
            return _End(Close.UPSTREAM, code, "upstream closed", 1000)
        conn.failed = True
        if isinstance(exc, ConnectionClosedOK):
            for response in conn.responses.values():
                response.guard.eof()
            return _End(Close.INCOMPLETE, 1011, "upstream closed mid-response", 1000)
        return _End(
            Close.INCOMPLETE,
            1011,
            "upstream connection lost",
            1011,
            Reason.UPSTREAM_DISCONNECT,
            "the upstream socket closed mid-response",
        )

    # -- deadlines and the drain --------------------------------------------------------------

    async def _watchdog(self, conn: _Connection) -> _End:
        settings = self.settings
        timeouts = conn.opened.endpoint.timeouts
        max_life = conn.started + settings.ws_max_connection_seconds
        while True:
            now = time.monotonic()
            if conn.stop_reason is not None:
                conn.failed = False
                return _End(
                    Close.SHUTDOWN, 1001, "the gateway is shutting down", 1001, conn.stop_reason
                )
            if self.lifecycle.draining and not conn.responses:
                return _End(Close.SHUTDOWN, 1001, "the gateway is shutting down", 1001)
            deadline = max_life
            if now >= max_life:
                if conn.responses:
                    return _End(
                        Close.MAX_DURATION,
                        1011,
                        "connection time limit",
                        1000,
                        Reason.TOTAL_TIMEOUT,
                        "ws_max_connection_seconds",
                    )
                return _End(Close.MAX_DURATION, 1000, "connection time limit", 1000)
            if not conn.responses:
                idle_at = conn.last_activity + settings.ws_idle_seconds
                if now >= idle_at:
                    return _End(Close.IDLE, 1000, "idle", 1000)
                deadline = min(deadline, idle_at)
            sending_since = conn.sending_since
            if sending_since is not None and conn.responses:
                # The client is not taking what the upstream sent: its fault, not the
                # upstream's, as over HTTP (the edge aborts it first, at the same time).
                stalled_at = sending_since + timeouts.client_send
                if now >= stalled_at:
                    conn.failed = False
                    return _End(
                        Close.CLIENT_STALLED, None, "client stalled", 1011, Reason.CLIENT_STALLED
                    )
                deadline = min(deadline, stalled_at)
            for response in conn.responses.values():
                started = response.record.started
                total_at = started + timeouts.total
                if response.last is None:
                    wait_at, reason = started + timeouts.first_byte, Reason.FIRST_BYTE_TIMEOUT
                else:
                    last = max(response.last, conn.resumed)
                    wait_at, reason = last + timeouts.idle, Reason.IDLE_TIMEOUT
                if now >= total_at:
                    return _End(
                        Close.INCOMPLETE,
                        1011,
                        "response incomplete: total_timeout",
                        1000,
                        Reason.TOTAL_TIMEOUT,
                    )
                if sending_since is not None:
                    wait_at = total_at  # the upstream is not being read: it waits too
                if now >= wait_at:
                    conn.failed = not conn.facts.get("stalled")  # a stalled client's doing
                    return _End(
                        Close.INCOMPLETE, 1011, f"response incomplete: {reason}", 1000, reason
                    )
                deadline = min(deadline, total_at, wait_at)
            conn.wake.clear()
            # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation
            # that arrives as the event is set (a response's end sets it), and the
            # connection's end would then wait for the next deadline.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(deadline - now, 0.001)):
                    await conn.wake.wait()

    # -- one response's end ------------------------------------------------------------------

    def _finish(self, conn: _Connection, response: _Response) -> None:
        conn.responses.pop(response.lane, None)
        record, guard = response.record, response.guard
        verdict = guard.verdict
        if verdict is None:
            verdict = guard.abort(Reason.CLIENT_DISCONNECT)
        record.verdict = verdict
        record.usage = verdict.usage
        record.upstream_model = guard.contract.model
        if response.schema is not None:
            record.schema = response.schema.verdicts()
        response_id = response.contract.response_id
        if record.websocket is not None and response_id is not None:
            record.websocket["response_id"] = response_id
        record.duration = time.monotonic() - record.started
        record.model_label = self.model_labels.label(record.model, record.upstream_model)
        conn.record.bytes_in += record.bytes_in
        conn.record.bytes_out += record.bytes_out
        if record.client_name != ANONYMOUS:
            record.charge = _charge(record)  # a named client's tokens, as over HTTP
            if self.spend is not None:
                rest = record.path[len(conn.route.config.prefix) :]
                spec = conn.route.spec_for(rest)
                record.charge = self.spend.price_record(
                    record, spec, conn.route.config, record.charge, conn.team
                )
        if not conn.responses and conn.counted:
            conn.counted = False
            self.admission.end_stream(conn.route)
            self.metrics.stream_ended(conn.route.name)
            self.lifecycle.unregister(conn)
        self.observers.observe(record)
        if self.receipts is not None:
            self.receipts.keep(
                record, conn.owner, conn.team, (response_id,) if response_id is not None else ()
            )


def _charge(record: RequestRecord) -> Cost:
    """What one response cost its named client: the reported usage, else an estimate
    from the ``response.create`` message and the text that reached the client."""
    estimated_input = input_estimate(None, record.bytes_in)
    usage = record.usage
    if usage is not None and (usage.input_tokens is not None or usage.output_tokens is not None):
        return cost_of(usage.input_tokens, usage.output_tokens, estimated_input, 0)
    verdict = record.verdict
    output = (
        output_estimate(True, verdict.events, verdict.content_chars, record.bytes_out)
        if verdict is not None
        else 0
    )
    return cost_of(None, None, estimated_input, output)


def _is_error(text: str) -> bool:
    """Whether an upstream message is an ``error`` event (its answer to a client message)."""
    if '"error"' not in text:
        return False
    try:
        obj = loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and obj.get("type") == "error"


def _lane_of(text: str) -> str | None:
    try:
        obj = loads(text)
    except (ValueError, RecursionError):
        return None
    lane = obj.get("stream_id") if isinstance(obj, dict) else None
    return lane if isinstance(lane, str) else None


async def _deny(
    send: Send,
    scope: Scope,
    status: int,
    message: str,
    type_: str,
    code: str,
    request_id: str,
    record: RequestRecord,
) -> None:
    """Refuse the handshake with the gateway's JSON error (an HTTP answer, not a socket)."""
    body = error_body(Protocol.RESPONSES, status, message, type_, code, request_id)
    await _deny_with(send, scope, status, body, error_headers(body, request_id), record)


async def _refuse(
    send: Send,
    scope: Scope,
    refused: Refused,
    metrics: Metrics,
    request_id: str,
    record: RequestRecord,
) -> None:
    """Refuse the handshake for a reason of the gateway's own: recorded and counted."""
    record.rejected = refused.label
    metrics.reject(refused.label)
    await _deny(
        send,
        scope,
        refused.status,
        refused.message,
        refused.type_,
        refused.label,
        request_id,
        record,
    )


async def _deny_upstream(
    send: Send, scope: Scope, refusal: Refusal, request_id: str, record: RequestRecord
) -> None:
    if refusal.body is not None and refusal.status != 502:
        body = refusal.body
        headers: RawHeaders = [
            (b"content-type", b"application/json"),
            (b"x-request-id", request_id.encode()),
        ]
        await _deny_with(send, scope, refusal.status, body, headers, record)
        return
    message = (
        "The upstream did not answer in time."
        if refusal.status == 504
        else "The upstream could not be reached."
    )
    await _deny(
        send,
        scope,
        refusal.status,
        message,
        "upstream_error",
        "upstream_unavailable",
        request_id,
        record,
    )


async def _deny_with(
    send: Send, scope: Scope, status: int, body: bytes, headers: RawHeaders, record: RequestRecord
) -> None:
    record.status = status
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})
    record.bytes_out += len(body)
