"""max_websocket_connections: each open WebSocket holds an upstream socket, so the gateway
caps them, in all (503) and per named client (429); a closed connection frees its slot."""

from __future__ import annotations

import contextlib
import hashlib
import time
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as _ws_connect

from tests.conftest import ServerThread
from tests.integration.helpers import gateway_for, metric_value

pytestmark = pytest.mark.timeout(90)

KEY = "sk-ws-capped"
CLIENTS = [
    {
        "name": "team-ws",
        "key_sha256": [hashlib.sha256(KEY.encode()).hexdigest()],
        "max_websocket_connections": 1,
    },
    {"name": "team-other", "key_sha256": [hashlib.sha256(b"sk-ws-other").hexdigest()]},
]


def _connect(server: ServerThread, **options: Any) -> ClientConnection:
    return _ws_connect(f"ws://127.0.0.1:{server.port}/v1/responses", open_timeout=30, **options)


def _refused(server: ServerThread, **options: Any) -> tuple[int, bytes]:
    with pytest.raises(InvalidStatus) as raised:
        _connect(server, **options)
    return raised.value.response.status_code, raised.value.response.body or b""


def _until_admitted(server: ServerThread) -> ClientConnection:
    """A connection once a closed one's slot is free (its end is handled a moment later)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return _connect(server)
        except InvalidStatus:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_the_gateway_caps_its_websocket_connections(simulator: ServerThread) -> None:
    settings = {"limits": {"max_websocket_connections": 2}}
    with gateway_for(simulator.url + "/v1", **settings) as server, contextlib.ExitStack() as stack:
        first = stack.enter_context(_connect(server))
        stack.enter_context(_connect(server))
        status, body = _refused(server)
        assert status == 503
        assert b"websocket_connections" in body
        first.close()
        stack.enter_context(_until_admitted(server))
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert (
        metric_value(text, "gateway_rejected_requests_total", reason="websocket_connections") >= 1
    )


def test_a_client_is_capped_at_its_own_websocket_connections(simulator: ServerThread) -> None:
    auth = {"additional_headers": {"Authorization": f"Bearer {KEY}"}}
    with gateway_for(simulator.url + "/v1", clients=CLIENTS) as server:
        with _connect(server, **auth):
            status, body = _refused(server, **auth)
            assert status == 429
            assert b"max_websocket_connections" in body
            # another client is not held to this client's cap
            with _connect(server, additional_headers={"Authorization": "Bearer sk-ws-other"}):
                pass
        deadline = time.monotonic() + 30
        statuses = []
        while True:  # its slot is free once the gateway has handled the close
            try:
                with _connect(server, **auth):
                    break
            except InvalidStatus as refused:
                statuses.append(refused.response.status_code)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert set(statuses) <= {429}
