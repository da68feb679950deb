"""Hostile input from clients and upstreams never takes the gateway down.

Poison strings (lone surrogates), deeply nested JSON, made-up model names,
slow uploads that pin memory, clients that stop reading, and upstream
answers cut short: each is driven for real against a real gateway, and each
leaves the metrics page, the access log and other requests working.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.app import create_app
from gateway.observe import Observers, RequestRecord
from gateway.server.edge import EdgeRefusal, uvicorn_options
from gateway.settings import Settings
from tests import web
from tests.conftest import ServerThread, gateway_process, running
from tests.integration.helpers import access_log_lines, annotation, gateway_for, metric_value

# A lone surrogate, as JSON text: valid JSON, but not encodable as UTF-8 once decoded.
SURROGATE = "\\ud800"
DEEP = "[" * 1000 + "]" * 1000
ANSWER_MODEL = "real-model"


def _chunk(obj_text: str) -> bytes:
    return f"data: {obj_text}\n\n".encode()


def _stream(finish: str = '"stop"', model: str = f'"{ANSWER_MODEL}"') -> bytes:
    return (
        _chunk(f'{{"model":{model},"choices":[{{"index":0,"delta":{{"content":"hi"}}}}]}}')
        + _chunk(
            f'{{"model":{model},"choices":[{{"index":0,"delta":{{}},"finish_reason":{finish}}}]}}'
        )
        + b"data: [DONE]\n\n"
    )


class Upstream:
    """A scripted upstream that records the bodies it receives."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def answer(self, request: Request) -> Response:
        kind = request.path_params["kind"]
        body = await request.body()
        self.bodies.append(body)
        sse = {"content-type": "text/event-stream"}
        if kind == "surrogate":
            return Response(_stream(finish=f'"{SURROGATE}"', model=f'"{SURROGATE}"'), headers=sse)
        if kind == "deep":
            return Response(_chunk(DEEP) + b"data: [DONE]\n\n", headers=sse)
        if kind == "badjson":
            return Response(b'{"id": "x", "usage": ', media_type="application/json")
        if kind == "short":
            # Content-Length promises more than is sent: the server then drops the connection.
            return Response(
                b'{"id":"x"', headers={"content-type": "application/json", "content-length": "500"}
            )
        if kind == "bigjson":

            async def big() -> AsyncIterator[bytes]:
                yield b'{"filler":"'
                for _ in range(64):
                    yield b"x" * (256 * 1024)
                yield b'","model":"' + ANSWER_MODEL.encode() + b'"}'

            return StreamingResponse(big(), media_type="application/json")
        try:
            asked = json.loads(body)
        except (ValueError, RecursionError):
            asked = None
        if isinstance(asked, dict) and asked.get("stream") is True:
            return Response(_stream(), headers=sse)
        return JSONResponse({"id": "x", "model": ANSWER_MODEL, "usage": {"prompt_tokens": 1}})


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[ServerThread, Upstream]]:
    script = Upstream()
    app = Starlette(routes=[Route("/v1/{kind}/chat/completions", script.answer, methods=["POST"])])
    with running(app) as server:
        yield server, script


def _post(base: str, kind: str, content: bytes, **headers: str) -> httpx.Response:
    return web.post(
        f"{base}/v1/{kind}/chat/completions",
        content=content,
        headers={"content-type": "application/json", **headers},
        timeout=30,
    )


def _log_lines(out: str) -> list[dict[str, Any]]:
    out.encode("ascii")  # the access log is ASCII JSON
    return access_log_lines(out)


def test_poison_strings_leave_metrics_log_and_other_requests_working(
    upstream: tuple[ServerThread, Upstream], capsys: pytest.CaptureFixture[str]
) -> None:
    server, _ = upstream
    poison_body = ('{"model":"' + SURROGATE + '","stream":true,"messages":[]}').encode()
    with gateway_for(server.url + "/v1", access_log=True) as gw:
        # The client's model is a lone surrogate; then the upstream's finish reason is one.
        first = _post(gw.url, "echo", poison_body, **{"user-agent": "u" * 5000})
        assert annotation(first.content)["outcome"] == "complete"
        second = _post(gw.url, "surrogate", b'{"model":"m","stream":true}')
        assert annotation(second.content)["outcome"] == "complete"
        for _ in range(3):  # every later scrape still works
            scrape = web.get(gw.url + "/metrics")
            assert scrape.status_code == 200
        # The label never comes from the poison: the answer's model, or the safe 'other'.
        assert metric_value(scrape.text, "gateway_streams_total", model=ANSWER_MODEL) == 1
        assert metric_value(scrape.text, "gateway_streams_total", model="other") == 1
        assert metric_value(scrape.text, "gateway_observer_errors_total") == 0
        after = _post(gw.url, "echo", b'{"model":"m","stream":true}', **{"x-request-id": "after"})
        assert annotation(after.content)["outcome"] == "complete"
    lines = _log_lines(capsys.readouterr().out)
    assert [line["request_id"] for line in lines][-1] == "after"
    assert len(lines) == 3
    poisoned = lines[0]
    assert poisoned["model"] == "\ud800"  # escaped in the line, intact once decoded
    assert poisoned["user_agent"] == "u" * 256 + "...(cut)"
    assert lines[1]["finish_reasons"] == {"0": "\ud800"}


