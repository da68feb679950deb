"""The best case for a guarded relay in Python here: callbacks only, below ASGI and httpx.

The ``push`` target of bench_gateway.py. It is a measurement, not a product:
it answers "what would the gateway cost per event if it left the fixed stack
(uvicorn's ASGI, httpx/aiohttp) for raw asyncio Protocols?" Everything runs
in ``data_received`` callbacks on one uvloop loop, with no task per stream
and no coroutine per event:

* the client side parses requests with httptools (C) and answers chunked;
* the upstream side is a keep-alive pool of Protocols parsing responses with
  httptools; each body piece goes through the real ``StreamGuard`` with the
  ``ChatContract`` and the forwardable bytes are written to the client at once;
* backpressure: a client whose transport pauses writing pauses the
  upstream's reading;
* the stream ends with the same annotation line as the gateway's.

What it leaves out (the gateway does all of it): metrics, the access log,
deadlines, admission, credentials, header filtering, error answers, usage
accounting, drain. So its numbers are a lower bound for any guarded Python
relay, not something the gateway could match with those features.

    python tests/perf/push_relay.py --upstream-port UP --port PORT
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httptools
from floor_server import ProtocolFactory, serve

from gateway.guard import ChatContract, StreamGuard

_HEAD = (
    b"HTTP/1.1 %d OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
_READY = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
_ids = itertools.count(1)


class _HttpSide(asyncio.Protocol):
    """A connection whose bytes go through an httptools parser calling back into it."""

    parser: Any

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()


class Upstream(_HttpSide):
    """One pooled upstream connection; relays one response at a time into ``client``.

    Each upstream read is parsed whole first: the body bytes it carried go through
    the guard in one ``feed`` and what the client gets from it (the response head,
    the forwardable events, the annotation and the chunked terminator) goes out in
    one ``write``, as nginx does with one read.
    """

    def __init__(self, pool: list[Upstream]) -> None:
        self.pool = pool
        self.transport: Any = None
        self.parser = httptools.HttpResponseParser(self)
        self.client: Client | None = None
        self.guard: StreamGuard | None = None
        self.finished = False
        self.pieces: list[bytes] = []  # body bytes of the read being parsed
        self.out: list[bytes] = []  # what the client gets for it
        self.complete = False  # the response ended in the read being parsed

    def start(self, client: Client, request: bytes) -> None:
        self.client = client
        self.guard = StreamGuard(ChatContract())
        self.finished = False
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # the parser's callbacks only collect
        guard, client = self.guard, self.client
        if guard is not None and not self.finished:
            if self.pieces:
                body = self.pieces[0] if len(self.pieces) == 1 else b"".join(self.pieces)
                self._frame(guard.feed(body))
                if guard.done:
                    self._finish(guard)
            if self.complete and not self.finished:
                guard.eof()
                self._frame(guard.final)
                self._finish(guard)
        self.pieces.clear()
        if self.out:
            if client is not None:
                client.write(self.out[0] if len(self.out) == 1 else b"".join(self.out))
                if self.finished:
                    client.done()
            self.out.clear()
        if self.complete:
            self.complete = False
            self._release()

    def on_headers_complete(self) -> None:
        self.out.append(_HEAD % self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def _frame(self, data: bytes) -> None:
        if data:
            self.out.append(b"%x\r\n%b\r\n" % (len(data), data))

    def _finish(self, guard: StreamGuard) -> None:
        self.finished = True
        trailer = guard.annotation(f"push-{next(_ids)}")
        self.out.append(b"%x\r\n%b\r\n0\r\n\r\n" % (len(trailer), trailer))

    def _release(self) -> None:
        """The response ended: back to the pool (or closed), detached from its client."""
        client, self.client, self.guard = self.client, None, None
        if client is not None and client.upstream is self:
            client.upstream = None
        if self.parser.should_keep_alive() and not self.transport.is_closing():
            self.pool.append(self)
        else:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.pool:
            self.pool.remove(self)
        if self.client is not None:
            self.client.transport.close()  # the body was cut: the client sees it cut

    def pause_writing(self) -> None:  # pragma: no cover - requests are small
        pass


class Client(_HttpSide):
    """One client connection: parses requests, relays each through a pooled upstream."""

    def __init__(self, relay: PushRelay) -> None:
        self.relay = relay
        self.transport: Any = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []
        self.upstream: Upstream | None = None

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        url, body = self.url, b"".join(self.body)
        self.url, self.body = b"", []
        if url == b"/readyz":
            self.transport.write(_READY)
            return
        self.relay.exchange(self, url, body)

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def done(self) -> None:
        if not self.parser.should_keep_alive():
            self.transport.close()

    def pause_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.client = None
            self.upstream.transport.close()


class PushRelay:
    def __init__(self, loop: asyncio.AbstractEventLoop, upstream_port: int) -> None:
        self.loop = loop
        self.port = upstream_port
        self.pool: list[Upstream] = []
        self.connecting: set[asyncio.Task[None]] = set()

    def exchange(self, client: Client, url: bytes, body: bytes) -> None:
        request = (
            b"POST %b HTTP/1.1\r\nhost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n"
            b"accept-encoding: identity\r\ncontent-length: %d\r\n\r\n%b"
            % (url, self.port, len(body), body)
        )
        if self.pool:
            upstream = self.pool.pop()
            client.upstream = upstream
            upstream.start(client, request)
            return
        task = self.loop.create_task(self._connect(client, request))
        self.connecting.add(task)
        task.add_done_callback(self.connecting.discard)

    async def _connect(self, client: Client, request: bytes) -> None:
        try:
            _, upstream = await self.loop.create_connection(
                lambda: Upstream(self.pool), "127.0.0.1", self.port
            )
        except OSError:
            client.transport.write(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
            return
        if client.transport.is_closing():
            self.pool.append(upstream)
            return
        client.upstream = upstream
        upstream.start(client, request)


def client_factory(loop: asyncio.AbstractEventLoop, upstream_port: int) -> ProtocolFactory:
    relay = PushRelay(loop, upstream_port)
    return lambda: Client(relay)


if __name__ == "__main__":
    serve(client_factory)
