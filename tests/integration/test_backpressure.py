"""Backpressure: a slow client makes the upstream wait; the gateway's memory stays flat."""

from __future__ import annotations

import json
import socket
import time

import psutil

from tests import web
from tests.conftest import ServerThread, gateway_process

MiB = 1024 * 1024


def test_slow_client_keeps_gateway_memory_bounded(simulator: ServerThread) -> None:
    with gateway_process(
        ["--upstream", simulator.url + "/v1"], env={"GATEWAY_ACCESS_LOG": "false"}
    ) as gw:
        # warm up: imports, pools, first-request allocations
        for _ in range(3):
            web.post(
                gw.url + "/v1/chat/completions",
                json={"model": "m", "messages": [], "stream": True},
                timeout=10,
            )
        process = psutil.Process(gw.proc.pid)
        baseline = process.memory_info().rss
        body = json.dumps({"model": "m", "messages": [], "stream": True}).encode()
        # 200,000 deltas padded to ~1 KB each: the upstream could produce ~200 MB
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-ID: bp-1\r\n"
            "x-sim-tokens: 200000\r\nx-sim-chunk-bytes: 1000\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as conn:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            conn.connect(("127.0.0.1", gw.port))
            conn.sendall(head + body)
            received = 0
            peak = baseline
            deadline = time.monotonic() + 4.0
            while time.monotonic() < deadline:
                received += len(conn.recv(16 * 1024))
                time.sleep(0.01)
                peak = max(peak, process.memory_info().rss)
            sent = web.get(f"{simulator.url}/_sim/requests/bp-1").json()["bytes_sent"]
        growth = (peak - baseline) / MiB
        assert received > 100_000  # the client did get data
        # the upstream was held back: far less than the 200 MB it could have sent
        assert sent < 40 * MiB, f"upstream sent {sent / MiB:.1f} MiB"
        assert growth < 30, f"gateway RSS grew {growth:.1f} MiB"