def test_deeply_nested_json_is_not_json_and_is_forwarded_unchanged(
    upstream: tuple[ServerThread, Upstream],
) -> None:
    server, script = upstream
    with gateway_for(server.url + "/v1") as gw:
        response = _post(gw.url, "echo", DEEP.encode())
        assert response.status_code == 200, response.text
        assert script.bodies[-1] == DEEP.encode()
        # An upstream event nested as deep is a limit, judged, not a crash.
        stream = _post(gw.url, "deep", b'{"stream":true}')
        note = annotation(stream.content)
        assert (note["outcome"], note["reason"]) == ("incomplete", "limit_exceeded")
        assert web.get(gw.url + "/metrics").status_code == 200


def test_made_up_model_names_cannot_squat_the_model_labels(
    upstream: tuple[ServerThread, Upstream],
) -> None:
    server, _ = upstream
    with gateway_for(server.url + "/v1", max_model_labels=5) as gw:
        for i in range(20):
            body = json.dumps({"model": f"made-up-{i}", "stream": i % 2 == 0}).encode()
            assert _post(gw.url, "echo", body).status_code == 200
        metrics = web.get(gw.url + "/metrics").text
    assert "made-up" not in metrics
    assert metric_value(metrics, "gateway_streams_total", model=ANSWER_MODEL) == 10
    assert metric_value(metrics, "gateway_requests_total") == 20


def test_an_allow_listed_model_is_labelled_by_the_client_claim(
    upstream: tuple[ServerThread, Upstream],
) -> None:
    server, _ = upstream
    with gateway_for(server.url + "/v1", model_labels=["gpt-x"]) as gw:
        for model in ("gpt-x", "made-up"):
            body = json.dumps({"model": model, "stream": True}).encode()
            assert _post(gw.url, "echo", body).status_code == 200
        metrics = web.get(gw.url + "/metrics").text
    assert metric_value(metrics, "gateway_streams_total", model="gpt-x") == 1
    assert metric_value(metrics, "gateway_streams_total", model="other") == 1


def test_a_failing_access_log_is_counted_and_breaks_nothing_else(
    upstream: tuple[ServerThread, Upstream],
) -> None:
    server, _ = upstream
    with gateway_process(["--upstream", server.url + "/v1"], drain=False) as gw:
        assert gw.proc.stdout is not None
        gw.proc.stdout.close()  # every later write to stdout fails (EPIPE)
        for i in range(3):
            response = _post(gw.url, "echo", b'{"model":"m","stream":true}')
            assert annotation(response.content)["outcome"] == "complete", i
            # a refusal at the client edge, which the edge hands to the access log
            with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as sock:
                sock.sendall(b"GET /v1/models HTTP/1.1\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n")
                assert sock.recv(64).startswith(b"HTTP/1.1 431 "), i
        deadline = time.monotonic() + 10
        errors = 0.0
        while time.monotonic() < deadline and errors == 0:
            metrics = web.get(gw.url + "/metrics").text
            errors = metric_value(metrics, "gateway_observer_errors_total", observer="access_log")
            time.sleep(0.05)
        assert errors >= 1
        assert metric_value(metrics, "gateway_streams_total", outcome="complete") == 3
        assert (
            metric_value(metrics, "gateway_rejected_requests_total", reason="header_too_large") == 3
        )
        _out, stderr = gw.stop()
    # Logged, but at most once a minute.
    assert stderr.count(b"observer access_log failed") <= 1


