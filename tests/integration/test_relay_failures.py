"""Failure paths found in review: slow clients, interrupted sends, encodings, odd methods."""

from __future__ import annotations

import gzip
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.conftest import ServerThread, running
from tests.integration.helpers import annotation, assert_whole_events, gateway_for, metric_value

CHAT = {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}], "stream": True}
DONE_STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"content":"hello"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


def _raw_request(
    port: int,
    headers: dict[str, str],
    body: bytes,
    rcvbuf: int = 0,
    path: str = "/v1/chat/completions",
) -> socket.socket:
    conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    conn.connect(("127.0.0.1", port))
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    conn.sendall(
        (
            f"POST {path} HTTP/1.1\r\nHost: x\r\n{head}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body
    )
    return conn


def _read_all(conn: socket.socket, timeout: float = 20) -> bytes:
    conn.settimeout(timeout)
    raw = b""
    while True:
        chunk = conn.recv(1 << 20)
        if not chunk:
            break
        raw += chunk
        if raw.endswith(b"\r\n0\r\n\r\n"):
            break
    return raw


def _dechunk(raw: bytes) -> bytes:
    _, _, rest = raw.partition(b"\r\n\r\n")
    out = b""
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out += rest[:size]
        rest = rest[size + 2 :]
    return out


def test_terminator_stuck_behind_a_slow_client_is_not_reported_complete(
    scripted: ServerThread,
) -> None:
    # An 8 MB event, a pause, then finish and [DONE]. The client does not read: the
    # 8 MB sit in the gateway's write buffer and the send of the terminator waits.
    # The total deadline stops the stream during that wait: the terminator never
    # reached the client, so the stream is incomplete (once it was reported complete).
    with gateway_for(scripted.url + "/v1", timeouts={"total": 1.5, "idle": 60}) as gw:
        conn = _raw_request(
            gw.port,
            {},
            json.dumps(CHAT).encode(),
            rcvbuf=64 * 1024,
            path="/v1/big/chat/completions",
        )
        with conn:
            time.sleep(3.0)
            payload = _dechunk(_read_all(conn))
        note = annotation(payload)
        assert (note["outcome"], note["reason"]) == ("incomplete", "total_timeout")
        assert b"[DONE]" not in payload
        assert_whole_events(payload)
        metrics = httpx.get(gw.url + "/metrics").text
        assert metric_value(metrics, "gateway_streams_total", outcome="complete") == 0


def test_a_slow_client_is_not_an_idle_upstream(simulator: ServerThread) -> None:
    with gateway_for(simulator.url + "/v1", timeouts={"idle": 1.0}) as gw:
        conn = _raw_request(
            gw.port,
            {"x-sim-tokens": "2000", "x-sim-chunk-bytes": "5000"},
            json.dumps(CHAT).encode(),
            rcvbuf=64 * 1024,
        )
        with conn:
            time.sleep(3.0)  # stop reading for three idle periods
            payload = _dechunk(_read_all(conn))
        assert annotation(payload)["outcome"] == "complete"


def test_a_client_that_never_reads_does_not_hold_the_request(simulator: ServerThread) -> None:
    with gateway_for(simulator.url + "/v1", timeouts={"total": 1.0, "client_send": 2.0}) as gw:
        conn = _raw_request(
            gw.port,
            {"x-sim-fault": "huge_event", "x-sim-chunk-bytes": str(8 * 1024 * 1024)},
            json.dumps(CHAT).encode(),
            rcvbuf=64 * 1024,
        )
        with conn:
            deadline = time.monotonic() + 10
            active = 1.0
            while time.monotonic() < deadline:
                time.sleep(0.25)
                active = metric_value(httpx.get(gw.url + "/metrics").text, "gateway_active_streams")
                if active == 0:
                    break
            # total deadline (1 s) plus the trailer's bounded wait (client_send), not forever
            assert active == 0


# ---------------------------------------------------------------- a scripted upstream


async def _sse(request: Request) -> Response:
    kind = request.path_params["kind"]
    headers = {"content-type": "text/event-stream"}
    if kind == "gzip":
        return Response(gzip.compress(DONE_STREAM), headers=headers | {"content-encoding": "gzip"})
    if kind == "badgzip":
        broken = gzip.compress(DONE_STREAM)[:12] + b"\x00garbage-not-deflate" * 4
        return Response(broken, headers=headers | {"content-encoding": "gzip"})

    if kind == "big":

        async def big() -> AsyncIterator[bytes]:
            yield b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % (
                b"x" * 8_000_000
            )
            await _sleep(0.3)
            yield DONE_STREAM[61:]  # finish and [DONE]

        return StreamingResponse(big(), headers=headers)

    async def body() -> AsyncIterator[bytes]:
        yield DONE_STREAM[:60]
        await _sleep(float(request.query_params.get("hold", "0")))
        yield DONE_STREAM[60:]

    return StreamingResponse(body(), headers=headers)


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


@pytest.fixture(scope="module")
def scripted() -> Iterator[ServerThread]:
    app = Starlette(
        routes=[Route("/v1/{kind}/chat/completions", _sse, methods=["GET", "HEAD", "POST"])]
    )
    with running(app) as server:
        yield server


def test_gzip_event_stream_is_forwarded_decoded_without_content_encoding(
    scripted: ServerThread,
) -> None:
    with gateway_for(scripted.url + "/v1") as gw:
        response = httpx.post(
            gw.url + "/v1/gzip/chat/completions",
            json=CHAT,
            headers={"accept-encoding": "identity"},
        )
        assert "content-encoding" not in response.headers
        assert response.content.startswith(DONE_STREAM)
        assert annotation(response.content)["outcome"] == "complete"


def test_broken_content_encoding_is_an_incomplete_stream(scripted: ServerThread) -> None:
    with gateway_for(scripted.url + "/v1") as gw:
        response = httpx.post(gw.url + "/v1/badgzip/chat/completions", json=CHAT)
        note = annotation(response.content)
        assert (note["outcome"], note["reason"]) == ("incomplete", "invalid_shape")
        metrics = httpx.get(gw.url + "/metrics").text
        assert metric_value(metrics, "gateway_streams_total", reason="invalid_shape") == 1


def test_head_on_an_event_stream_path_is_not_a_stream(scripted: ServerThread) -> None:
    with gateway_for(scripted.url + "/v1") as gw:
        response = httpx.head(gw.url + "/v1/plain/chat/completions")
        assert response.status_code == 200
        assert response.content == b""
        metrics = httpx.get(gw.url + "/metrics").text
        assert metric_value(metrics, "gateway_streams_total") == 0


def test_an_unannounced_stream_is_counted_while_it_runs(scripted: ServerThread) -> None:
    import threading

    with gateway_for(scripted.url + "/v1") as gw:
        result: dict[str, bytes] = {}

        def fetch() -> None:
            # a GET: no JSON body announces the stream
            result["body"] = httpx.get(
                gw.url + "/v1/plain/chat/completions", params={"hold": "1.0"}, timeout=10
            ).content

        thread = threading.Thread(target=fetch)
        thread.start()
        time.sleep(0.5)
        during = httpx.get(gw.url + "/metrics").text
        thread.join(10)
        after = httpx.get(gw.url + "/metrics").text
        assert metric_value(during, "gateway_active_streams") == 1
        assert metric_value(after, "gateway_active_streams") == 0
        assert annotation(result["body"])["outcome"] == "complete"
        assert metric_value(after, "gateway_streams_total", outcome="complete") == 1


def test_refused_streams_are_not_counted_as_unknown_usage(simulator: ServerThread) -> None:
    with gateway_for(simulator.url + "/v1", limits={"max_concurrent_streams": 1}) as gw:
        import threading

        slow = threading.Thread(
            target=lambda: httpx.post(
                gw.url + "/v1/chat/completions",
                json=CHAT,
                headers={"x-sim-tokens": "10", "x-sim-tps": "10"},
                timeout=10,
            )
        )
        slow.start()
        time.sleep(0.3)
        assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT).status_code == 503
        slow.join(10)
        metrics = httpx.get(gw.url + "/metrics").text
        assert metric_value(metrics, "gateway_streams_total") == 1
        assert metric_value(metrics, "gateway_usage_unknown_total") == 1


def test_every_response_carries_one_request_id(simulator: ServerThread) -> None:
    with gateway_for(simulator.url + "/v1") as gw:
        for method, path in (
            ("GET", "/healthz"),
            ("GET", "/readyz"),
            ("GET", "/metrics"),
            ("POST", "/healthz"),
            ("GET", "/nowhere"),
        ):
            response = httpx.request(method, gw.url + path, headers={"x-request-id": "rid-own"})
            assert response.headers.get_list("x-request-id") == ["rid-own"], path
        generated = httpx.get(gw.url + "/nowhere")
        rid = generated.headers.get_list("x-request-id")
        assert len(rid) == 1
        assert rid[0] in generated.json()["error"]["message"]
