"""The aiohttp transport's direct path sends the bytes httpx's request API sends.

``Upstream.send`` skips ``httpx.Request`` on the aiohttp transport; the same
request through httpx's transport API (``handle_async_request`` of the
``httpx.Request`` it stands for) must reach the upstream byte for byte the
same: request line, every header in order, body. So must the transport's
own request class (the skip set built once) against aiohttp's.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from gateway.proxy.upstream import (
    AiohttpTransport,
    Upstream,
    chunk_reader,
    create_upstream,
    drain_for_reuse,
)
from tests.integration.raw_upstream import RawRequest, raw_upstream

_HEADERS = [
    (b"content-type", b"application/json"),
    (b"authorization", b"Bearer sk-test"),
    (b"x-custom", b"  spaced value "),
    (b"accept", b"text/event-stream"),
    (b"x-forwarded-for", b"10.0.0.1"),
    (b"x-request-id", b"rid-1"),
]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/chat/completions?a=%2F&b=1", b'{"model":"m","stream":true}'),
        ("POST", "/v1/embeddings", b""),
        ("GET", "/v1/models", b""),
        ("DELETE", "/v1/files/f%20x", b""),
    ],
)
def test_direct_and_httpx_api_send_the_same_bytes(method: str, path: str, body: bytes) -> None:
    async def both(url: str) -> None:
        upstream = create_upstream("aiohttp", 10, 5.0)
        try:
            for direct in (True, False):
                request = upstream.request(method, url + path, list(_HEADERS), body)
                if direct:
                    response = await upstream.send(request)
                else:
                    response = await upstream.transport.handle_async_request(request.to_httpx())
                await response.aread()
                await response.aclose()
        finally:
            await upstream.aclose()

    with raw_upstream() as up:
        asyncio.run(both(up.url))
        direct, via_httpx = up.requests
        assert isinstance(direct, RawRequest)
        assert direct.request_line == via_httpx.request_line
        assert direct.headers == via_httpx.headers
        assert direct.body == via_httpx.body == body
        assert direct.target == path.encode()


@pytest.mark.parametrize("body", [b'{"model":"m"}', b""])
def test_the_request_class_sends_what_aiohttp_own_sends(body: bytes) -> None:
    async def both(url: str) -> None:
        for request_class in (aiohttp.ClientRequest, None):
            transport = (
                AiohttpTransport(10, request_class=request_class)
                if request_class is not None
                else AiohttpTransport(10)
            )
            upstream = Upstream(transport, 5.0)
            try:
                # No content-type: aiohttp's body would bring its own unless skipped.
                headers = [h for h in _HEADERS if h[0] != b"content-type"]
                request = upstream.request("POST", url + "/v1/x", headers, body)
                response = await upstream.send(request)
                await response.aread()
                await response.aclose()
            finally:
                await upstream.aclose()

    with raw_upstream() as up:
        asyncio.run(both(up.url))
        theirs, ours = up.requests
        assert ours.request_line == theirs.request_line
        assert ours.headers == theirs.headers
        assert ours.body == theirs.body == body
        names = {k.lower() for k, _ in ours.headers}
        assert not names & {b"user-agent", b"accept-encoding", b"content-type"}


def test_a_body_read_to_its_end_is_not_drained() -> None:
    """drain_for_reuse skips a body aiohttp has the end of (nothing left to read), and
    still drains one whose end has not come yet."""

    async def go(url: str) -> None:
        upstream = create_upstream("aiohttp", 10, 5.0)
        try:
            response = await upstream.send(upstream.request("POST", url + "/v1/x", [], b"{}"))
            read = chunk_reader(response)
            body = read.__self__  # type: ignore[attr-defined]
            assert not body.ended()
            chunks = []
            while chunk := await read():
                chunks.append(chunk)
            assert b"".join(chunks).endswith(b"data: [DONE]\n\n")
            assert body.ended()
            await drain_for_reuse(read)
            assert await read() == b""
            await response.aclose()
        finally:
            await upstream.aclose()

    with raw_upstream() as up:
        asyncio.run(go(up.url))
