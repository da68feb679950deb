"""A raw-socket upstream for tests: records each request's head as sent, answers with bytes.

The simulator speaks correct HTTP; this one sends whatever a test scripts
(a malformed head, a bad chunk size mid-body) and keeps the request line
exactly as the gateway wrote it, which no HTTP server library exposes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

__all__ = [
    "CHAT_STREAM",
    "RawRequest",
    "RawUpstream",
    "Responder",
    "chunk",
    "raw_upstream",
    "sse_head",
]

CHAT_STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"content":"hello"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


def sse_head(extra: bytes = b"") -> bytes:
    """A valid head for a chunked event stream."""
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n" + extra + b"\r\n"
    )


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


@dataclass
class RawRequest:
    """One request as the upstream received it."""

    request_line: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes

    @property
    def target(self) -> bytes:
        return self.request_line.split(b" ")[1]

    def header_values(self, name: bytes) -> list[bytes]:
        return [v for k, v in self.headers if k.lower() == name]


Responder = Callable[[RawRequest, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def answer_stream(
    request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """The default answer: a complete Chat stream, then the connection is closed."""
    writer.write(sse_head(b"connection: close\r\n") + chunk(CHAT_STREAM) + b"0\r\n\r\n")
    await writer.drain()


class RawUpstream:
    """An asyncio TCP server in a thread; ``respond`` writes each answer."""

    def __init__(self, respond: Responder = answer_stream) -> None:
        self.respond = respond
        self.requests: list[RawRequest] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RawUpstream:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("raw upstream did not start")
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()
        for task in list(self._handlers):  # a scripted answer may be waiting on purpose
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *lines = head[:-4].split(b"\r\n")
            headers = [
                (name.strip(), value.strip())
                for name, _, value in (line.partition(b":") for line in lines)
            ]
            length = next((int(v) for k, v in headers if k.lower() == b"content-length"), 0)
            body = await reader.readexactly(length) if length else b""
            request = RawRequest(request_line, headers, body)
            self.requests.append(request)
            await self.respond(request, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


@contextlib.contextmanager
def raw_upstream(respond: Responder = answer_stream) -> Iterator[RawUpstream]:
    upstream = RawUpstream(respond).start()
    try:
        yield upstream
    finally:
        upstream.stop()