def test_a_stdout_nobody_reads_stops_no_request_and_loses_only_what_it_cannot_hold(
    upstream: tuple[ServerThread, Upstream],
) -> None:
    """A stalled log reader (a full pipe) blocks the access log's writer thread, never
    the loop: requests go on, lines beyond the queue are dropped and counted, and once
    the pipe is read again the log goes on. (Writing on the loop, the 69th request of
    this test hung: the pipe holds 64 KiB.) The pipe is shrunk to one page and the
    queue to 32 lines, so a few dozen requests reach the bound on any machine."""
    import fcntl
    import os

    server, _ = upstream
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    records = _Records()
    logging.getLogger("gateway").addHandler(records)
    app = create_app(
        Settings(upstream_url=server.url + "/v1", access_log=True),
        access_log_stream=os.fdopen(write_end, "w", encoding="ascii"),
        access_log_queue_lines=32,
    )
    try:
        with running(app, **uvicorn_options()) as gw:
            sent, dropped = 0, 0.0
            while dropped == 0:
                assert sent < 2_000, f"nothing dropped after {sent} requests"
                for _ in range(10):
                    response = _post(gw.url, "echo", b'{"model":"m","stream":true}')
                    assert annotation(response.content)["outcome"] == "complete", sent
                    sent += 1
                metrics = web.get(gw.url + "/metrics").text
                dropped = metric_value(metrics, "gateway_access_log_dropped_lines_total")
            assert metric_value(metrics, "gateway_streams_total", outcome="complete") == sent
            assert 0 < dropped < sent
            # Read again: what the pipe and the queue held comes out whole, then new lines.
            headers = {"x-request-id": "last"}
            last = _post(gw.url, "echo", b'{"model":"m","stream":true}', **headers)
            assert last.status_code == 200
            out = b""
            # Until the last line is whole: the pipe holds one page, so a read can end
            # inside it.
            while b"\n" not in out.partition(b'"request_id":"last"')[2]:
                chunk = os.read(read_end, 65536)
                assert chunk, "the log's pipe closed"
                out += chunk
            lines = _log_lines(out.decode("ascii"))
            assert lines[-1]["request_id"] == "last"
            # Every line before "last" was written or dropped by now: the count is final.
            metrics = web.get(gw.url + "/metrics").text
            dropped = metric_value(metrics, "gateway_access_log_dropped_lines_total")
            assert len(lines) == sent + 1 - dropped
    finally:
        logging.getLogger("gateway").removeHandler(records)
        os.close(read_end)
    warned = [r for r in records.records if "is not keeping up" in r.getMessage()]
    assert len(warned) == 1


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_an_edge_refusal_the_access_log_cannot_take_is_counted_and_goes_no_further() -> None:
    """The edge calls ``edge_refused`` from the connection's protocol: nothing may escape."""
    app = create_app(Settings(upstream_url="http://127.0.0.1:9/v1"))
    gateway = app.state.gateway

    def broken(record: RequestRecord) -> None:
        raise RuntimeError("boom")

    gateway.access_log.write = broken
    refusal = EdgeRefusal(431, "header_too_large", "rid", "GET", "/v1/x", [], "127.0.0.1", 0.0)
    gateway.edge_refused(refusal)  # does not raise
    text = generate_latest(gateway.metrics.registry).decode()
    assert metric_value(text, "gateway_observer_errors_total", observer="access_log") == 1


class _Broken:
    name = "broken"

    def observe(self, record: RequestRecord) -> None:
        raise RuntimeError("boom")


class _Keeper:
    name = "keeper"

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def observe(self, record: RequestRecord) -> None:
        self.records.append(record)


def test_one_observer_failing_never_stops_another(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    failures: list[str] = []
    keeper = _Keeper()
    observers = Observers([_Broken(), keeper], failures.append, clock=lambda: now[0])
    records = [RequestRecord(str(i), "r", "POST", "/v1/x", 0.0) for i in range(5)]
    with caplog.at_level("ERROR", logger="gateway"):
        for record in records[:4]:
            observers.observe(record)
        now[0] = 61.0
        observers.observe(records[4])
    assert keeper.records == records
    assert failures == ["broken"] * 5
    logged = [r for r in caplog.records if "observer broken failed" in r.getMessage()]
    assert len(logged) == 2  # the first, then one a minute later naming the 3 suppressed
    assert "3 more failure(s)" in logged[1].getMessage()


def _send_head(port: int, length: int, rcvbuf: int = 0, kind: str = "echo") -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port))
    if rcvbuf:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    conn.sendall(
        b"POST /v1/%s/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (kind.encode(), length)
    )
    return conn


def _response_head(conn: socket.socket, timeout: float = 20) -> bytes:
    conn.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_buffered_request_bodies_are_bounded_all_together(
    upstream: tuple[ServerThread, Upstream],
) -> None:
    server, script = upstream
    size = 600 * 1024
    body = b'{"model":"m","pad":"' + b"x" * (size - 22) + b'"}'
    assert len(body) == size
    limits = {"max_request_bytes": 1024 * 1024, "max_buffered_request_bytes": 1024 * 1024}
    with gateway_for(server.url + "/v1", limits=limits) as gw:
        # One slow upload stops just before its end, holding ~600 KiB.
        slow = _send_head(gw.port, size)
        slow.sendall(body[:-10])
        deadline = time.monotonic() + 10
        # A second upload that would not fit beside it is refused at once.
        refused = None
        while time.monotonic() < deadline:
            refused = _post(gw.url, "echo", body)
            if refused.status_code == 503:
                break
            time.sleep(0.05)  # the slow body may not all have been read yet
        assert refused is not None
        assert refused.status_code == 503, refused
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "memory_budget"
        # The slow upload finishes normally, and its bytes are released.
        slow.sendall(body[-10:])
        head = _response_head(slow)
        slow.close()
        assert head.startswith(b"HTTP/1.1 200"), head
        assert script.bodies[-1] == body
        assert _post(gw.url, "echo", body).status_code == 200
        metrics = web.get(gw.url + "/metrics").text
    assert metric_value(metrics, "gateway_rejected_requests_total", reason="memory_budget") >= 1


