"""The client edge: limits and timeouts on what a client sends, before the app sees it.

``EdgeProtocol`` is uvicorn's httptools protocol plus the checks only the
connection can make; ``uvicorn_options()`` puts it in front of the app, the
same way for ``gateway serve`` (``--workers N`` too) and for the tests.

- A request head of at most ``limits.max_header_bytes`` bytes and
  ``limits.max_header_fields`` fields, else 431. Bytes are counted as they
  arrive, before the parser sees them: while a head is open the parser is fed
  no more than the limit, so an oversized head costs one limit's worth of
  parsing whatever its size. (A pipelined head, or trailers, that begin
  inside a read, after a body, are counted from the next read: the parser
  may then see one read more. The sizes of the fields it parsed are checked
  too.) A chunked body's trailers count towards the same limits, and are
  dropped: they never join the request's headers.
- ``timeouts.client_header`` to receive a whole head (from the opening of
  the connection for its first request, from the first byte for later ones)
  and ``timeouts.client_body`` between two reads of a body, else 408; a whole
  body within ``timeouts.client_body_total`` of its head's end, however it
  trickles, else 408 (``body_too_slow``). Waits that are the gateway's
  (reading paused, ``100 Continue`` not sent yet) do not count. A connection
  that sends nothing is closed without an answer. Between requests, a
  connection idle for ``timeouts.client_keepalive`` (75 s, nginx's default)
  is closed: longer than the clients' own reuse window, so that the client,
  not the gateway, ends an idle connection (uvicorn's 5 s equals the httpx
  SDKs' and races them: a request written as the gateway closes fails).
  One timer per connection re-arms itself from stamped times, as in
  ``deadlines.py``: a read stores a float, it reschedules nothing.
- ``CONNECT`` and ``TRACE`` get 405: the gateway tunnels and echoes nothing.
- What the parser refuses (not HTTP/1.1, a bad chunk size, a bare LF where
  the strict parser wants CRLF) gets 400, in the gateway's shape like every
  other refusal (uvicorn's own is plain text).
- A WebSocket handshake (``Upgrade: websocket``) hands the connection to
  ``gateway.server.wsedge`` once its head passed the checks. Any other ``Upgrade``
  request is an ordinary request, and what follows it on the connection is
  parsed on (stock uvicorn drops it).
- Every request's scope carries the ``gateway.abort`` extension (a dict, as
  ASGI extensions are), which resets its connection (``abort_connection``)
  and tells of its loss (``watch_connection``): a callback, called once when
  the client's connection is lost, in place of a task per request waiting on
  ``receive()`` for ``http.disconnect``.

A refusal is an OpenAI-shaped JSON error with ``Connection: close``, counted in
``gateway_rejected_requests_total``; the app never sees the request (or sees a
disconnect, when a body stalls), so nothing of it goes upstream. A refused
request the app never saw (refused in its head, or in its body while it waited
behind an earlier response) is handed to ``EdgeConfig.log`` (an ``EdgeRefusal``:
what of its head had arrived) for the access log; one refused in its body while
its app ran is the app's to log, and ``edge_refusal(scope)`` tells it the status
and reason (on that request's scope only). When an
earlier response on the connection is still being written, the refusal waits
for it. After a refusal the connection reads and discards what still comes
for a short while (a lingering close, as nginx does), so that the client reads
the answer rather than a reset.

The configuration reaches each connection at run time through the lifespan's
state (``edge_state``), which uvicorn hands to every protocol instance as
``app_state``; without it (no lifespan) the defaults apply, uncounted.
The subclass leans on uvicorn's protocol internals (``cycle``, ``pipeline``,
``flow``, ``_start_asgi_task``, ``url``, ``headers``, ``client``);
``tests/integration/test_edge.py`` pins what it relies on.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
import struct
import urllib.parse
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, cast

import httptools
from uvicorn._types import ASGI3Application
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

from gateway.proxy.connection import ABORT_EXTENSION
from gateway.proxy.errors import error_body, error_headers
from gateway.proxy.headers import request_id_of
from gateway.settings import GatewayLimits, Timeouts

__all__ = [
    "EdgeConfig",
    "EdgeProtocol",
    "EdgeRefusal",
    "edge_state",
    "uvicorn_options",
]

STATE_KEY: Final = "gateway.edge"
_LINGER_SECONDS = 2.0  # how long a refused connection still reads (and drops) what comes
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, drops unsent bytes
_REFUSED_METHODS = frozenset({b"CONNECT", b"TRACE"})
_ALLOW = b"GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"


class EdgeRefusal(NamedTuple):
    """A request refused at the edge before the app saw it: what of its head had arrived."""

    status: int
    reason: str  # the rejection's metric label, and the error's code
    request_id: str  # as the refusal's answer carries it
    method: str | None  # None when the head ended before its method
    path: str | None  # percent-decoded, without the query; None before the target
    headers: list[tuple[bytes, bytes]]  # the fields that had arrived (names lowercased)
    peer: str | None  # the TCP peer's address
    duration: float  # seconds from the head's start (or the connection's) to the refusal


@dataclass(frozen=True, slots=True)
class EdgeConfig:
    """What every connection's edge enforces, where it counts a refusal and logs one."""

    max_header_bytes: int
    max_header_fields: int
    #: ``client_header``, ``client_body``, ``client_body_total`` and ``client_keepalive``
    timeouts: Timeouts
    reject: Callable[[str], None]  # every refusal's reason, for the metric
    log: Callable[[EdgeRefusal], None]  # a refused request the app never saw

    @classmethod
    def of(
        cls,
        limits: GatewayLimits,
        timeouts: Timeouts,
        reject: Callable[[str], None],
        log: Callable[[EdgeRefusal], None],
    ) -> EdgeConfig:
        return cls(limits.max_header_bytes, limits.max_header_fields, timeouts, reject, log)


