"""The client edge (gateway/server/edge.py), driven with raw sockets against a real gateway.

A recording upstream proves what reached it (or that nothing did); the gateway
runs with short client timeouts so that the 408 paths are quick to reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import io
import json
import logging
import multiprocessing
import select
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.proxy.connection import abort_connection, watch_connection
from gateway.server.edge import uvicorn_options
from gateway.settings import Settings
from tests import web
from tests.conftest import ServerThread, gateway_process, running
from tests.integration.helpers import access_log_line, access_log_until, gateway_for, metric_value

CLIENT_TIMEOUT = 1.0  # timeouts.client_header and timeouts.client_body of the gateway here
DEADLINE = 15.0  # bound on every wait for the gateway to answer or close


class Recorder:
    """An upstream that records every request it gets and answers a small JSON body."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.requests.append(
            {
                "method": scope["method"],
                "path": scope["path"],
                "headers": [(k.decode(), v.decode()) for k, v in scope["headers"]],
                "body": body,
            }
        )
        payload = b'{"ok":true}'
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[ServerThread, Recorder]]:
    recorder = Recorder()
    with running(recorder, lifespan="off") as server:
        yield server, recorder


@pytest.fixture
def recorder(upstream: tuple[ServerThread, Recorder]) -> Recorder:
    upstream[1].requests.clear()
    return upstream[1]


@pytest.fixture(scope="module")
def gateway_settings(upstream: tuple[ServerThread, Recorder]) -> dict[str, Any]:
    timeouts = {"client_header": CLIENT_TIMEOUT, "client_body": CLIENT_TIMEOUT}
    return {"upstream_url": upstream[0].url + "/v1", "timeouts": timeouts}


# ------------------------------------------------------------------ raw-socket helpers


def _connect(server: ServerThread) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=DEADLINE)


def _read_until_closed(sock: socket.socket) -> bytes:
    """All the gateway sends until it closes the connection (fails after DEADLINE)."""
    chunks: list[bytes] = []
    end = time.monotonic() + DEADLINE
    while True:
        sock.settimeout(max(0.01, end - time.monotonic()))
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            break
        except TimeoutError:
            raise AssertionError(f"still open; got {b''.join(chunks)[:300]!r}") from None
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


def _read_until(sock: socket.socket, marker: bytes, count: int = 1) -> bytes:
    data = b""
    end = time.monotonic() + DEADLINE
    while data.count(marker) < count:
        sock.settimeout(max(0.01, end - time.monotonic()))
        chunk = sock.recv(65536)
        assert chunk, f"closed before {marker!r}; got {data!r}"
        data += chunk
    return data


def _exchange(server: ServerThread, request: bytes) -> bytes:
    """Send ``request`` whole (the gateway may stop reading early), read until closed."""
    with _connect(server) as sock:
        # Refused before it was all sent? The answer is still there to read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        return _read_until_closed(sock)


class _Wire(io.BytesIO):
    """Received bytes as http.client's socket: responses are read from it one by one."""

    def makefile(self, *args: Any, **kwargs: Any) -> io.BytesIO:
        return self

    def close(self) -> None:  # http.client closes the file after each response
        pass


def _responses(raw: bytes, count: int = 1) -> list[http.client.HTTPResponse]:
    """The first ``count`` HTTP responses in ``raw``, bodies read."""
    wire = _Wire(raw)
    responses = []
    for _ in range(count):
        response = http.client.HTTPResponse(wire)  # type: ignore[arg-type]
        response.begin()
        response.body = response.read()  # type: ignore[attr-defined]
        responses.append(response)
    return responses


def _assert_refusal(raw: bytes, status: int, code: str) -> http.client.HTTPResponse:
    (response,) = _responses(raw)
    assert response.status == status, raw[:300]
    assert response.getheader("content-type") == "application/json"
    assert response.getheader("connection") == "close"
    assert response.getheader("x-request-id")
    error = json.loads(response.body)["error"]  # type: ignore[attr-defined]
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"
    return response


def _rejected(server: ServerThread, reason: str) -> float:
    text = web.get(server.url + "/metrics").text
    return metric_value(text, "gateway_rejected_requests_total", reason=reason)


def _refused_once(
    server: ServerThread, recorder: Recorder, request: bytes, status: int, reason: str
) -> http.client.HTTPResponse:
    """``request`` gets the refusal, is counted once, and nothing of it reaches the upstream."""
    before = _rejected(server, reason)
    response = _assert_refusal(_exchange(server, request), status, reason)
    assert recorder.requests == []
    assert _rejected(server, reason) == before + 1
    return response


