"""What the yardstick relays of bench_gateway.py share: their command line and server loop.

``splice_relay.py`` and ``push_relay.py`` are run as scripts with
``--upstream-port UP --port PORT``; each hands ``serve`` a function that,
given the running loop and the upstream's port, returns its client-side
protocol factory.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
from collections.abc import Callable

import uvloop

ProtocolFactory = Callable[[], asyncio.BaseProtocol]


def serve(make_factory: Callable[[asyncio.AbstractEventLoop, int], ProtocolFactory]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    opts = parser.parse_args()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        factory = make_factory(loop, opts.upstream_port)
        server = await loop.create_server(factory, "127.0.0.1", opts.port, backlog=4096)
        gc.freeze()  # as the gateway does after start-up
        await server.serve_forever()

    uvloop.run(run())
