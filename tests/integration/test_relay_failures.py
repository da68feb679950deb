"""Failure paths found in review: slow clients, interrupted sends, encodings, odd methods."""

from __future__ import annotations

import gzip
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests import web
from tests.conftest import ServerThread, running
from tests.integration.control import (
    WAIT_SECONDS,
    access_log,
    gated_upstream,
    settled_metrics,
    wait_until,
)
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


def test_terminator_stuck_behind_a_slow_client_is_not_reported_complete() -> None:
    # An 8 MB event, then finish and [DONE] in a chunk of their own. The client does
    # not read: the 8 MB sit in the gateway's write buffer and the send of the
    # terminator waits. The total deadline stops the stream during that wait: the
    # terminator never reached the client, so the stream is incomplete (once it was
    # reported complete). The 8 MB must reach the gateway's write buffer before the
    # deadline: 12 s leave a loaded machine time for it (6 s was a margin it could lose).
    total = 12.0
    with (
        gated_upstream() as upstream,
        gateway_for(upstream.url + "/v1", timeouts={"total": total, "idle": 60}) as gw,
    ):
        conn = _raw_request(
            gw.port,
            {"x-gate": "big", "x-first-event-bytes": "8000000"},
            json.dumps(CHAT).encode(),
            rcvbuf=64 * 1024,
        )
        sent = time.monotonic()
        with conn:
            conn.settimeout(WAIT_SECONDS)
            # The gateway has written the whole 8 MB event (it forwards whole events
            # only) when its first bytes are at the client; only then may the
            # terminator come, so that it is a send of its own, waiting behind them.
            wait_until(lambda: _body_started(conn), "the big event's first bytes at the client")
            gate = upstream.gate("big")
            gate.open()
            assert gate.passed.wait(WAIT_SECONDS)
            # the scenario: the terminator was on its way before the deadline
            assert time.monotonic() < sent + total, "the terminator came after the deadline"
            # The elapsed time is the behaviour here: read only once the deadline is
            # long past, and long before the gateway gives up on the trailer (5 s).
            time.sleep(max(0.0, sent + total + 2.5 - time.monotonic()))
            payload = _dechunk(_read_all(conn))
        note = annotation(payload)
        assert (note["outcome"], note["reason"]) == ("incomplete", "total_timeout")
        assert b"[DONE]" not in payload
        assert_whole_events(payload)
        metrics = settled_metrics(gw.url, requests=1)
        assert metric_value(metrics, "gateway_streams_total", outcome="complete") == 0
        assert metric_value(metrics, "gateway_streams_total", reason="total_timeout") == 1


def test_a_slow_client_is_not_an_idle_upstream(simulator: ServerThread) -> None:
    idle = 1.0
    with gateway_for(simulator.url + "/v1", timeouts={"idle": idle}) as gw:
        conn = _raw_request(
            gw.port,
            {"x-sim-tokens": "2000", "x-sim-chunk-bytes": "5000"},
            json.dumps(CHAT).encode(),
            rcvbuf=64 * 1024,
        )
        with conn:
            conn.settimeout(WAIT_SECONDS)
            wait_until(lambda: _body_started(conn), "the first bytes of the stream at the client")
            # The client stops reading for three idle periods while the gateway still
            # has megabytes to send it. The elapsed time is the behaviour under test:
            # it is a lower bound, which a loaded machine can only lengthen.
            time.sleep(3 * idle)
            payload = _dechunk(_read_all(conn))
        assert annotation(payload)["outcome"] == "complete"