def _post(path: bytes, body: bytes, *headers: bytes) -> bytes:
    lines = [b"POST " + path + b" HTTP/1.1", b"Host: gw", b"Content-Type: application/json"]
    lines += [b"Content-Length: %d" % len(body), *headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


BODY = b'{"model":"m","messages":[]}'


# ------------------------------------------------------------------ head limits


def test_a_head_over_max_header_bytes_gets_431_and_reaches_nothing(
    gateway: ServerThread, recorder: Recorder
) -> None:
    request = _post(b"/v1/chat/completions", BODY, b"X-Big: " + b"a" * 40_000)
    _refused_once(gateway, recorder, request, 431, "header_too_large")


def test_a_head_is_cut_off_at_the_limit_as_its_bytes_arrive(
    gateway: ServerThread, recorder: Recorder
) -> None:
    # One header line that never ends: no field completes, so only counting the
    # bytes as they arrive can refuse it; the gateway answers while the client
    # still holds the rest (and long before the head timeout would give a 408).
    with _connect(gateway) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nX-Endless: " + b"a" * 40_000)
        _assert_refusal(_read_until_closed(sock), 431, "header_too_large")
    assert recorder.requests == []


def test_more_than_max_header_fields_gets_431(gateway: ServerThread, recorder: Recorder) -> None:
    fields = [b"X-F%d: v" % i for i in range(101)]
    _assert_refusal(_exchange(gateway, _post(b"/v1/x", BODY, *fields)), 431, "header_too_large")
    # The 2.7 MB head of 200,000 fields: refused at the limit, not parsed whole.
    huge = _post(b"/v1/x", BODY, *[b"X-Fld: %06d" % i for i in range(200_000)])
    assert len(huge) > 2_700_000
    _assert_refusal(_exchange(gateway, huge), 431, "header_too_large")
    assert recorder.requests == []


def test_a_head_just_inside_both_limits_is_forwarded(
    gateway: ServerThread, recorder: Recorder
) -> None:
    # 3 fields of the request helper + 97 here = 100 fields, about 31 KiB
    fields = [b"X-F%02d: " % i + b"v" * 315 for i in range(96)] + [b"Connection: close"]
    request = _post(b"/v1/chat/completions", BODY, *fields)
    assert 30_000 < len(request) < 32_768
    (response,) = _responses(_exchange(gateway, request))
    assert response.status == 200
    assert [r["body"] for r in recorder.requests] == [BODY]
    assert dict(recorder.requests[0]["headers"])["x-f95"] == "v" * 315


def test_the_limits_come_from_the_settings(upstream: tuple[ServerThread, Recorder]) -> None:
    limits = {"max_header_fields": 5, "max_header_bytes": 1024}
    with gateway_for(upstream[0].url + "/v1", limits=limits) as gw:
        ok = _post(b"/v1/x", BODY, b"X-A: 1", b"Connection: close")  # 5 fields
        assert _responses(_exchange(gw, ok))[0].status == 200
        six = _post(b"/v1/x", BODY, b"X-A: 1", b"X-B: 2", b"Connection: close")
        _assert_refusal(_exchange(gw, six), 431, "header_too_large")
        long = _post(b"/v1/x", BODY, b"X-A: " + b"a" * 1024)
        _assert_refusal(_exchange(gw, long), 431, "header_too_large")
        assert _rejected(gw, "header_too_large") == 2


@pytest.mark.parametrize(
    "setting",
    [
        {"limits": {"max_header_bytes": 0}},
        {"limits": {"max_header_fields": 0}},
        {"timeouts": {"client_header": 0}},
        {"timeouts": {"client_body": -1}},
        {"timeouts": {"client_keepalive": 0}},
    ],
)
def test_the_edge_settings_must_be_positive(setting: dict[str, dict[str, int]]) -> None:
    ((section, values),) = setting.items()
    with pytest.raises(ValidationError, match=f"{section}.{next(iter(values))}"):
        Settings(**setting)  # type: ignore[arg-type]


def _flood(port: int, connections: int, head: bytes, running_for: float) -> None:
    """``connections`` clients, 20 at a time, each sending ``head`` and reading the answer."""

    async def one(gate: asyncio.Semaphore, end: float) -> None:
        async with gate:
            if time.monotonic() > end:
                return
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port), 5
                )
            except (OSError, TimeoutError):
                return
            try:
                writer.write(head)
                await asyncio.wait_for(writer.drain(), 5)
                await asyncio.wait_for(reader.read(), 5)
            except (OSError, TimeoutError):
                pass
            finally:
                writer.close()

    async def main() -> None:
        gate = asyncio.Semaphore(20)
        end = time.monotonic() + running_for
        await asyncio.gather(*(one(gate, end) for _ in range(connections)))

    asyncio.run(main())


