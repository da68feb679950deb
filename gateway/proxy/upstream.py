"""The upstream HTTP client: httpx's request/response API over a transport chosen by measurement.

``aiohttp`` (the default) is an ``httpx.AsyncBaseTransport`` over aiohttp's
C-accelerated HTTP parser and connection pool. Plain httpx collapses under
a thousand concurrent streams (its pool scans every connection on each
request); see tests/perf and docs/performance.md. ``httpx``
keeps httpx's own transport as a fallback.

The relay builds an ``UpstreamRequest`` (``Upstream.request``) and gets an
``httpx.Response`` from ``Upstream.send``. Over the aiohttp transport no
``httpx.Request`` is built: ``AiohttpTransport.send`` takes the request's
parts as they are, with the head httpx would have made of them
(``httpx_head``: ``Host`` first, the headers in order, ``Content-Length``
last), so the upstream gets the same bytes. Any other transport gets the
``httpx.Request`` (``UpstreamRequest.to_httpx``) through httpx's transport
API, as does anyone calling ``AiohttpTransport.handle_async_request``.
The aiohttp transport also puts a
``READ_CHUNK`` coroutine function in the response's ``extensions`` (httpx's
documented way for transports to expose more): it returns the next body
chunk (``b""`` at the end) without httpx's async-generator layers, which cost
more than the guard on the per-event hot path.

The request target (path and query) travels in the request's ``target``
extension (httpcore's own name for it), as the bytes the client sent:
neither httpx's URL nor yarl may re-encode it (``%2F`` must stay ``%2F``).
``request.url`` carries only the upstream's origin.

Error mapping: one table (``_ERRORS``), read by ``_translate`` in both
places aiohttp can fail (sending, reading the body), like httpx's
``map_httpcore_exceptions``. A refused or failed connection is
``httpx.ConnectError``, a connect timeout ``httpx.ConnectTimeout``; once
connected, an answer that breaks HTTP (a malformed or oversized head, a
body cut or mis-framed mid-way, a close before any answer) is
``httpx.RemoteProtocolError``. ``send_failure`` turns what ``send`` raised
into the access log's ``error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import httpx
import yarl
from aiohttp.http_exceptions import HttpProcessingError
from multidict import CIMultiDict, CIMultiDictProxy, istr

from gateway.policy.errors import AttemptError

__all__ = [
    "READ_CHUNK",
    "AiohttpTransport",
    "Upstream",
    "UpstreamRequest",
    "chunk_reader",
    "close_quietly",
    "create_upstream",
    "drain_for_reuse",
    "send_failure",
]

#: Response extension: ``async () -> bytes``, the next raw body chunk, b"" at the end.
READ_CHUNK = "gateway.read_chunk"

ReadChunk = Callable[[], Awaitable[bytes]]

_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())

# aiohttp's exceptions -> httpx's, most specific first; the first match wins.
# Only connect timeouts are set on aiohttp (the relay keeps the other clocks).
_ERRORS: tuple[tuple[type[BaseException], type[httpx.TransportError], str], ...] = (
    (aiohttp.SocketTimeoutError, httpx.ReadTimeout, "reading from the upstream timed out"),
    (TimeoutError, httpx.ConnectTimeout, "connecting to the upstream timed out"),
    (aiohttp.ClientConnectorError, httpx.ConnectError, "could not connect to the upstream"),
    # The head parser failed: malformed, or over aiohttp's size limits.
    (aiohttp.ClientResponseError, httpx.RemoteProtocolError, "the upstream's head is invalid"),
    (aiohttp.ClientPayloadError, httpx.RemoteProtocolError, "the upstream's body is broken"),
    # aiohttp's pure-Python parser puts its own errors on the body as they are.
    (HttpProcessingError, httpx.RemoteProtocolError, "the upstream's answer is not valid HTTP"),
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError, "the upstream closed early"),
    (aiohttp.ClientError, httpx.ReadError, "the upstream connection failed"),
    (OSError, httpx.ReadError, "the upstream connection failed"),
)


def _translate(exc: Exception) -> Exception:
    """The httpx exception for an aiohttp one (``exc`` itself when the table has none)."""
    for foreign, ours, message in _ERRORS:
        if isinstance(exc, foreign):
            return ours(message)
    return exc


class _AiohttpBody(httpx.AsyncByteStream):
    """The response body of one aiohttp response, as httpx sees it."""

    def __init__(self, response: aiohttp.ClientResponse, watch: _ClosedWatch) -> None:
        self._response = response
        self._content = response.content
        self._watch = watch
        connection = response.connection
        self._protocol = connection.protocol if connection is not None else None
        if self._protocol is not None:
            watch.reading(self._protocol, self._content)

    async def read_chunk(self) -> bytes:
        # try/except rather than a context manager: this runs once per chunk.
        try:
            return await self._content.readany()
        except Exception as exc:
            raise _translate(exc) from exc

    def ended(self) -> bool:
        """The whole body was read (aiohttp has its end and nothing left in its buffer)."""
        return self._content.at_eof()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while chunk := await self.read_chunk():
            yield chunk

    async def aclose(self) -> None:
        if self._protocol is not None:
            self._watch.done(self._protocol)
            self._protocol = None
        # Returns the connection to the pool when the body was read to its end,
        # closes it otherwise (aiohttp decides by the parser's state).
        self._response.release()


class _ClosedWatch:
    """Fails a body whose connection closed under it, instead of leaving it waiting.

    aiohttp's C parser (``_http_parser.pyx``, ``HttpParser.feed_data``), on
    an error inside a body (an invalid chunk size, say), drops its own
    reference to the body's ``StreamReader`` and raises. The protocol's
    ``data_received`` then closes the transport and records the error on
    the protocol only; ``connection_lost`` asks the parser for EOF, which
    has no body left to fail, so nothing ever sets an exception on the
    reader or feeds it EOF: ``readany()`` waits until the relay's idle
    timeout. (The pure-Python parser sets the error on the reader itself.)

    So each connection's ``closed`` future (one callback per connection,
    not per request) fails the body being read on it, unless that body has
    ended. Cost: a dict store and pop per response.
    """

    def __init__(self) -> None:
        self._reading: dict[object, aiohttp.StreamReader] = {}
        self._hooked: weakref.WeakSet[object] = weakref.WeakSet()

    def reading(self, protocol: Any, content: aiohttp.StreamReader) -> None:
        if protocol not in self._hooked:
            closed: asyncio.Future[None] | None = protocol.closed
            if closed is None:  # already lost
                _fail_unfinished(content)
                return
            self._hooked.add(protocol)
            closed.add_done_callback(functools.partial(self._closed, weakref.ref(protocol)))
        self._reading[protocol] = content

    def done(self, protocol: object) -> None:
        self._reading.pop(protocol, None)

    def _closed(self, protocol: weakref.ref[object], future: asyncio.Future[None]) -> None:
        if not future.cancelled():
            future.exception()  # retrieved: an unclean close is not "never retrieved"
        key = protocol()
        content = self._reading.pop(key, None) if key is not None else None
        if content is not None:
            _fail_unfinished(content)


def _fail_unfinished(content: aiohttp.StreamReader) -> None:
    if not content.is_eof() and content.exception() is None:
        content.set_exception(aiohttp.ClientPayloadError("the upstream connection closed"))


#: What aiohttp would add to a request of its own accord: the upstream sees the client's
#: (filtered) headers and nothing of aiohttp's.
SKIPPED_AUTO_HEADERS = ("User-Agent", "Accept-Encoding", "Accept", "Content-Type")
# Built as aiohttp's ClientRequest.update_auto_headers builds it (sorted), once.
_SKIPPED: CIMultiDict[None] = CIMultiDict(
    (name, None) for name in sorted(frozenset(istr(h) for h in SKIPPED_AUTO_HEADERS))
)


class _Request(aiohttp.ClientRequest):
    """aiohttp's request, with the session's skipped auto-headers built once.

    aiohttp's ``update_auto_headers`` sorts the skip set into a new
    ``CIMultiDict`` and copies the request's headers on every request, to
    add the defaults (``DEFAULT_HEADERS``, ``User-Agent``) that are not
    skipped. Every one of them is skipped here, so it would add none: this
    sets the prebuilt set (private ``_skip_auto_headers``, read again for
    the body's headers) and adds nothing. tests/unit/test_aiohttp_request.py
    pins the field and aiohttp's defaults; tests/integration/
    test_upstream_same_bytes.py compares the bytes sent with aiohttp's own.
    """

    def update_auto_headers(self, skip_auto_headers: Iterable[str] | None) -> None:
        self._skip_auto_headers = _SKIPPED


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx transport over one pooled ``aiohttp.ClientSession``."""

    def __init__(
        self,
        max_connections: int,
        keepalive_expiry: float = 4.0,
        request_class: type[aiohttp.ClientRequest] = _Request,
    ) -> None:
        self._request_class = request_class
        self._max_connections = max_connections
        self._keepalive_expiry = keepalive_expiry
        self._session: aiohttp.ClientSession | None = None
        self._watch = _ClosedWatch()

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
                skip_auto_headers=SKIPPED_AUTO_HEADERS,
                request_class=self._request_class,
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """httpx's transport API: the request's head as httpx built it."""
        timeout = request.extensions.get("timeout", {})
        connect = timeout.get("connect")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        target: bytes = request.extensions.get("target") or request.url.raw_path
        return await self.send(
            request.method,
            _aiohttp_url(_origin(request.url), target),
            headers,
            request.content,
            _client_timeout(timeout.get("pool", connect), connect),
        )

    async def send(
        self,
        method: str,
        url: yarl.URL,
        headers: list[tuple[str, str]],
        content: bytes,
        limits: aiohttp.ClientTimeout,
    ) -> httpx.Response:
        """Send a request whose head is complete (``headers`` as sent, Host included)."""
        session = self._session_now()
        try:
            response = await session.request(
                method,
                url,
                headers=headers,
                data=content or None,
                allow_redirects=False,
                compress=None,
                timeout=limits,
            )
        except Exception as exc:
            raise _translate(exc) from exc
        # aiohttp keeps the request's headers (and our decoded copy of them) in the
        # response for its error messages, which the gateway never raises: for the
        # whole life of a stream. Its method and URL are all it needs. (A private
        # field and its cached property: tests/integration/test_upstream_edges.py
        # pins both.)
        info = response.request_info
        response._request_info = aiohttp.RequestInfo(
            info.url, info.method, _NO_HEADERS, info.real_url
        )
        response._cache.pop("request_info", None)
        body = _AiohttpBody(response, self._watch)
        # No ``request=``: the relay never reads the request back from the response,
        # and a stream would otherwise keep it (headers, body) until its end.
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=body,
            extensions={"http_version": b"HTTP/1.1", READ_CHUNK: body.read_chunk},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


_CACHED_TARGET_BYTES = 256  # longer targets (long queries) are built every time


def _aiohttp_url(origin: str, target: bytes) -> yarl.URL:
    """The URL aiohttp sends to; built once per origin and short target (a gateway sees
    few), so that the cache stays small whatever clients send.

    ``encoded=True``: yarl takes the target as it is (it would decode %2F, %3F...).
    """
    if len(target) > _CACHED_TARGET_BYTES:
        return yarl.URL(origin + target.decode("ascii"), encoded=True)
    return _cached_url(origin, target)


@functools.lru_cache(maxsize=1024)
def _cached_url(origin: str, target: bytes) -> yarl.URL:
    return yarl.URL(origin + target.decode("ascii"), encoded=True)


@functools.lru_cache(maxsize=64)
def _client_timeout(pool: float | None, connect: float | None) -> aiohttp.ClientTimeout:
    """aiohttp's timeouts (only connecting; the relay keeps the other clocks), built once."""
    return aiohttp.ClientTimeout(total=None, connect=pool, sock_connect=connect)


@functools.lru_cache(maxsize=256)
def _parse_origin(origin: str) -> httpx.URL:
    """Parsed once per upstream: a gateway talks to a handful of origins."""
    return httpx.URL(origin)


def _origin(url: httpx.URL) -> str:
    return f"{url.scheme}://{url.netloc.decode('ascii')}"


@functools.lru_cache(maxsize=256)
def _normal_origin(origin: str) -> str:
    """``origin`` as httpx's URL spells it (host lowercased, default port dropped)."""
    return _origin(_parse_origin(origin))


def _split_target(url: str) -> tuple[str, bytes]:
    """``scheme://host[:port]`` and the request target (``/path?query``) of a URL."""
    start = url.index("://") + 3
    slash = url.find("/", start)
    if slash < 0:
        return url, b"/"
    return url[:slash], url[slash:].encode("latin-1")


@functools.lru_cache(maxsize=256)
def _host_header(origin: str) -> bytes:
    """The ``Host`` value httpx would send to ``origin`` (its URL's netloc)."""
    return _parse_origin(origin).netloc


def httpx_head(
    method: str, origin: str, headers: list[tuple[bytes, bytes]], content: bytes
) -> list[tuple[str, str]]:
    """The head ``httpx.Request(method, origin, headers=headers, content=content)`` would
    send, for headers without ``Host``, ``Content-Length`` or ``Transfer-Encoding`` (the
    relay drops them): ``Host`` first, ``Content-Length: 0`` for an empty POST/PUT/PATCH,
    the headers in their order, ``Content-Length`` last for a body. A test holds it to
    httpx's own over generated requests."""
    out = [("Host", _host_header(origin).decode("latin-1"))]
    if not content and method in ("POST", "PUT", "PATCH"):
        out.append(("Content-Length", "0"))
    out += [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
    if content:
        out.append(("Content-Length", str(len(content))))
    return out


@dataclass(slots=True)
class UpstreamRequest:
    """One request for an upstream: what the relay decided, not yet any client's object."""

    method: str
    origin: str  # scheme://host[:port]
    target: bytes  # /path?query, as the client sent it
    headers: list[tuple[bytes, bytes]]  # without Host, Content-Length, Transfer-Encoding
    content: bytes
    connect_timeout: float

    def to_httpx(self) -> httpx.Request:
        """The same request as httpx's (for a transport other than aiohttp)."""
        request = httpx.Request(
            self.method, _parse_origin(self.origin), headers=self.headers, content=self.content
        )
        timeout = {"connect": self.connect_timeout, "pool": self.connect_timeout}
        request.extensions = {"timeout": timeout, "target": self.target}
        return request


class Upstream:
    """Sends requests to upstreams through one pooled transport."""

    def __init__(self, transport: httpx.AsyncBaseTransport, connect_timeout: float) -> None:
        self.transport = transport
        # Only connect (and pool wait) is left to the transport; the relay keeps the other clocks.
        self._connect_timeout = connect_timeout
        self._aiohttp = transport if isinstance(transport, AiohttpTransport) else None

    def request(
        self,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        content: bytes,
        connect_timeout: float | None = None,
    ) -> UpstreamRequest:
        """A request for ``url`` (origin and target as the routing built it, target unparsed),
        with its own connect timeout when given (an upstream's or a route's)."""
        origin, target = _split_target(url)
        timeout = self._connect_timeout if connect_timeout is None else connect_timeout
        return UpstreamRequest(method, origin, target, headers, content, timeout)

    async def send(self, request: UpstreamRequest) -> httpx.Response:
        if self._aiohttp is None:
            return await self.transport.handle_async_request(request.to_httpx())
        connect = request.connect_timeout
        return await self._aiohttp.send(
            request.method,
            _aiohttp_url(_normal_origin(request.origin), request.target),
            httpx_head(request.method, request.origin, request.headers, request.content),
            request.content,
            _client_timeout(connect, connect),
        )

    async def aclose(self) -> None:
        await self.transport.aclose()


def create_upstream(
    transport: Literal["aiohttp", "httpx"],
    max_connections: int,
    connect_timeout: float,
    keepalive: float = 4.0,
) -> Upstream:
    """The upstream client; an idle connection is reused for ``keepalive`` seconds, then
    closed: before the upstream closes it (uvicorn's, vLLM's and Node's keep-alive is
    5 s), or a request written as it does fails, and a POST is never sent twice."""
    if transport == "aiohttp":
        return Upstream(AiohttpTransport(max_connections, keepalive), connect_timeout)
    limits = httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        keepalive_expiry=keepalive,
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
    that keeps sending gets its connection closed instead. A body aiohttp has
    already seen the end of has nothing left to read: no timer, no read.
    """
    body = getattr(read, "__self__", None)
    if isinstance(body, _AiohttpBody) and body.ended():
        return
    try:
        async with asyncio.timeout(0.05):
            while chunk := await read():
                budget -= len(chunk)
                if budget < 0:
                    return
    except (TimeoutError, httpx.TransportError, OSError):
        return


def send_failure(exc: BaseException) -> AttemptError:
    """What went wrong when ``Upstream.send`` raised, as the access log's ``error``.

    ``connect_*``: no connection (refused, DNS, TLS, timeout, pool wait).
    ``upstream_bad_response``: connected, but no valid answer came back (a
    malformed or oversized head, a close or reset before the head).
    """
    if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
        return AttemptError.CONNECT_TIMEOUT
    if isinstance(exc, httpx.ConnectError) or not isinstance(exc, httpx.TransportError):
        return AttemptError.CONNECT_ERROR
    return AttemptError.UPSTREAM_BAD_RESPONSE


async def close_quietly(response: httpx.Response) -> None:
    """Close a response; a broken upstream must not mask the verdict already reached."""
    with contextlib.suppress(Exception):
        await response.aclose()
