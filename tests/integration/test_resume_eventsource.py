"""A browser-style ``EventSource`` (the ``eventsource`` npm package) on the resume
endpoint: its connection cut twice in the middle of an event, it reconnects by
itself with ``Last-Event-ID`` and ends with every event once, in order."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from tests import web
from tests.conftest import ServerThread, free_port
from tests.integration.test_node_sdks import node_sdks  # noqa: F401 (a fixture)


class CuttingProxy:
    """127.0.0.1:port -> target; the first ``cuts`` connections are dropped after their
    answer's first ``after`` bytes (in the middle of an event), the next pass whole."""

    def __init__(self, target_port: int, cuts: int, after: int) -> None:
        self.target_port = target_port
        self.cuts = cuts
        self.after = after
        self.port = free_port()
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CuttingProxy:
        self._thread.start()
        assert self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", self.port)
        )
        self._started.set()
        self._loop.run_forever()
        server.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        limit = self.after if self.connections <= self.cuts else None
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def up() -> None:
            while chunk := await reader.read(65536):
                up_writer.write(chunk)
                await up_writer.drain()

        async def down() -> None:
            sent = 0
            while chunk := await up_reader.read(65536):
                if limit is not None and sent + len(chunk) >= limit:
                    writer.write(chunk[: limit - sent])
                    await writer.drain()
                    writer.transport.abort()
                    up_writer.transport.abort()
                    return
                sent += len(chunk)
                writer.write(chunk)
                await writer.drain()
            writer.close()

        tasks = [asyncio.create_task(up()), asyncio.create_task(down())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        writer.transport.abort()
        up_writer.transport.abort()


@pytest.fixture(scope="module")
def gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    routes = [{"name": "v1", "prefix": "/v1", "upstream": simulator.url + "/v1", "resume": True}]
    return {"routes": routes}


def test_eventsource_reconnects_with_last_event_id(
    node_sdks: Path,  # noqa: F811
    gateway: ServerThread,
) -> None:
    body = {"model": "sim-model", "messages": [], "stream": True}
    headers = {"x-sim-tokens": "150", "x-sim-tps": "30", "x-sim-seed": "9"}
    original: dict[str, Any] = {}
    with web.stream("POST", gateway.url + "/v1/chat/completions", json=body, headers=headers,
                    timeout=60) as live:  # fmt: skip
        stream_id = live.headers["x-gateway-stream-id"]
        reader = threading.Thread(target=lambda: original.setdefault("body", live.read()))
        reader.start()
        with CuttingProxy(gateway.port, cuts=2, after=1500) as proxy:
            url = f"http://127.0.0.1:{proxy.port}/v1/gateway/streams/{stream_id}?ids=1"
            result = subprocess.run(
                ["node", str(node_sdks / "eventsource.mjs"), url],
                cwd=node_sdks,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            connections = proxy.connections
        reader.join(60)
    assert result.returncode == 0, result.stderr[-2000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["error"] is None
    expected = [
        line[len(b"data: ") :].decode()
        for line in original["body"].split(b"\n")
        if line.startswith(b"data: ")
    ]
    assert got["data"] == expected  # every event once, in order
    assert got["ids"] == [str(n) for n in range(1, len(expected) + 1)]
    assert got["opens"] == 3, (got["opens"], connections, len(expected))
    assert connections >= 3  # two cut, then one whole (fetch may open a spare)