def _uncounted(reason: str) -> None:
    return None


def _unlogged(refusal: EdgeRefusal) -> None:
    return None


_DEFAULT = EdgeConfig.of(GatewayLimits(), Timeouts(), _uncounted, _unlogged)


def edge_state(
    limits: GatewayLimits,
    timeouts: Timeouts,
    reject: Callable[[str], None],
    log: Callable[[EdgeRefusal], None],
) -> dict[str, Any]:
    """The lifespan state that configures the edge of every connection."""
    return {STATE_KEY: EdgeConfig.of(limits, timeouts, reject, log)}


def uvicorn_options() -> dict[str, Any]:
    """uvicorn's options for the gateway app: the edge in front, its lifespan required.

    ``serve()`` and the tests both use these. A WebSocket handshake leaves the
    edge for ``gateway.server.wsedge`` (its own limits; per-message deflate off).
    """
    from gateway.server.wsedge import EdgeWebSocketProtocol

    return {
        "http": EdgeProtocol,
        "ws": EdgeWebSocketProtocol,
        "ws_per_message_deflate": False,
        "lifespan": "on",
    }


class _Refusal(NamedTuple):
    status: int
    reason: str  # the rejection's metric label, and the error's code
    message: str
    headers: tuple[tuple[bytes, bytes], ...] = ()


_TOO_LARGE = _Refusal(
    431, "header_too_large", "The request's header fields are larger than the gateway accepts."
)
_HEAD_TIMEOUT = _Refusal(408, "client_timeout", "The request head did not arrive in time.")
_BODY_TIMEOUT = _Refusal(408, "client_timeout", "The request body stalled.")
_BODY_TOO_SLOW = _Refusal(408, "body_too_slow", "The request body did not arrive in time.")
_INVALID = _Refusal(400, "invalid_http", "The request is not valid HTTP/1.1.")
_METHOD = _Refusal(
    405, "method_not_allowed", "CONNECT and TRACE are not served.", ((b"allow", _ALLOW),)
)


def _nothing() -> None:
    return None


def _target_path(url: bytes) -> bytes:
    """The path of a request target as uvicorn gives it to the app (an absolute-form
    target's too); a target it cannot parse (authority form, cut off) as it came."""
    with contextlib.suppress(httptools.HttpParserInvalidURLError):
        path = httptools.parse_url(url).path
        if path is not None:
            return path
    return url.partition(b"?")[0]


class _Stop(Exception):
    """Raised in a parser callback after a refusal: the parser stops there."""


class Phase(enum.IntEnum):
    """What the connection is receiving, and so what its one timer means."""

    IDLE = 0  # between requests: the first byte that comes begins a head
    HEAD = 1  # a request head: ``client_header`` from its first byte
    BODY = 2  # a request body: ``client_body`` between reads, ``client_body_total`` in all


