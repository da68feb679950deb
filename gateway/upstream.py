"""The upstream HTTP client: httpx's request/response API over a transport chosen by measurement.

``aiohttp`` (the default) is an ``httpx.AsyncBaseTransport`` over aiohttp's
C-accelerated HTTP parser and connection pool. Plain httpx collapses under
a thousand concurrent streams (its pool scans every connection on each
request); see tests/perf and the README's performance section. ``httpx``
keeps httpx's own transport as a fallback.

The relay speaks httpx: it builds an ``httpx.Request`` and gets an
``httpx.Response`` from ``Upstream.send``. The aiohttp transport also puts a
``READ_CHUNK`` coroutine function in the response's ``extensions`` (httpx's
documented way for transports to expose more): it returns the next body
chunk (``b""`` at the end) without httpx's async-generator layers, which cost
more than the guard on the per-event hot path.

Error mapping: a refused or failed connection is ``httpx.ConnectError``, a
connect timeout ``httpx.ConnectTimeout``, a body cut mid-way
``httpx.RemoteProtocolError`` (the relay reports ``upstream_disconnect``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Literal

import aiohttp
import httpx

__all__ = [
    "READ_CHUNK",
    "AiohttpTransport",
    "Upstream",
    "chunk_reader",
    "close_quietly",
    "create_upstream",
    "drain_for_reuse",
    "is_timeout",
]

#: Response extension: ``async () -> bytes``, the next raw body chunk, b"" at the end.
READ_CHUNK = "gateway.read_chunk"

ReadChunk = Callable[[], Awaitable[bytes]]


class _AiohttpBody(httpx.AsyncByteStream):
    """The response body of one aiohttp response, as httpx sees it."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self._content = response.content

    async def read_chunk(self) -> bytes:
        try:
            return await self._content.readany()
        except aiohttp.ClientPayloadError as exc:
            raise httpx.RemoteProtocolError("upstream body ended abruptly") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise httpx.ReadError("upstream connection failed while reading") from exc

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while chunk := await self.read_chunk():
            yield chunk

    async def aclose(self) -> None:
        # Returns the connection to the pool when the body was read to its end,
        # closes it otherwise (aiohttp decides by the parser's state).
        self._response.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx transport over one pooled ``aiohttp.ClientSession``."""

    def __init__(self, max_connections: int, keepalive_expiry: float = 30.0) -> None:
        self._max_connections = max_connections
        self._keepalive_expiry = keepalive_expiry
        self._session: aiohttp.ClientSession | None = None

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections,
                limit_per_host=0,
                keepalive_timeout=self._keepalive_expiry,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                trust_env=False,
                # The upstream sees the client's (filtered) headers and nothing of aiohttp's.
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {})
        connect = timeout.get("connect")
        session = self._session_now()
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        content = request.content
        try:
            response = await session.request(
                request.method,
                str(request.url),
                headers=headers,
                data=content or None,
                allow_redirects=False,
                compress=None,
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=timeout.get("pool", connect), sock_connect=connect
                ),
            )
        except (aiohttp.ServerTimeoutError, TimeoutError) as exc:
            raise httpx.ConnectTimeout("connecting to the upstream timed out") from exc
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError("could not connect to the upstream") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise httpx.RemoteProtocolError("the upstream failed before answering") from exc
        body = _AiohttpBody(response)
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=body,
            request=request,
            extensions={"http_version": b"HTTP/1.1", READ_CHUNK: body.read_chunk},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


@functools.lru_cache(maxsize=1024)
def _parse_url(url: str) -> httpx.URL:
    """Parsed once per distinct URL: httpx checks the encoding of every character of the
    path and query in Python, ~25 us a request; a gateway sends a handful of URLs."""
    return httpx.URL(url)


class Upstream:
    """Sends requests to upstreams through one pooled transport."""

    def __init__(self, transport: httpx.AsyncBaseTransport, connect_timeout: float) -> None:
        self.transport = transport
        # Only connect (and pool wait) is left to the transport; the relay keeps the other clocks.
        self._timeout = {"connect": connect_timeout, "pool": connect_timeout}

    def request(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]], content: bytes
    ) -> httpx.Request:
        request = httpx.Request(method, _parse_url(url), headers=headers, content=content)
        request.extensions = {"timeout": self._timeout}
        return request

    async def send(self, request: httpx.Request) -> httpx.Response:
        return await self.transport.handle_async_request(request)

    async def aclose(self) -> None:
        await self.transport.aclose()


def create_upstream(
    transport: Literal["aiohttp", "httpx"], max_connections: int, connect_timeout: float
) -> Upstream:
    if transport == "aiohttp":
        return Upstream(AiohttpTransport(max_connections), connect_timeout)
    limits = httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        keepalive_expiry=30.0,
    )
    return Upstream(httpx.AsyncHTTPTransport(limits=limits, retries=0), connect_timeout)


def chunk_reader(response: httpx.Response) -> ReadChunk:
    """The fastest way to read this response's body chunk by chunk (b"" at the end)."""
    encoded = response.headers.get("content-encoding", "identity") != "identity"
    read: ReadChunk | None = response.extensions.get(READ_CHUNK)
    if read is not None and not encoded:
        return read
    chunks = (response.aiter_bytes() if encoded else response.aiter_raw()).__aiter__()

    async def next_chunk() -> bytes:
        try:
            return await chunks.__anext__()
        except StopAsyncIteration:
            return b""

    return next_chunk


async def drain_for_reuse(read: ReadChunk, budget: int = 65536) -> None:
    """After the terminator, read what little is left so the connection can be reused.

    The chunked-body terminator usually follows ``[DONE]`` at once; an upstream
    that keeps sending gets its connection closed instead.
    """
    try:
        async with asyncio.timeout(0.05):
            while chunk := await read():
                budget -= len(chunk)
                if budget < 0:
                    return
    except (TimeoutError, httpx.TransportError, OSError):
        return


def is_timeout(exc: BaseException) -> bool:
    """Whether a transport error was a timeout (a connect timeout, as opposed to a refusal)."""
    cause: BaseException | None = exc
    while cause is not None:
        if type(cause).__module__.startswith("aiohttp"):
            return isinstance(cause, TimeoutError)
        cause = cause.__cause__
    return isinstance(exc, httpx.TimeoutException | TimeoutError)


async def close_quietly(response: httpx.Response) -> None:
    """Close a response; a broken upstream must not mask the verdict already reached."""
    with contextlib.suppress(Exception):
        await response.aclose()
