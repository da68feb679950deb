"""A naive Responses WebSocket relay: the floor of the same libraries, nothing of the gateway.

The ``naive`` target of bench_websocket.py: Starlette's WebSocket route under uvicorn
(websockets-sansio, deflate off, as the gateway runs it) and the ``websockets``
client to the upstream, relaying text messages both ways as they come: no guard, no
metrics, no access log, no deadlines, no limits. A yardstick, not a product.

    python tests/perf/ws_naive_relay.py --upstream-port UP --port PORT
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed


def build(upstream: str) -> Starlette:
    async def ready(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def relay(client: WebSocket) -> None:
        async with connect(upstream, max_size=None, compression=None, proxy=None) as up:
            await client.accept()

            async def to_upstream() -> None:
                with contextlib.suppress(WebSocketDisconnect, ConnectionClosed):
                    while True:
                        await up.send(await client.receive_text())

            async def to_client() -> None:
                with contextlib.suppress(ConnectionClosed):
                    async for message in up:
                        await client.send_text(str(message))

            tasks = [asyncio.ensure_future(to_upstream()), asyncio.ensure_future(to_client())]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                task.cancel()
        with contextlib.suppress(Exception):
            await client.close()

    return Starlette(routes=[Route("/readyz", ready), WebSocketRoute("/v1/responses", relay)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = build(f"ws://127.0.0.1:{args.upstream_port}/v1/responses")
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        ws="websockets-sansio",
        ws_per_message_deflate=False,
        ws_max_size=16 * 1024 * 1024,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