def test_a_flood_of_oversized_heads_does_not_delay_a_concurrent_request(
    upstream: tuple[ServerThread, Recorder],
) -> None:
    # 200 connections, each a 256 KiB head of 32,768 small fields (parsed whole,
    # each would hold the event loop for a long while). The gateway, the flood and
    # the measuring client are three processes, so only the gateway's own delay
    # shows (threads of one process would share its interpreter lock).
    server, recorder = upstream
    recorder.requests.clear()
    head = b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n" + b"X-F: v\r\n" * 32_768 + b"\r\n"
    with (
        gateway_process(["--upstream", server.url + "/v1"], {"GATEWAY_ACCESS_LOG": "false"}) as gw,
        web.client(base_url=gw.url) as client,
    ):

        def latency() -> float:
            started = time.perf_counter()
            assert client.get("/healthz").status_code == 200
            return time.perf_counter() - started

        for _ in range(5):
            latency()
        baseline = [latency() for _ in range(40)]
        flood = multiprocessing.get_context("spawn").Process(
            target=_flood, args=(gw.port, 200, head, 20.0)
        )
        flood.start()
        during: list[float] = []
        try:
            while flood.is_alive():
                during.append(latency())
        finally:
            flood.join(60)
    # Both measured here, on this machine, now: the flood may add at most 50 ms.
    assert len(during) >= 10, "the flood ended before it could be measured"
    assert statistics.median(during) < statistics.median(baseline) + 0.050, (baseline, during)
    assert _quantile(during, 0.9) < _quantile(baseline, 0.9) + 0.050, (baseline, during)
    assert recorder.requests == []


def _quantile(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


# ------------------------------------------------------------------ client timeouts


def test_a_head_sent_a_byte_at_a_time_is_dropped_with_408(
    gateway: ServerThread, recorder: Recorder
) -> None:
    before = _rejected(gateway, "client_timeout")
    request = _post(b"/v1/chat/completions", BODY)
    with _connect(gateway) as sock:
        # The slow client's own pace (a byte per 0.1 s); the loop waits on the
        # gateway's answer, which must come before the head is all there.
        for byte in request:
            sock.sendall(bytes([byte]))
            readable, _, _ = select.select([sock], [], [], 0.1)
            if readable:
                break
        else:
            raise AssertionError("the whole head arrived: the client was not too slow")
        _assert_refusal(_read_until_closed(sock), 408, "client_timeout")
    assert recorder.requests == []
    assert _rejected(gateway, "client_timeout") == before + 1


def test_blank_lines_after_a_request_are_timed_like_a_head(gateway: ServerThread) -> None:
    """The parser skips blank lines between requests: they hold no connection open."""
    before = _rejected(gateway, "client_timeout")
    with _connect(gateway) as sock:
        sock.sendall(_post(b"/v1/chat/completions", BODY))
        _read_until(sock, b'{"ok":true}')
        sock.sendall(b"\r\n")
        assert _read_until_closed(sock) == b""  # nothing of a request came: no answer
    assert _rejected(gateway, "client_timeout") == before + 1


def test_a_connection_that_sends_nothing_is_closed(gateway: ServerThread) -> None:
    before = _rejected(gateway, "client_timeout")
    with _connect(gateway) as sock:
        assert _read_until_closed(sock) == b""  # no request, so no answer either
    assert _rejected(gateway, "client_timeout") == before + 1


def test_a_stalled_body_is_dropped_with_408_and_nothing_is_forwarded(
    gateway: ServerThread, recorder: Recorder
) -> None:
    before = _rejected(gateway, "client_timeout")
    request = _post(b"/v1/chat/completions", BODY + b" " * 100)
    with _connect(gateway) as sock:
        sock.sendall(request[:-50])
        _assert_refusal(_read_until_closed(sock), 408, "client_timeout")
    assert recorder.requests == []
    assert _rejected(gateway, "client_timeout") == before + 1


def test_a_slow_body_with_short_gaps_is_not_a_timeout(
    gateway: ServerThread, recorder: Recorder
) -> None:
    # Gaps of 0.2 s, a whole body of about 2 s: the limit is on the gap, not the total.
    request = _post(b"/v1/chat/completions", BODY + b" " * 9, b"Connection: close")
    head, body = request[:-10], request[-10:]
    with _connect(gateway) as sock:
        sock.sendall(head)
        for byte in body:
            readable, _, _ = select.select([sock], [], [], 0.2)
            assert not readable, sock.recv(1000)
            sock.sendall(bytes([byte]))
        (response,) = _responses(_read_until_closed(sock))
    assert response.status == 200
    assert [r["body"] for r in recorder.requests] == [BODY + b" " * 9]


def test_keep_alive_and_pipelining_are_unchanged(gateway: ServerThread, recorder: Recorder) -> None:
    request = _post(b"/v1/chat/completions", BODY)
    with _connect(gateway) as sock:
        sock.sendall(request + request)  # pipelined
        two = _read_until(sock, b'{"ok":true}', count=2)
        assert [r.status for r in _responses(two, 2)] == [200, 200]
        # Idle for longer than the head timeout: a kept-alive connection between
        # requests is timed by timeouts.client_keepalive, not as a slow head. The
        # sleep is the duration under test, not a wait for some state.
        time.sleep(CLIENT_TIMEOUT * 1.5)
        sock.sendall(_post(b"/v1/chat/completions", BODY, b"Connection: close"))
        (response,) = _responses(_read_until_closed(sock))
    assert response.status == 200
    assert len(recorder.requests) == 3


def test_an_idle_connection_outlives_the_sdks_reuse_window(
    gateway: ServerThread, recorder: Recorder
) -> None:
    """The httpx-based SDKs reuse an idle connection for 5 s: the gateway keeps one open
    longer (``timeouts.client_keepalive``, 75 s), so the client always closes first and a
    request it writes at 4.99 s never meets the gateway's close (uvicorn's own 5 s did)."""
    with _connect(gateway) as sock:
        sock.sendall(_post(b"/v1/chat/completions", BODY))
        _read_until(sock, b'{"ok":true}')
        # The duration under test: no close (no readable end of stream) for 6 s.
        readable, _, _ = select.select([sock], [], [], 6.0)
        assert not readable, sock.recv(1000)
        sock.sendall(_post(b"/v1/chat/completions", BODY, b"Connection: close"))
        (response,) = _responses(_read_until_closed(sock))
    assert response.status == 200


def test_an_idle_connection_is_closed_after_client_keepalive(
    upstream: tuple[ServerThread, Recorder],
) -> None:
    with gateway_for(upstream[0].url + "/v1", timeouts={"client_keepalive": 0.5}) as gw:
        with _connect(gw) as sock:
            sock.sendall(_post(b"/v1/chat/completions", BODY))
            answered = _read_until(sock, b'{"ok":true}')
            # closed quietly, with nothing more sent: no request was in flight
            assert _read_until_closed(sock) == b""
        assert _responses(answered)[0].status == 200
        assert _rejected(gw, "client_timeout") == 0  # an idle close is no refusal


def test_a_refusal_behind_a_pipelined_request_waits_for_its_response(
    gateway: ServerThread, recorder: Recorder
) -> None:
    good = _post(b"/v1/chat/completions", BODY)
    bad = _post(b"/v1/chat/completions", BODY, b"X-Big: " + b"a" * 40_000)
    raw = _exchange(gateway, good + bad)
    first, second = _responses(raw, 2)
    assert first.status == 200
    assert first.body == b'{"ok":true}'  # type: ignore[attr-defined]
    assert second.status == 431
    assert [r["body"] for r in recorder.requests] == [BODY]


# ------------------------------------------------------------------ what is never forwarded


def test_request_trailers_are_never_forwarded_as_headers(
    gateway: ServerThread, recorder: Recorder
) -> None:
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nTrailer: X-Trailer-Secret\r\nConnection: close\r\n\r\n"
        + b"%x\r\n" % len(BODY)
        + BODY
        + b"\r\n0\r\nX-Trailer-Secret: leak\r\n\r\n"
    )
    (response,) = _responses(_exchange(gateway, request))
    assert response.status == 200
    (forwarded,) = recorder.requests
    assert forwarded["body"] == BODY
    names = {name for name, _ in forwarded["headers"]}
    assert "x-trailer-secret" not in names
    assert "leak" not in {value for _, value in forwarded["headers"]}


