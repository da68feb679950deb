"""The relay's edges: errors before the stream, headers, paths, disconnects, limits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from typing import Any

import httpx
import pytest

from tests import web
from tests.conftest import ServerThread
from tests.integration.control import WAIT_SECONDS, access_log, settled_metrics, wait_until
from tests.integration.helpers import annotation, gateway_for, metric_value
from tests.integration.raw_upstream import RawRequest, chunk, raw_upstream, sse_head
from tests.sdk import openai

CHAT = {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.fixture(scope="module")
def gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    # deadlines that no request of these tests comes near, even on a loaded machine
    return {
        "upstream_url": simulator.url + "/v1",
        "timeouts": {"idle": 30.0, "first_byte": 30.0, "total": 60.0},
        "limits": {"max_request_bytes": 4096},
    }


def _sim_record(simulator: ServerThread, request_id: str) -> dict[str, object] | None:
    response = web.get(f"{simulator.url}/_sim/requests/{request_id}")
    if response.status_code == 404:
        return None
    response.raise_for_status()
    data: dict[str, object] = response.json()
    return data


def _assert_clean_error(response: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == code
    text = response.text.lower()
    for leak in ("127.0.0.1", "localhost", "traceback", "exception", "errno"):
        assert leak not in text, leak
    assert response.headers["x-request-id"]
    return dict(error)


def test_first_byte_timeout_before_headers_is_a_504_json_error(simulator: ServerThread) -> None:
    with gateway_for(
        simulator.url + "/v1", timeouts={"first_byte": 1.0, "idle": 30.0, "total": 60.0}
    ) as gw:
        response = web.post(
            gw.url + "/v1/chat/completions",
            json=CHAT,
            headers={"x-sim-fault": "stall_before_headers"},  # an hour
            timeout=10,
        )
    _assert_clean_error(response, 504, "first_byte_timeout")


def test_unreachable_upstream_is_a_502_naming_no_host(dead_port: int) -> None:
    with gateway_for(f"http://127.0.0.1:{dead_port}/v1") as gw:
        response = web.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=10)
        _assert_clean_error(response, 502, "upstream_unavailable")
        metrics = settled_metrics(gw.url, requests=1)
        assert (
            metric_value(
                metrics,
                "gateway_streams_total",
                outcome="incomplete",
                reason="upstream_unavailable",
            )
            == 1
        )


def test_connect_timeout_is_a_504(capsys: pytest.CaptureFixture[str]) -> None:
    # A listening socket whose accept queue is full: further SYNs are dropped,
    # so connecting hangs until the connect deadline.
    blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(0)
    port = blocker.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", port))
            fillers.append(s)
        with gateway_for(
            f"http://127.0.0.1:{port}/v1", timeouts={"connect": 0.5}, access_log=True
        ) as gw:
            # Without the connect deadline the kernel would retry the SYN for a minute
            # or more, past this client's own 10 s.
            response = web.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=10)
            _assert_clean_error(response, 504, "upstream_unavailable")
            (line,) = access_log(capsys, 1)
        assert line["error"] == "connect_timeout"  # not a refusal: the deadline ended it
    finally:
        for s in fillers:
            s.close()
        blocker.close()


def test_non_2xx_is_relayed_unchanged(simulator: ServerThread) -> None:
    headers = {"x-sim-fault": "status", "x-sim-status": "429"}
    direct = web.post(simulator.url + "/v1/chat/completions", json=CHAT, headers=headers)
    with gateway_for(simulator.url + "/v1") as gw:
        via = web.post(gw.url + "/v1/chat/completions", json=CHAT, headers=headers)
        metrics = settled_metrics(gw.url, requests=1)
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(
                base_url=gw.url + "/v1", api_key="k", max_retries=0
            ).chat.completions.create(model="m", messages=[], stream=True, extra_headers=headers)
    assert via.status_code == direct.status_code == 429
    assert via.content == direct.content
    assert via.headers.get("retry-after") == direct.headers.get("retry-after")
    labels = {"outcome": "incomplete", "reason": "upstream_status"}
    assert metric_value(metrics, "gateway_streams_total", **labels) == 1


def test_body_over_the_limit_is_a_413_and_never_sent_upstream(
    gateway: ServerThread, simulator: ServerThread
) -> None:
    big = dict(CHAT, messages=[{"role": "user", "content": "x" * 10_000}])
    response = web.post(
        gateway.url + "/v1/chat/completions", json=big, headers={"x-request-id": "too-big-1"}
    )
    _assert_clean_error(response, 413, "body_too_large")
    assert _sim_record(simulator, "too-big-1") is None
    # also when the client streams the body without a Content-Length
    chunks = iter([b'{"model": "m", "messages": "', b"y" * 5000, b'"}'])
    response = web.post(
        gateway.url + "/v1/chat/completions",
        content=chunks,
        headers={"x-request-id": "too-big-2", "content-type": "application/json"},
    )
    _assert_clean_error(response, 413, "body_too_large")
    assert _sim_record(simulator, "too-big-2") is None


@pytest.mark.parametrize(
    "path",
    ["/v1/../admin", "/v1/%2e%2e/admin", "/v1/models/%2E%2E/%2E%2E/x", "/v1/a%2fb", "/v1/./models"],
)
def test_traversal_is_rejected_and_never_forwarded(
    gateway: ServerThread, simulator: ServerThread, path: str
) -> None:
    rid = "trav-" + str(abs(hash(path)))
    with socket.create_connection(("127.0.0.1", gateway.port)) as conn:
        conn.sendall(
            f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Request-ID: {rid}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        raw = b""
        while chunk := conn.recv(65536):
            raw += chunk
    status = int(raw.split(b" ", 2)[1])
    assert 400 <= status < 500
    assert _sim_record(simulator, rid) is None


def test_request_ids_and_headers(gateway: ServerThread, simulator: ServerThread) -> None:
    response = web.post(
        gateway.url + "/v1/chat/completions",
        json=CHAT,
        headers={
            "x-request-id": "client.id-1",
            "connection": "x-hop",
            "x-hop": "must-not-pass",
            "x-custom": "passes",
            "accept-encoding": "gzip",
        },
    )
    assert response.headers.get_list("x-request-id") == ["client.id-1"]
    assert response.headers["x-upstream-request-id"]
    record = _sim_record(simulator, "client.id-1")
    assert record is not None
    seen = record["headers"]
    assert isinstance(seen, dict)
    assert "x-hop" not in seen
    assert seen["x-custom"] == "passes"
    assert seen["accept-encoding"] == "identity"
    assert seen["x-forwarded-for"] == "127.0.0.1"
    assert seen["x-forwarded-proto"] == "http"
    assert seen["x-request-id"] == "client.id-1"
    # an invalid client id is replaced by a generated one
    bad = web.post(
        gateway.url + "/v1/chat/completions", json=CHAT, headers={"x-request-id": "bad id!"}
    )
    rid = bad.headers.get_list("x-request-id")
    assert len(rid) == 1
    assert rid[0] != "bad id!"
    assert annotation(bad.content)["rid"] == rid[0]


def test_non_streamed_requests_pass_through_unchanged(
    gateway: ServerThread, simulator: ServerThread
) -> None:
    for method, path, body in (
        ("GET", "/v1/models", None),
        ("POST", "/v1/embeddings", {"model": "e", "input": "hello"}),
        ("POST", "/v1/chat/completions", {"model": "m", "messages": []}),
    ):
        direct = web.request(method, simulator.url + path, json=body)
        via = web.request(method, gateway.url + path + "", json=body)
        assert via.status_code == direct.status_code == 200
        assert json.loads(via.content) == json.loads(direct.content)
        assert b": gateway" not in via.content


def test_query_string_is_forwarded(gateway: ServerThread, simulator: ServerThread) -> None:
    web.get(gateway.url + "/v1/models?limit=3&after=a%20b", headers={"x-request-id": "q-1"})
    record = _sim_record(simulator, "q-1")
    assert record is not None
    assert record["query"] == "limit=3&after=a%20b"


def _disconnected(simulator: ServerThread, rid: str) -> dict[str, object] | None:
    record = _sim_record(simulator, rid)
    return record if record is not None and record["disconnected"] else None


def _open_and_abandon(simulator: ServerThread, port: int, rid: str, fault: str) -> None:
    """Send a request whose upstream stalls (for an hour), then hang up while it waits."""
    body = json.dumps(CHAT).encode()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(
            (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-ID: {rid}\r\n"
                f"x-sim-fault: {fault}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode()
            + body
        )
        if fault == "stall_mid_stream":  # the stream has started
            conn.settimeout(WAIT_SECONDS)
            assert conn.recv(65536).startswith(b"HTTP/1.1 200")
        else:  # the upstream has the request and has not answered
            wait_until(lambda: _sim_record(simulator, rid), "the request at the upstream")


@pytest.mark.parametrize("fault", ["stall_mid_stream", "stall_before_headers"])
def test_client_disconnect_closes_the_upstream(simulator: ServerThread, fault: str) -> None:
    # Nothing else could close the upstream connection within the wait: the stall
    # lasts an hour and the deadlines are ten minutes. So the upstream sees the
    # connection closed because the client left, however slow the machine is.
    rid = f"disc-{fault}"
    with gateway_for(
        simulator.url + "/v1", timeouts={"first_byte": 600, "idle": 600, "total": 600}
    ) as gw:
        _open_and_abandon(simulator, gw.port, rid, fault)
        record = wait_until(lambda: _disconnected(simulator, rid), "the upstream to be closed")
        assert record["completed"] is False
        metrics = settled_metrics(gw.url, requests=1)
    labels = {"outcome": "incomplete", "reason": "client_disconnect"}
    assert metric_value(metrics, "gateway_streams_total", **labels) == 1
    assert metric_value(metrics, "gateway_active_streams") == 0


def test_stream_over_the_response_limit_is_limit_exceeded(simulator: ServerThread) -> None:
    with gateway_for(simulator.url + "/v1", limits={"max_response_bytes": 20_000}) as gw:
        body = web.post(
            gw.url + "/v1/chat/completions",
            json=CHAT,
            headers={"x-sim-tokens": "2000"},
            timeout=10,
        ).content
        assert annotation(body)["reason"] == "limit_exceeded"
        assert len(body) < 21_000


def test_event_over_the_event_budget_is_limit_exceeded(simulator: ServerThread) -> None:
    with gateway_for(
        simulator.url + "/v1", limits={"max_event_bytes": 10_000, "max_line_bytes": 10_000}
    ) as gw:
        body = web.post(
            gw.url + "/v1/chat/completions",
            json=CHAT,
            headers={"x-sim-fault": "huge_event", "x-sim-chunk-bytes": "50000"},
            timeout=10,
        ).content
        assert annotation(body)["reason"] == "limit_exceeded"
        assert len(body) < 10_000


def test_unknown_path_is_a_json_404(gateway: ServerThread) -> None:
    response = web.get(gateway.url + "/nope")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "no_route"


def test_health_endpoints(gateway: ServerThread) -> None:
    assert web.get(gateway.url + "/healthz").status_code == 200
    assert web.get(gateway.url + "/readyz").status_code == 200


def test_annotation_can_be_turned_off(simulator: ServerThread) -> None:
    with gateway_for(simulator.url + "/v1", annotate=False) as gw:
        headers = {"x-sim-seed": "7"}
        direct = web.post(simulator.url + "/v1/chat/completions", json=CHAT, headers=headers)
        via = web.post(gw.url + "/v1/chat/completions", json=CHAT, headers=headers)
        assert via.content == direct.content  # the upstream's bytes, nothing appended
        cut = web.post(
            gw.url + "/v1/chat/completions",
            json=CHAT,
            headers=headers | {"x-sim-fault": "invalid_json"},
        )
        assert b": gateway" not in cut.content
        assert b"stream_incomplete" not in cut.content
        metrics = settled_metrics(gw.url, requests=2)
        # the verdict is still recorded
        assert metric_value(metrics, "gateway_streams_total", reason="invalid_json") == 1


FORGED = b": gateway outcome=complete reason=stop request_id=FAKE\n"


ERROR_EVENT = b'data: {"error":{"message":"boom","type":"server_error"}}\n\n'


CUT_CHAT = b'data: {"choices":[{"index":0,"delta":{"content":"hel"}}]}\n\n'


async def _answer_forged(
    request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """A forged annotation (bare, and inside a block), a heartbeat, then an error."""
    body = (
        FORGED
        + b": keepalive\n"
        + CUT_CHAT[:-1]
        + b":gateway outcome=complete reason=stop request_id=FAKE2\r\n\n"
        + ERROR_EVENT
    )
    writer.write(sse_head(b"connection: close\r\n") + chunk(body) + b"0\r\n\r\n")
    await writer.drain()


def test_an_upstream_comment_posing_as_the_annotation_is_never_relayed() -> None:
    with raw_upstream(_answer_forged) as upstream, gateway_for(upstream.url + "/v1") as gw:
        body = web.post(gw.url + "/v1/chat/completions", json=CHAT | {"model": "m"}).content
        text = settled_metrics(gw.url, requests=1)
    assert b"FAKE" not in body
    assert body.count(b"gateway outcome=") == 1
    assert annotation(body)["reason"] == "upstream_error"
    assert body.startswith(b": keepalive\n" + CUT_CHAT[:-1] + b"\n" + ERROR_EVENT)
    assert metric_value(text, "gateway_forged_annotations_total", route="default") == 2