def test_a_client_that_never_reads_does_not_hold_the_request(
    simulator: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    # Only the client-send bound (2 s) can end it: the total deadline is the default hour,
    # so however slow a loaded machine forwards the 8 MB event, no other deadline wins the
    # race (issue 45 item 9: with total = 2 s it did, at load 4 to 9).
    with gateway_for(simulator.url + "/v1", timeouts={"client_send": 2.0}, access_log=True) as gw:
        conn = _raw_request(
            gw.port,
            {"x-sim-fault": "huge_event", "x-sim-chunk-bytes": str(8 * 1024 * 1024)},
            json.dumps(CHAT).encode(),
            rcvbuf=64 * 1024,
        )
        with conn:
            # a blocked send or the trailer's bounded wait (client_send, 2 s) ends it: the
            # request is over while the client still has not read
            metrics = settled_metrics(gw.url, requests=1)
            (line,) = access_log(capsys, 1)
        assert metric_value(metrics, "gateway_active_streams") == 0
        # the gateway gave up on the client: it dropped the connection, and what it had
        # queued for it (even a terminator) does not make the stream complete
        assert line["error"] == "client_stalled"
        assert (line["outcome"], line["reason"]) == ("incomplete", "client_stalled")


def _body_started(conn: socket.socket) -> bool:
    """Whether response body bytes are waiting at the client (looked at, not read)."""
    _head, end, body = conn.recv(65536, socket.MSG_PEEK).partition(b"\r\n\r\n")
    return bool(end) and b"data: " in body


# ---------------------------------------------------------------- a scripted upstream


async def _sse(request: Request) -> Response:
    kind = request.path_params["kind"]
    headers = {"content-type": "text/event-stream"}
    if kind == "gzip":
        return Response(gzip.compress(DONE_STREAM), headers=headers | {"content-encoding": "gzip"})
    if kind == "badgzip":
        broken = gzip.compress(DONE_STREAM)[:12] + b"\x00garbage-not-deflate" * 4
        return Response(broken, headers=headers | {"content-encoding": "gzip"})

    async def body() -> AsyncIterator[bytes]:
        yield DONE_STREAM[:60]
        yield DONE_STREAM[60:]

    return StreamingResponse(body(), headers=headers)


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
        response = web.post(
            gw.url + "/v1/gzip/chat/completions",
            json=CHAT,
            headers={"accept-encoding": "identity"},
        )
        assert "content-encoding" not in response.headers
        assert response.content.startswith(DONE_STREAM)
        assert annotation(response.content)["outcome"] == "complete"


def test_broken_content_encoding_is_an_incomplete_stream(scripted: ServerThread) -> None:
    with gateway_for(scripted.url + "/v1") as gw:
        response = web.post(gw.url + "/v1/badgzip/chat/completions", json=CHAT)
        note = annotation(response.content)
        assert (note["outcome"], note["reason"]) == ("incomplete", "invalid_shape")
        metrics = settled_metrics(gw.url, requests=1)
        assert metric_value(metrics, "gateway_streams_total", reason="invalid_shape") == 1


def test_head_on_an_event_stream_path_is_not_a_stream(scripted: ServerThread) -> None:
    with gateway_for(scripted.url + "/v1") as gw:
        response = web.head(gw.url + "/v1/plain/chat/completions")
        assert response.status_code == 200
        assert response.content == b""
        metrics = settled_metrics(gw.url, requests=1)
        assert metric_value(metrics, "gateway_streams_total") == 0


def test_an_unannounced_stream_is_counted_while_it_runs() -> None:
    with (
        gated_upstream() as upstream,
        gateway_for(upstream.url + "/v1") as gw,
        web.client(timeout=WAIT_SECONDS) as client,
    ):
        # a GET: no JSON body announces the stream; the upstream holds it open
        with client.stream(
            "GET", gw.url + "/v1/chat/completions", headers={"x-gate": "held"}
        ) as response:
            # its answer has started, and the stream is not over until the gate opens
            during = client.get(gw.url + "/metrics").text
            upstream.gate("held").open()
            body = response.read()
        after = settled_metrics(gw.url, requests=1)
    assert metric_value(during, "gateway_active_streams") == 1
    assert metric_value(after, "gateway_active_streams") == 0
    assert annotation(body)["outcome"] == "complete"
    assert metric_value(after, "gateway_streams_total", outcome="complete") == 1


def test_refused_streams_are_not_counted_as_unknown_usage() -> None:
    with (
        gated_upstream() as upstream,
        gateway_for(upstream.url + "/v1", limits={"max_concurrent_streams": 1}) as gw,
        web.client(timeout=WAIT_SECONDS) as client,
    ):
        with client.stream(
            "POST", gw.url + "/v1/chat/completions", json=CHAT, headers={"x-gate": "slow"}
        ) as slow:
            # its answer has started: it holds the only stream slot until the gate opens
            assert client.post(gw.url + "/v1/chat/completions", json=CHAT).status_code == 503
            upstream.gate("slow").open()
            assert annotation(slow.read())["outcome"] == "complete"
        metrics = settled_metrics(gw.url, requests=2)
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
            response = web.request(method, gw.url + path, headers={"x-request-id": "rid-own"})
            assert response.headers.get_list("x-request-id") == ["rid-own"], path
        generated = web.get(gw.url + "/nowhere")
        rid = generated.headers.get_list("x-request-id")
        assert len(rid) == 1
        assert rid[0] in generated.json()["error"]["message"]
