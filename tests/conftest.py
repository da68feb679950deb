"""Shared test fixtures: real uvicorn servers on free loopback ports."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerThread:
    """A real uvicorn server (uvloop + httptools) running an ASGI app in a thread."""

    def __init__(self, app: Any, **config: Any) -> None:
        self.port = free_port()
        options: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.port,
            "loop": "uvloop",
            "http": "httptools",
            "log_level": "warning",
            "access_log": False,
            "lifespan": "on",
            "timeout_graceful_shutdown": 2,
        }
        options.update(config)
        self.server = uvicorn.Server(uvicorn.Config(app, **options))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextlib.contextmanager
def running(app: Any, **config: Any) -> Iterator[ServerThread]:
    server = ServerThread(app, **config).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def simulator() -> Iterator[ServerThread]:
    from gateway.simulator import create_simulator_app

    with running(create_simulator_app()) as server:
        yield server