_IDLE, _HEAD, _BODY = Phase.IDLE, Phase.HEAD, Phase.BODY


class EdgeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the client edge's limits and timeouts."""

    # Slots for the edge's own fields: uvicorn's instance dict keeps its own keys
    # only, few enough to stay a compact shared-key dict (about 1.2 KiB less per
    # connection than a dict of all of them).
    __slots__ = (
        "_abort_extension",
        "_body_since",
        "_discard",
        "_edge",
        "_fed",
        "_field_bytes",
        "_fields",
        "_linger",
        "_lost",
        "_max_bytes",
        "_max_fields",
        "_on_lost",
        "_open",
        "_pending",
        "_phase",
        "_running",
        "_since",
        "_timer",
        "_timer_at",
    )

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._edge = _DEFAULT
        self._max_fields = _DEFAULT.max_header_fields
        self._max_bytes = _DEFAULT.max_header_bytes
        self._phase = _HEAD
        self._since = 0.0  # head: when it began; body: the last read
        self._body_since = 0.0  # body: when its head ended (its whole-body clock)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._open = True  # a header section (head or trailers) is arriving
        self._fed = 0  # bytes fed to the parser while that section was open
        self._fields = 0  # header fields of this request (head and trailers)
        self._field_bytes = 0  # their parsed size: a lower bound of their bytes
        self._discard = False  # refused: what still comes is dropped
        self._pending: bytes | None = None  # a refusal waiting for the response in progress
        self._linger: asyncio.TimerHandle | None = None
        self._lost = False
        self._on_lost: list[Callable[[], None]] = []  # ``watch_connection`` callbacks
        self._abort_extension: dict[object, object] = {"abort": self.abort, "watch": self._watch}
        self._running: RequestResponseCycle | None = None  # the cycle whose app was started last

    # -- connection -------------------------------------------------------------

    def connection_made(  # type: ignore[override]
        self, transport: asyncio.Transport
    ) -> None:
        super().connection_made(transport)
        edge = self.app_state.get(STATE_KEY)
        self._edge = edge if isinstance(edge, EdgeConfig) else _DEFAULT
        self._max_fields = self._edge.max_header_fields
        self._max_bytes = self._edge.max_header_bytes
        # uvicorn's own keep-alive timer, armed after each response, waits this long
        # (declared an int there; it only ever reaches loop.call_later)
        self.timeout_keep_alive = self._edge.timeouts.client_keepalive  # type: ignore[assignment]
        self._since = self.loop.time()
        self._arm(self._since + self._edge.timeouts.client_header)

    def connection_lost(self, exc: Exception | None) -> None:
        self._phase = _IDLE
        for handle in (self._timer, self._linger):
            if handle is not None:
                handle.cancel()
        self._timer = self._linger = None
        running = self._running
        if running is not None and running is not self.cycle and not running.response_complete:
            # uvicorn tells only the last request (``cycle``, queued behind this one):
            # the app in flight would answer a lost connection (a 500 on a closed transport).
            running.disconnected = True
            running.message_event.set()
        super().connection_lost(exc)
        self._lost = True
        callbacks, self._on_lost = self._on_lost, []
        for callback in callbacks:
            callback()

    def _watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        if self._lost:
            callback()
            return _nothing
        on_lost = self._on_lost
        on_lost.append(callback)

        def unwatch() -> None:
            with contextlib.suppress(ValueError):  # called already: the list was swapped
                on_lost.remove(callback)

        return unwatch

    def data_received(self, data: bytes) -> None:
        if self._discard:
            return
        self._unset_keepalive_if_required()
        if self._phase == _BODY:
            self._since = self.loop.time()
        elif self._phase == _IDLE:  # between requests: this read begins the next head
            self._open = True
            self._fed = 0
            # Its clock starts now, even if the read is only blank lines (the parser
            # skips them, and uvicorn's keep-alive timer is off from here), and no
            # request is there until the parser begins one: ``scope`` is still the
            # last request's, which a refusal would answer and log a second time.
            self._phase = _HEAD
            self._since = self.loop.time()
            self._arm(self._since + self._edge.timeouts.client_header)
            self.scope = None  # type: ignore[assignment]
        view = memoryview(data)
        while self._open:
            room = self._max_bytes - self._fed
            if room <= 0:  # the section is still open after the limit, and more came
                self._refuse(_TOO_LARGE)
                return
            if len(view) <= room:
                self._fed += len(view)
                self._feed(view)
                return
            self._fed += room
            if not self._feed(view[:room]):
                return
            view = view[room:]
        self._feed(view)

    def _feed(self, data: memoryview) -> bool:
        """Parse ``data``; False when the connection is done with (refused, bad request)."""
        while True:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade as upgrade:
                if self._should_upgrade() and not self._discard:
                    # A WebSocket handshake: the connection leaves the edge for
                    # ``gateway.server.wsedge`` (its head passed the checks above).
                    self._upgrade()
                    return False
                # Any other Upgrade request is an ordinary one, but the parser
                # stopped after it, so what followed it in this read is parsed on.
                data = data[upgrade.args[0] :]
                if data and not self._discard:
                    continue
            except httptools.HttpParserError:
                # Not HTTP (or a refusal, which stops the parser through here too: then
                # this does nothing). uvicorn's own answer would be plain text, written
                # at once even behind a response in progress, and counted nowhere.
                self._refuse(_INVALID)
                return False
            return not self._discard

    def _upgrade(self) -> None:
        self._phase = _IDLE
        self._open = False
        for handle in (self._timer, self._linger):
            if handle is not None:
                handle.cancel()
        self._timer = self._linger = None
        self.handle_websocket_upgrade()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        self._running = cycle
        super()._start_asgi_task(cycle, app)

    def shutdown(self) -> None:
        if self._linger is not None:  # refused and answered: no need to wait any longer
            self.transport.close()
            return
        super().shutdown()

    def abort(self) -> None:
        """Reset the connection: the client sees a reset, and queued bytes are dropped."""
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        self.transport.abort()

    # -- parser callbacks -------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {ABORT_EXTENSION: self._abort_extension}
        self._fields = self._field_bytes = 0
        if not self._open:  # the head begins inside a read: counted from the next one
            self._open = True
            self._fed = 0
        if self._phase != _HEAD:  # a later request: its head's clock starts now
            self._phase = _HEAD
            self._since = self.loop.time()
            self._arm(self._since + self._edge.timeouts.client_header)

    def on_url(self, url: bytes) -> None:
        self._field_bytes += len(url)
        HttpToolsProtocol.on_url(self, url)  # kept even when refused: the log shows it
        if self._field_bytes > self._max_bytes:
            self._refuse(_TOO_LARGE)
            raise _Stop

    def on_header(self, name: bytes, value: bytes) -> None:
        # Called for every field of every request: kept to a few additions.
        self._fields += 1
        self._field_bytes += len(name) + len(value) + 2
        if self._fields > self._max_fields or self._field_bytes > self._max_bytes:
            self._refuse(_TOO_LARGE)
            raise _Stop
        if self._phase == _HEAD:  # after the head, a field is a trailer: dropped
            HttpToolsProtocol.on_header(self, name, value)

    def on_headers_complete(self) -> None:
        if self.parser.get_method() in _REFUSED_METHODS:
            self._refuse(_METHOD)
            raise _Stop
        super().on_headers_complete()
        self._phase = _BODY
        self._open = False
        self._since = self._body_since = self.loop.time()
        timeouts = self._edge.timeouts
        self._arm(self._since + min(timeouts.client_body, timeouts.client_body_total))

    def on_chunk_header(self) -> None:
        # The last chunk's header opens the trailers; any other chunk's data closes it.
        self._open = True
        self._fed = 0

    def on_body(self, body: bytes) -> None:
        self._open = False
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._phase = _IDLE
        self._open = False

    def on_response_complete(self) -> None:
        last = not self.pipeline
        super().on_response_complete()
        if self._pending is not None and last:
            answer, self._pending = self._pending, None
            self._answer(answer)

    # -- timeouts ---------------------------------------------------------------

    def _arm(self, when: float) -> None:
        """Have ``_check`` run by ``when``; the one timer moves only to an earlier time."""
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer_at = when
        self._timer = self.loop.call_at(when, self._check)

    def _check(self) -> None:
        self._timer = None
        now = self.loop.time()
        if self._phase == _HEAD:
            deadline = self._since + self._edge.timeouts.client_header
            refusal = _HEAD_TIMEOUT
        elif self._phase == _BODY:
            if self.flow.read_paused or self.cycle.waiting_for_100_continue:
                # the gateway's wait, not the client's: its time is given back
                self._body_since += now - self._since
                self._since = now
            deadline = self._since + self._edge.timeouts.client_body
            refusal = _BODY_TIMEOUT
            total = self._body_since + self._edge.timeouts.client_body_total
            if total < deadline:
                deadline, refusal = total, _BODY_TOO_SLOW
        else:
            return
        if now >= deadline:
            self._refuse(refusal)
        else:
            self._arm(deadline)

    # -- refusals ---------------------------------------------------------------

    def _refuse(self, refusal: _Refusal) -> None:
        """Count ``refusal``, stop reading, and answer it now or after the response in progress."""
        if self._discard:
            return
        phase, self._phase, self._discard = self._phase, _IDLE, True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport.is_closing():
            return
        if phase == _BODY and self.cycle.response_complete:
            self.transport.close()  # answered already: only the rest of its body was late
            return
        self._edge.reject(refusal.reason)
        seen = False  # True: the app has this request, and logs it
        if phase == _BODY:
            cycle = self.cycle
            cycle.disconnected = True  # its app reads a disconnect; what it sends is dropped
            cycle.waiting_for_100_continue = False  # no 100 Continue after the refusal
            cycle.message_event.set()
            queued = [entry for entry in self.pipeline if entry[0] is cycle]
            for entry in queued:
                self.pipeline.remove(entry)
            if not queued:  # its app runs: told on this request's scope only (not the
                # connection's extension, which an earlier request in flight shares)
                seen = True
                extensions = cycle.scope["extensions"]
                extensions[ABORT_EXTENSION] = {
                    **self._abort_extension,
                    "refused": (refusal.status, refusal.reason),
                }
            if cycle.response_started:  # too late for an answer
                self.transport.close()
                return
            busy = bool(queued)  # queued: an earlier response is being written
        else:
            busy = self.cycle is not None and not self.cycle.response_complete
        if self.scope is None:  # not a byte of a request came: nothing to answer
            answer = b""  # (after the response in progress, if any: then the end)
        else:
            request_id = request_id_of(cast(MutableMapping[str, Any], self.scope))
            if not seen:  # the app never saw this request: the edge has it logged
                self._edge.log(self._refused_request(refusal, request_id))
            answer = self._render(refusal, request_id)
        if busy:
            self._pending = answer
        elif answer:
            self._answer(answer)
        else:
            self.transport.close()

    def _refused_request(self, refusal: _Refusal, request_id: str) -> EdgeRefusal:
        """What of the refused request's head had arrived (uvicorn's fields, the parser's)."""
        url: bytes = self.url  # the target so far (uvicorn's on_url adds to it)
        method = path = None
        if url:  # the method comes before the target: the parser has it
            method = self.parser.get_method().decode("latin-1")
            path = urllib.parse.unquote(_target_path(url).decode("latin-1"))
        client = self.client
        return EdgeRefusal(
            status=refusal.status,
            reason=refusal.reason,
            request_id=request_id,
            method=method,
            path=path,
            headers=list(self.headers),
            peer=client[0] if client else None,
            duration=max(0.0, self.loop.time() - self._since),
        )

    def _render(self, refusal: _Refusal, request_id: str) -> bytes:
        body = error_body(
            None,
            refusal.status,
            refusal.message,
            "invalid_request_error",
            refusal.reason,
            request_id,
        )
        headers = [
            *self.server_state.default_headers,
            *error_headers(body, request_id, list(refusal.headers)),
            (b"connection", b"close"),
        ]
        lines = [STATUS_LINE[refusal.status]]
        lines.extend(b"%s: %s\r\n" % (name, value) for name, value in headers)
        lines.append(b"\r\n")
        lines.append(body)
        return b"".join(lines)

    def _answer(self, answer: bytes) -> None:
        """Write a refusal and end the connection, still reading for a while (lingering)."""
        transport = self.transport
        if transport.is_closing():
            return
        transport.write(answer)
        if not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self.flow.resume_reading()
        self._linger = self.loop.call_later(_LINGER_SECONDS, transport.close)
