"""A minimal Starlette + aiohttp relay: the floor a Python ASGI relay costs here.

The ``minimal`` target of bench_gateway.py (issue 7's "Starlette + aiohttp client"
row): no guard, no metrics, no access log, no deadlines; it relays the upstream's
status, content type and body chunks as they come. It is a yardstick for the
gateway's own costs on the same machine and in the same run, not a product.

    python tests/perf/minimal_relay.py --upstream-port UP --port PORT [--raw]
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route


def build(upstream: str) -> Starlette:
    session: dict[str, aiohttp.ClientSession] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        session["s"] = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        yield
        await session["s"].close()

    async def ready(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def relay(request: Request) -> Response:
        body = await request.body()
        resp = await session["s"].request(
            request.method,
            upstream + request.url.path + ("?" + request.url.query if request.url.query else ""),
            data=body or None,
            headers={"content-type": request.headers.get("content-type", "application/json")},
        )

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.content.iter_any():
                    yield chunk
            finally:
                resp.release()

        return StreamingResponse(
            chunks(), status_code=resp.status, media_type=resp.headers.get("content-type")
        )

    return Starlette(
        routes=[
            Route("/readyz", ready),
            Route("/{path:path}", relay, methods=["GET", "POST"]),
        ],
        lifespan=lifespan,
    )


def build_raw(upstream: str):  # type: ignore[no-untyped-def]
    """The same relay as a bare ASGI callable (no Starlette layers)."""
    state: dict[str, aiohttp.ClientSession] = {}

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
                    state["s"] = aiohttp.ClientSession(connector=connector, auto_decompress=False)
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await state["s"].close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["path"] == "/readyz":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        query = scope["query_string"].decode()
        resp = await state["s"].request(
            scope["method"],
            upstream + scope["path"] + ("?" + query if query else ""),
            data=body or None,
            headers={"content-type": "application/json"},
        )
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": resp.status,
                    "headers": [(b"content-type", resp.headers["content-type"].encode())],
                }
            )
            read = resp.content.readany
            while chunk := await read():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            resp.release()

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--raw", action="store_true", help="a bare ASGI callable")
    opts = parser.parse_args()
    uvicorn.run(
        (build_raw if opts.raw else build)(f"http://127.0.0.1:{opts.upstream_port}"),
        host="127.0.0.1",
        port=opts.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        backlog=4096,
    )


if __name__ == "__main__":
    main()
