"""What lets a test reach a state without sleeping for it.

- ``wait_until`` polls a condition with a generous, bounded deadline: generous
  because a loaded two-core machine is slow, bounded so that a broken gateway
  fails the test instead of hanging it.
- ``settled_metrics``: the gateway counts a request after its last byte is sent
  (after up to 50 ms reading the upstream's end, for a complete stream), so a
  scrape made as soon as the response arrived can miss it; this waits for it.
- ``access_log`` reads the access-log lines that a gateway running in this
  process printed (through pytest's ``capsys``), as they are flushed.
- ``gated_upstream``: a scripted chat-completions upstream whose answers stop at
  a gate that the test opens. A stream stays open, or an answer never starts,
  exactly until the test says so, instead of an upstream that sleeps for a while
  and a test that hopes to act inside that while.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests import web
from tests.conftest import running
from tests.integration.helpers import metric_value

T = TypeVar("T")

#: How long a test waits for a state that normally takes milliseconds.
WAIT_SECONDS = 30.0


def wait_until(check: Callable[[], T], what: str, timeout: float = WAIT_SECONDS) -> T:
    """Poll ``check`` until it returns a truthy value, and return that value."""
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(
                f"gave up after {timeout:.0f}s waiting for {what} (last: {last!r})"
            )
        time.sleep(0.02)


def settled_metrics(base_url: str, requests: float, timeout: float = WAIT_SECONDS) -> str:
    """The gateway's /metrics once it has counted ``requests`` finished proxied requests."""
    text = ""

    def counted() -> bool:
        nonlocal text
        text = web.get(base_url + "/metrics", timeout=10).text
        return metric_value(text, "gateway_requests_total") >= requests

    wait_until(counted, f"{requests:g} finished requests in the metrics", timeout)
    return text


def access_log(capsys: pytest.CaptureFixture[str], count: int) -> list[dict[str, Any]]:
    """The access-log lines (at least ``count``) of gateways started with ``access_log=True``."""
    out = ""

    def lines() -> list[dict[str, Any]] | None:
        nonlocal out
        out += capsys.readouterr().out
        found = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return found if len(found) >= count else None

    return wait_until(lines, f"{count} access-log line(s)")


class Gate:
    """Opened by the test (from any thread), awaited by an upstream handler (on its loop)."""

    def __init__(self) -> None:
        #: A handler has arrived at the gate (the gateway's request is in flight).
        self.reached = threading.Event()
        #: The handler has written the rest of its answer, after the gate.
        self.passed = threading.Event()
        self._lock = threading.Lock()
        self._open = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def open(self) -> None:
        with self._lock:
            self._open = True
            waiters, self._waiters = self._waiters, []
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop has already closed
                loop.call_soon_threadsafe(event.set)

    async def wait(self) -> None:
        event = asyncio.Event()
        with self._lock:
            if self._open:
                event.set()
            else:
                self._waiters.append((asyncio.get_running_loop(), event))
        self.reached.set()
        await event.wait()


FIRST_EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"hello"}}]}\n\n'
LAST_EVENTS = (
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
)


class GatedUpstream:
    """A chat-completions event stream, stopped at the gate named by ``x-gate``.

    Request headers: ``x-gate: NAME`` stops the answer at gate NAME (none: no stop);
    ``x-gate-at: headers`` stops before the response starts (an upstream that has
    not answered), otherwise it stops after the first event (a stream in
    progress); ``x-first-event-bytes: N`` pads the first event's text to N bytes.
    After the gate: a finish reason and ``[DONE]`` (a complete stream).
    """

    def __init__(self) -> None:
        self.url = ""
        self._gates: dict[str, Gate] = {}
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[Route("/v1/{path:path}", self._answer, methods=["GET", "HEAD", "POST"])]
        )

    def gate(self, name: str) -> Gate:
        with self._lock:
            return self._gates.setdefault(name, Gate())

    def open_all(self) -> None:
        with self._lock:
            gates = list(self._gates.values())
        for gate in gates:
            gate.open()

    async def _answer(self, request: Request) -> Response:
        await request.body()
        name = request.headers.get("x-gate")
        gate = self.gate(name) if name else None
        before_headers = request.headers.get("x-gate-at") == "headers"
        if gate is not None and before_headers:
            await gate.wait()
        first = FIRST_EVENT
        if pad := int(request.headers.get("x-first-event-bytes", "0")):
            first = first.replace(b"hello", b"x" * pad)

        async def body() -> AsyncIterator[bytes]:
            yield first
            if gate is not None and not before_headers:
                await gate.wait()
            yield LAST_EVENTS
            if gate is not None:
                gate.passed.set()

        return StreamingResponse(body(), headers={"content-type": "text/event-stream"})


@contextlib.contextmanager
def gated_upstream() -> Iterator[GatedUpstream]:
    """A ``GatedUpstream`` on a real uvicorn; every gate is opened before it stops."""
    upstream = GatedUpstream()
    with running(upstream.app) as server:
        upstream.url = server.url
        try:
            yield upstream
        finally:
            upstream.open_all()
