"""The upstream HTTP client: httpx's API over a transport chosen by measurement.

``aiohttp`` (the default) runs httpx requests over aiohttp's C-accelerated
HTTP parser and connection pool (the transport the ``openai`` SDK itself
offers); plain ``httpx`` is kept as a fallback. One client per gateway
process, created in the lifespan, closed at shutdown; connections are pooled.
"""

from __future__ import annotations

from typing import Literal

import httpx

__all__ = ["create_upstream_client", "upstream_timeout"]


def upstream_timeout(connect: float) -> httpx.Timeout:
    """Only connect (and pool wait) is left to the client; the relay keeps the other clocks."""
    return httpx.Timeout(connect=connect, read=None, write=None, pool=connect)


def create_upstream_client(
    transport: Literal["aiohttp", "httpx"], max_connections: int, connect_timeout: float
) -> httpx.AsyncClient:
    limits = httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        keepalive_expiry=30.0,
    )
    if transport == "aiohttp":
        import aiohttp
        from httpx_aiohttp import AiohttpTransport

        def session() -> aiohttp.ClientSession:
            connector = aiohttp.TCPConnector(
                limit=max_connections,
                limit_per_host=0,
                keepalive_timeout=30.0,
                enable_cleanup_closed=False,
            )
            return aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                trust_env=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )

        client = httpx.AsyncClient(
            transport=AiohttpTransport(client=session),
            timeout=upstream_timeout(connect_timeout),
            follow_redirects=False,
            trust_env=False,
        )
    else:
        client = httpx.AsyncClient(
            limits=limits,
            timeout=upstream_timeout(connect_timeout),
            follow_redirects=False,
            trust_env=False,
        )
    # No default headers of httpx's own (Accept-Encoding, User-Agent, ...): the
    # upstream sees the client's headers, filtered by the relay, and nothing else.
    client.headers = httpx.Headers()
    return client