def _read_until_reset(conn: socket.socket, timeout: float = 30) -> str:
    """Read until the peer ends the connection: 'reset' (RST) or 'closed' (FIN)."""
    conn.settimeout(timeout)
    try:
        while conn.recv(1 << 20):
            pass
    except ConnectionResetError:
        return "reset"
    return "closed"


def test_a_client_that_stops_reading_a_stream_is_stalled_and_aborted(
    simulator: ServerThread,
) -> None:
    timeouts = {"client_send": 1.0}
    with gateway_for(simulator.url + "/v1", timeouts=timeouts) as gw:
        body = json.dumps({"model": "m", "stream": True, "messages": []}).encode()
        conn = socket.create_connection(("127.0.0.1", gw.port))
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-sim-tokens: 100000\r\n"
            b"x-sim-chunk-bytes: 20000\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        with conn:
            assert _response_head(conn).startswith(b"HTTP/1.1 200")
            # Stop reading; wait for the verdict, then for the connection's end.
            deadline = time.monotonic() + 30
            stalled = 0.0
            while time.monotonic() < deadline and not stalled:
                metrics = web.get(gw.url + "/metrics").text
                stalled = metric_value(metrics, "gateway_streams_total", reason="client_stalled")
                time.sleep(0.05)
            assert stalled == 1
            assert metric_value(metrics, "gateway_active_streams") == 0
            assert (
                metric_value(metrics, "gateway_request_errors_total", error="client_stalled") == 1
            )
            assert _read_until_reset(conn) == "reset"
        # Other requests are unaffected.
        ok = web.post(gw.url + "/v1/chat/completions", content=body, timeout=30)
        assert annotation(ok.content)["outcome"] == "complete"


def test_a_client_that_stops_reading_a_plain_answer_is_aborted(
    upstream: tuple[ServerThread, Upstream],
) -> None:
    server, _ = upstream
    with gateway_for(server.url + "/v1", timeouts={"client_send": 1.0}) as gw:
        conn = _send_head(gw.port, 2, rcvbuf=16 * 1024, kind="bigjson")
        conn.sendall(b"{}")
        with conn:
            assert _response_head(conn).startswith(b"HTTP/1.1 200")
            deadline = time.monotonic() + 30
            stalled = 0.0
            while time.monotonic() < deadline and not stalled:
                metrics = web.get(gw.url + "/metrics").text
                stalled = metric_value(
                    metrics, "gateway_request_errors_total", error="client_stalled"
                )
                time.sleep(0.05)
            assert stalled == 1
            assert _read_until_reset(conn) == "reset"


@pytest.mark.parametrize(
    ("kind", "error"), [("short", "upstream_disconnect"), ("badjson", "invalid_json")]
)
def test_a_broken_plain_answer_is_recorded_not_a_clean_200(
    upstream: tuple[ServerThread, Upstream],
    capsys: pytest.CaptureFixture[str],
    kind: str,
    error: str,
) -> None:
    server, _ = upstream
    with gateway_for(server.url + "/v1", access_log=True) as gw:
        try:
            _post(gw.url, kind, b'{"model":"m"}', **{"x-request-id": "broken"})
        except httpx.HTTPError:
            assert kind == "short"  # the connection is dropped: the client sees the cut
        metrics = web.get(gw.url + "/metrics").text
        assert metric_value(metrics, "gateway_request_errors_total", error=error) == 1
    (line,) = [
        line for line in _log_lines(capsys.readouterr().out) if line["request_id"] == "broken"
    ]
    assert line["error"] == error


def test_many_poison_requests_at_once_leave_the_gateway_healthy(
    upstream: tuple[ServerThread, Upstream],
) -> None:
    server, _ = upstream
    poison = ('{"model":"' + SURROGATE + '","stream":true}').encode()
    with gateway_for(server.url + "/v1") as gw:
        results: list[int] = []

        def hit() -> None:
            results.append(_post(gw.url, "surrogate", poison).status_code)

        threads = [threading.Thread(target=hit) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert results == [200] * 20
        assert web.get(gw.url + "/metrics").status_code == 200
