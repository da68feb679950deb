"""The harness's own promise: a server a test starts is the one it talks to.

``free_port()`` hands out a port that is free at that moment; another test's
server can take it before the server binds it. The harness then waits for the
port's listening socket to be the gateway process's own, and starts a gateway
process or an in-process server again on another port when its bind failed. A port
where nothing must listen (a dead upstream) is held bound instead, never listened on.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from tests import conftest, web
from tests.conftest import ServerThread, gateway_process, running

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def _always_ready(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A server that answers 200 to everything, /readyz included, and is not a gateway."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"not the gateway"})


@pytest.fixture
def squatter() -> Iterator[ServerThread]:
    with running(_always_ready, lifespan="off") as server:
        yield server


def test_a_port_another_server_took_first_is_not_mistaken_for_the_gateway(
    simulator: ServerThread, squatter: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = iter([squatter.port])
    fresh = conftest.free_port
    monkeypatch.setattr(conftest, "free_port", lambda: next(ports, None) or fresh())
    with gateway_process(["--upstream", simulator.url + "/v1"]) as gw:
        assert gw.port != squatter.port  # started again, on another port
        response = web.post(gw.url + "/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert b"outcome=complete" in response.content


def test_an_in_process_server_whose_port_was_taken_starts_on_another(
    squatter: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = iter([squatter.port])
    fresh = conftest.free_port
    monkeypatch.setattr(conftest, "free_port", lambda: next(ports, None) or fresh())
    with running(_always_ready, lifespan="off") as server:
        assert server.port != squatter.port
        assert web.get(server.url + "/anything").status_code == 200


def test_a_dead_port_refuses_connections_and_no_server_can_take_it(dead_port: int) -> None:
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", dead_port), timeout=5)
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server's bind does
        with pytest.raises(OSError, match="in use") as raised:
            other.bind(("127.0.0.1", dead_port))
    assert raised.value.errno == errno.EADDRINUSE
    with pytest.raises(RuntimeError, match="did not start"):  # uvicorn's bind fails the same
        ServerThread(_always_ready, port=dead_port, lifespan="off").start()