def test_oversized_trailers_get_431_and_nothing_is_forwarded(
    gateway: ServerThread, recorder: Recorder
) -> None:
    # A trailer that never ends, longer than a read: counting on arrival cuts it
    # off (a field that never completes is otherwise held until the body timeout).
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n" % len(BODY)
        + BODY
        + b"\r\n0\r\nX-Endless: "
        + b"a" * 600_000
    )
    _assert_refusal(_exchange(gateway, request), 431, "header_too_large")
    assert recorder.requests == []


def test_expect_100_continue_is_answered_by_the_gateway_and_not_forwarded(
    gateway: ServerThread, recorder: Recorder
) -> None:
    request = _post(b"/v1/chat/completions", BODY, b"Expect: 100-continue", b"Connection: close")
    head, body = request[: -len(BODY)], request[-len(BODY) :]
    with _connect(gateway) as sock:
        sock.sendall(head)
        assert _read_until(sock, b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        (response,) = _responses(_read_until_closed(sock))
    # The gateway's first-byte timeout is 300 s: this answer came from the upstream.
    assert response.status == 200
    (forwarded,) = recorder.requests
    assert forwarded["body"] == BODY
    assert "expect" not in {name for name, _ in forwarded["headers"]}


@pytest.mark.parametrize(
    "request_line",
    [
        b"CONNECT example.com:443 HTTP/1.1",
        b"CONNECT /v1/chat/completions HTTP/1.1",
        b"TRACE /v1/models HTTP/1.1",
    ],
)
def test_connect_and_trace_get_405_and_reach_nothing(
    gateway: ServerThread, recorder: Recorder, request_line: bytes
) -> None:
    request = request_line + b"\r\nHost: example.com:443\r\n\r\n"
    response = _refused_once(gateway, recorder, request, 405, "method_not_allowed")
    assert "POST" in (response.getheader("allow") or "")


NOT_HTTP = {
    "garbage": b"garbage garbage\r\n\r\n",
    "control_bytes": b"\x00\x01\x02\r\n\r\n",
    "unknown_version": b"GET /v1/models HTTP/9.9\r\nHost: gw\r\n\r\n",
    "bare_lf": b"GET /v1/models HTTP/1.1\nHost: gw\n\n",
    "bad_chunk_size": b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
}


@pytest.mark.parametrize("raw", NOT_HTTP.values(), ids=NOT_HTTP.keys())
def test_what_is_not_http_gets_the_gateways_400_and_reaches_nothing(
    gateway: ServerThread, recorder: Recorder, raw: bytes
) -> None:
    _refused_once(gateway, recorder, raw, 400, "invalid_http")


def test_what_is_not_http_behind_a_pipelined_request_waits_for_its_response(
    gateway: ServerThread, recorder: Recorder
) -> None:
    first, refusal = _responses(
        _exchange(gateway, _post(b"/v1/chat/completions", BODY) + NOT_HTTP["garbage"]), 2
    )
    assert (first.status, json.loads(first.body)) == (200, {"ok": True})  # type: ignore[attr-defined]
    assert refusal.status == 400
    assert json.loads(refusal.body)["error"]["code"] == "invalid_http"  # type: ignore[attr-defined]
    assert len(recorder.requests) == 1


def test_an_upgrade_is_an_ordinary_request_and_the_connection_goes_on(
    gateway: ServerThread, recorder: Recorder
) -> None:
    """An Upgrade other than to a WebSocket (the Responses WebSocket mode has its own
    tests, tests/integration/test_websocket.py) is served as an ordinary request."""
    upgrade = b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
    after = _post(b"/v1/chat/completions", BODY, b"Connection: close")
    first, second = _responses(_exchange(gateway, upgrade + after), 2)
    assert (first.status, second.status) == (200, 200)
    assert [r["method"] for r in recorder.requests] == ["GET", "POST"]
    assert "upgrade" not in {name for name, _ in recorder.requests[0]["headers"]}


# ------------------------------------------------------------------ the access log


@pytest.fixture(scope="module")
def logged(upstream: tuple[ServerThread, Recorder]) -> Iterator[ServerThread]:
    """The edge's gateway with its access log on (lines read from stdout with capsys)."""
    timeouts = {"client_header": CLIENT_TIMEOUT, "client_body": CLIENT_TIMEOUT}
    with gateway_for(upstream[0].url + "/v1", timeouts=timeouts, access_log=True) as server:
        yield server


@pytest.mark.parametrize(
    ("request_bytes", "status", "reason", "expected"),
    [
        pytest.param(
            _post(
                b"/v1/chat/completions?api-version=1",
                BODY,
                b"X-Request-Id: edge-431",
                b"User-Agent: probe/1",
                b"X-Big: " + b"a" * 40_000,
            ),
            431,
            "header_too_large",
            {"route": "default", "method": "POST", "path": "/v1/chat/completions", "agent": True},
            id="header_too_large",
        ),
        pytest.param(
            b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n"
            b"X-Request-Id: edge-405\r\nUser-Agent: probe/1\r\n\r\n",
            405,
            "method_not_allowed",
            {"route": None, "method": "CONNECT", "path": "example.com:443", "agent": True},
            id="method_not_allowed",
        ),
        pytest.param(
            _post(
                b"/elsewhere/%7Eme",
                BODY,
                b"X-Request-Id: edge-431-no-route",
                b"User-Agent: probe/1",
                *(b"X-Field-%d: v" % i for i in range(200)),
            ),
            431,
            "header_too_large",
            {"route": None, "method": "POST", "path": "/elsewhere/~me", "agent": True},
            id="under_no_route",
        ),
        pytest.param(
            b"GET http://elsewhere.example/v1/models?x=1 HTTP/1.1\r\n"
            b"X-Request-Id: edge-431-absolute\r\nUser-Agent: probe/1\r\n"
            + b"".join(b"X-Field-%d: v\r\n" % i for i in range(200))
            + b"\r\n",
            431,
            "header_too_large",
            # an absolute-form target: its path, as the app would have routed it
            {"route": "default", "method": "GET", "path": "/v1/models", "agent": True},
            id="an_absolute_target",
        ),
        pytest.param(
            NOT_HTTP["garbage"],
            400,
            "invalid_http",
            {"route": None, "method": None, "path": None},
            id="not_http",
        ),
        pytest.param(
            b"POST /v1/chat/completions HTTP/1.1\r\nX-Request-Id: edge-chunk\r\n"
            b"User-Agent: probe/1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{}{}{\r\nzz\r\n",
            400,
            "invalid_http",
            # the app had this one: it is logged by its request, as the edge refused it
            {"route": "default", "method": "POST", "path": "/v1/chat/completions", "agent": True},
            id="a_bad_chunk_in_the_body",
        ),
        pytest.param(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5\r\n{}{}{\r\nzz\r\n",
            400,
            "invalid_http",
            # no id of the client's: the edge's answer and the app's line still share one
            {"route": "default", "method": "POST", "path": "/v1/chat/completions"},
            id="a_bad_chunk_in_the_body_without_an_id",
        ),
        pytest.param(
            b"GET /v1/" + b"m" * 40_000 + b" HTTP/1.1\r\nX-Request-Id: edge-431-url\r\n"
            b"User-Agent: probe/1\r\n\r\n",
            431,
            "header_too_large",
            # cut off in its target: its fields never came (the request id is the gateway's)
            {"route": "default", "method": "GET", "path": "/v1/" + "m" * 252 + "...(cut)"},
            id="a_long_target",
        ),
    ],
)
def test_a_refusal_at_the_edge_gets_an_access_log_line(
    logged: ServerThread,
    recorder: Recorder,
    capsys: pytest.CaptureFixture[str],
    request_bytes: bytes,
    status: int,
    reason: str,
    expected: dict[str, Any],
) -> None:
    response = _assert_refusal(_exchange(logged, request_bytes), status, reason)
    request_id = response.getheader("x-request-id")
    assert request_id is not None
    expected = dict(expected)
    agent = expected.pop("agent", False)  # its fields arrived: the client's id and agent
    assert request_id.startswith("edge-") is agent
    entry = access_log_line(capsys, request_id)
    assert {key: entry[key] for key in expected} == expected
    assert (entry["status"], entry["rejected"]) == (status, reason)
    assert entry["user_agent"] == ("probe/1" if agent else None)
    assert entry["client"] == "127.0.0.1"
    assert (entry["upstream"], entry["attempts"], entry["bytes_in"]) == (None, [], 0)
    assert recorder.requests == []


def test_a_slow_head_is_logged_with_what_of_it_arrived(
    logged: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    # The parser hands over a field once the next line begins (it may be folded): the
    # request id is not the last field.
    head = _post(b"/v1/chat/completions", BODY, b"X-Request-Id: edge-slow-head", b"X-Last: 1")
    with _connect(logged) as sock:
        sock.sendall(head[: head.index(b"\r\n\r\n") + 2])  # all but the blank line
        _assert_refusal(_read_until_closed(sock), 408, "client_timeout")
    entry = access_log_line(capsys, "edge-slow-head")
    assert (entry["status"], entry["rejected"]) == (408, "client_timeout")
    assert (entry["route"], entry["method"], entry["path"]) == (
        "default",
        "POST",
        "/v1/chat/completions",
    )
    # how long the client held the head open: at least the timeout it ran into
    assert entry["duration_ms"] >= CLIENT_TIMEOUT * 1000


def test_a_head_cut_before_its_method_is_logged_without_one(
    logged: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    with _connect(logged) as sock:
        sock.sendall(b"PO")
        response = _assert_refusal(_read_until_closed(sock), 408, "client_timeout")
    request_id = response.getheader("x-request-id")
    assert request_id is not None
    entry = access_log_line(capsys, request_id)
    assert (entry["route"], entry["method"], entry["path"]) == (None, None, None)
    assert (entry["status"], entry["rejected"]) == (408, "client_timeout")


def test_a_stalled_body_is_logged_once_as_the_edge_refused_it(
    logged: ServerThread, recorder: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    """The app had this request: its line says 408 client_timeout, not a client gone (499)."""
    request = _post(b"/v1/chat/completions", BODY + b" " * 100, b"X-Request-Id: edge-stalled")
    with _connect(logged) as sock:
        sock.sendall(request[:-50])
        _assert_refusal(_read_until_closed(sock), 408, "client_timeout")
    # A request after it: by the time its line is there, the stalled one's (one) line is too.
    later = _post(b"/v1/chat/completions", BODY, b"X-Request-Id: after", b"Connection: close")
    assert _responses(_exchange(logged, later))[0].status == 200
    lines = access_log_until(capsys, "after")
    (entry,) = (line for line in lines if line["request_id"] == "edge-stalled")
    assert (entry["status"], entry["rejected"]) == (408, "client_timeout")
    assert (entry["route"], entry["method"]) == ("default", "POST")
    assert [r["body"] for r in recorder.requests] == [BODY]  # only the later one
    text = web.get(logged.url + "/metrics").text
    assert metric_value(text, "gateway_requests_total", code="408") == 1
    assert metric_value(text, "gateway_requests_total", code="499") == 0


def test_blank_lines_over_the_limit_after_a_request_are_not_that_request(
    logged: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused as a head over the limit, they were answered and logged (a second time)
    with the request before them: its request id, method and path."""
    before = _rejected(logged, "header_too_large")
    with _connect(logged) as sock:
        sock.sendall(_post(b"/v1/chat/completions", BODY, b"X-Request-Id: blank-first"))
        _read_until(sock, b'{"ok":true}')
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"\r\n" * 20_000)  # more than limits.max_header_bytes
        assert _read_until_closed(sock) == b""  # nothing of a request came: no answer
    assert _rejected(logged, "header_too_large") == before + 1
    later = _post(b"/v1/chat/completions", BODY, b"X-Request-Id: blank-after", b"Connection: close")
    assert _responses(_exchange(logged, later))[0].status == 200
    lines = access_log_until(capsys, "blank-after")
    assert [line["status"] for line in lines if line["request_id"] == "blank-first"] == [200]


CHUNKED_GARBAGE = b"Transfer-Encoding: chunked\r\n\r\n5\r\n{}{}{\r\nzz\r\n"  # a bad chunk size


def test_a_bad_chunk_in_a_queued_request_is_logged_by_the_edge(
    logged: ServerThread, recorder: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pipelined behind a response, the refused request never reaches the app: its line
    is the edge's, once."""
    first = _post(b"/v1/chat/completions", BODY, b"X-Request-Id: queued-first")
    second = (
        b"POST /v1/chat/completions HTTP/1.1\r\nX-Request-Id: queued-second\r\n"
        b"User-Agent: probe/1\r\n" + CHUNKED_GARBAGE
    )
    before = _rejected(logged, "invalid_http")
    answered, refusal = _responses(_exchange(logged, first + second), 2)
    assert (answered.status, refusal.status) == (200, 400)
    assert refusal.getheader("x-request-id") == "queued-second"
    later = _post(
        b"/v1/chat/completions", BODY, b"X-Request-Id: queued-after", b"Connection: close"
    )
    assert _responses(_exchange(logged, later))[0].status == 200
    lines = access_log_until(capsys, "queued-after")
    (entry,) = (line for line in lines if line["request_id"] == "queued-second")
    assert (entry["status"], entry["rejected"]) == (400, "invalid_http")
    assert (entry["route"], entry["method"], entry["path"]) == (
        "default",
        "POST",
        "/v1/chat/completions",
    )
    assert entry["user_agent"] == "probe/1"
    (entry,) = (line for line in lines if line["request_id"] == "queued-first")
    assert (entry["status"], entry["rejected"]) == (200, None)
    assert _rejected(logged, "invalid_http") == before + 1
    assert [r["body"] for r in recorder.requests] == [BODY, BODY]  # the first and the later


def test_a_queued_refusal_is_not_taken_for_the_request_in_flight(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The request in flight ends when its client leaves: a 499, not the refusal of the
    request pipelined behind it (they share the connection, not the refusal)."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)  # the upstream: accepts, never answers
        hole.settimeout(DEADLINE)
        upstream_url = f"http://127.0.0.1:{hole.getsockname()[1]}/v1"
        with gateway_for(upstream_url, access_log=True) as server:
            first = _post(b"/v1/chat/completions", BODY, b"X-Request-Id: inflight-first")
            second = b"POST /v1/chat/completions HTTP/1.1\r\nX-Request-Id: inflight-second\r\n"
            with _connect(server) as sock:
                sock.sendall(first + second + CHUNKED_GARBAGE)
                upstream, _ = hole.accept()  # the first request is in flight
            with upstream:  # the client is gone
                lines = access_log_until(capsys, "inflight-first")
            (entry,) = (line for line in lines if line["request_id"] == "inflight-first")
            assert (entry["status"], entry["rejected"]) == (499, None)
            # logged when refused, before the first request ended
            (entry,) = (line for line in lines if line["request_id"] == "inflight-second")
            assert (entry["status"], entry["rejected"]) == (400, "invalid_http")


class _Errors(logging.Handler):
    """uvicorn's error log (it does not reach the root logger), as records."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_client_gone_with_a_request_queued_ends_the_one_in_flight_quietly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """uvicorn marks only the last request's cycle when the connection is lost: the one
    in flight, its app done without a response, had uvicorn write a 500 on the closed
    connection (an error log and a task's exception)."""
    errors = _Errors()
    logger = logging.getLogger("uvicorn.error")
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)  # the upstream: accepts, never answers
        hole.settimeout(DEADLINE)
        upstream_url = f"http://127.0.0.1:{hole.getsockname()[1]}/v1"
        with gateway_for(upstream_url, access_log=True) as server:
            logger.addHandler(errors)
            try:
                first = _post(b"/v1/chat/completions", BODY, b"X-Request-Id: gone-first")
                second = _post(b"/v1/chat/completions", BODY, b"X-Request-Id: gone-second")
                with _connect(server) as sock:
                    sock.sendall(first + second)
                    upstream, _ = hole.accept()  # the first request is in flight
                with upstream:  # the client is gone
                    lines = access_log_until(capsys, "gone-first")
            finally:
                logger.removeHandler(errors)
    (entry,) = (line for line in lines if line["request_id"] == "gone-first")
    assert entry["status"] == 499
    assert [record.getMessage() for record in errors.records] == []


def test_a_bad_chunk_after_expect_100_continue_gets_one_answer_and_its_line(
    logged: ServerThread, recorder: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before its app read the body: no 100 Continue after the refusal (a write
    after its end of stream, which raised inside the app)."""
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nX-Request-Id: expect-garbage\r\n"
        b"Expect: 100-continue\r\n" + CHUNKED_GARBAGE
    )
    raw = _exchange(logged, request)
    response = _assert_refusal(raw, 400, "invalid_http")
    assert raw.endswith(response.body)  # type: ignore[attr-defined]
    later = _post(
        b"/v1/chat/completions", BODY, b"X-Request-Id: expect-after", b"Connection: close"
    )
    assert _responses(_exchange(logged, later))[0].status == 200
    lines = access_log_until(capsys, "expect-after")
    (entry,) = (line for line in lines if line["request_id"] == "expect-garbage")
    assert (entry["status"], entry["rejected"]) == (400, "invalid_http")
    assert [r["body"] for r in recorder.requests] == [BODY]  # only the later one


# ------------------------------------------------------------------ the abort hook


def test_abort_connection_resets_a_client_that_stopped_reading() -> None:
    outcome: list[bool] = []
    written = [0]
    aborted = threading.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        chunk = b"x" * 65536
        try:
            while True:  # until the client's window and the transport's buffer are full
                message = {"type": "http.response.body", "body": chunk, "more_body": True}
                await asyncio.wait_for(send(message), 0.5)
                written[0] += len(chunk)
        except TimeoutError:
            outcome.append(abort_connection(scope))
        aborted.set()

    options = {**uvicorn_options(), "lifespan": "off"}
    with running(app, **options) as server, _connect(server) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert aborted.wait(DEADLINE)
        assert outcome == [True]
        # Torn down while megabytes still wait for this client, which reads nothing:
        # a graceful close would keep the connection until they were all delivered.
        _wait_for_tcp_state(sock, _TCP_CLOSE)
        received, reset = _drain(sock)
    assert reset
    assert received < written[0]


_TCP_CLOSE = 7  # tcpi_state after a reset (Linux's TCP_CLOSE)


def _wait_for_tcp_state(sock: socket.socket, state: int) -> None:
    end = time.monotonic() + DEADLINE
    while sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != state:
        assert time.monotonic() < end, "the connection is still up"
        time.sleep(0.01)


def _drain(sock: socket.socket) -> tuple[int, bool]:
    """Read until the end: the bytes received, and whether it ended with a reset."""
    received = 0
    sock.settimeout(DEADLINE)
    while True:
        try:
            data = sock.recv(1 << 20)
        except ConnectionResetError:
            return received, True
        if not data:
            return received, False
        received += len(data)


def test_abort_connection_is_false_outside_the_edge() -> None:
    assert abort_connection({"type": "http", "extensions": {}}) is False
    assert abort_connection({"type": "http"}) is False


# ------------------------------------------------------------------ the loss hook


def test_watch_connection_tells_of_a_lost_client_once_and_unwatch_stops_it() -> None:
    """The relay's disconnect signal: a callback per request instead of a task on receive()."""
    calls: list[str] = []
    lost = threading.Event()
    done = threading.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        gone = asyncio.Event()

        def on_lost(name: str) -> None:
            calls.append(name)
            gone.set()

        unwatch = watch_connection(scope, lambda: on_lost("kept"))
        dropped = watch_connection(scope, lambda: on_lost("unwatched"))
        assert unwatch is not None
        assert dropped is not None
        dropped()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        await asyncio.wait_for(gone.wait(), DEADLINE)
        lost.set()
        # Once lost, a new watch is told at once.
        late = watch_connection(scope, lambda: calls.append("late"))
        assert late is not None
        late()  # unwatching after the call is harmless
        unwatch()
        done.set()

    options = {**uvicorn_options(), "lifespan": "off"}
    with running(app, **options) as server:
        with _connect(server) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        assert lost.wait(DEADLINE)
        assert done.wait(DEADLINE)
    assert calls == ["kept", "late"]


def test_watch_connection_is_none_outside_the_edge() -> None:
    assert watch_connection({"type": "http", "extensions": {}}, lambda: None) is None
    assert watch_connection({"type": "http"}, lambda: None) is None
