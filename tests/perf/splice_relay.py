"""The floor of any Python relay here: a uvloop TCP splice, no HTTP, no ASGI.

The ``splice`` target of bench_gateway.py. Each client connection gets its own
upstream connection and bytes are copied both ways in ``data_received``
callbacks, with ``pause_reading``/``resume_reading`` for backpressure. It
parses nothing, so it is a lower bound for any relay written in Python on
this machine (one callback and one ``write`` per upstream read), not a product.

    python tests/perf/splice_relay.py --upstream-port UP --port PORT
"""

from __future__ import annotations

import asyncio

from floor_server import ProtocolFactory, serve


class _Half(asyncio.Protocol):
    """One side of a spliced pair: what it receives goes to ``peer``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Half | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        else:
            self.pending.append(data)

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


def client_factory(loop: asyncio.AbstractEventLoop, upstream_port: int) -> ProtocolFactory:
    connecting: set[asyncio.Task[None]] = set()

    def client_side() -> _Half:
        client = _Half()

        async def connect() -> None:
            _, upstream = await loop.create_connection(_Half, "127.0.0.1", upstream_port)
            upstream.peer, client.peer = client, upstream
            assert upstream.transport is not None
            for data in client.pending:
                upstream.transport.write(data)
            client.pending.clear()

        task = loop.create_task(connect())
        connecting.add(task)
        task.add_done_callback(connecting.discard)
        return client

    return client_side


if __name__ == "__main__":
    serve(client_factory)
