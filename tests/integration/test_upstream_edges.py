"""The upstream side's edges: the request target as sent, base URLs with a query,
broken answers (a bad head, a bad chunk size), and the exit status after a drain.

The upstream here is a raw asyncio socket server (``raw_upstream``): it records
the request line exactly as the gateway wrote it, and sends what no HTTP
server library would.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from gateway.proxy.upstream import create_upstream
from tests import web
from tests.conftest import ServerThread, gateway_process
from tests.integration.helpers import access_log_line, annotation, gateway_for, metric_value
from tests.integration.raw_upstream import (
    CHAT_STREAM,
    RawRequest,
    RawUpstream,
    chunk,
    raw_upstream,
    sse_head,
)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
TRANSPORTS = ("aiohttp", "httpx")


async def answer_json(
    request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    body = b'{"ok": true}'
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n" % len(body) + body
    )
    await writer.drain()


def raw_exchange(port: int, target: str, headers: str = "") -> tuple[int, bytes]:
    """Send a GET with ``target`` as it is (no client library re-encodes it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as conn:
        conn.sendall(
            f"GET {target} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n".encode()
        )
        raw = b""
        while data := conn.recv(65536):
            raw += data
    return int(raw.split(b" ", 2)[1]), raw


@pytest.fixture(scope="module", params=TRANSPORTS)
def edge(request: pytest.FixtureRequest) -> Iterator[tuple[ServerThread, RawUpstream]]:
    """A gateway (one per upstream transport) in front of a raw upstream."""
    with (
        raw_upstream(answer_json) as upstream,
        gateway_for(
            upstream.url + "/v1",
            upstream_transport=request.param,
            access_log=True,
            timeouts={"first_byte": 30.0, "idle": 30.0, "total": 60.0},
        ) as gw,
    ):
        yield gw, upstream


@pytest.fixture
def fresh(edge: tuple[ServerThread, RawUpstream]) -> tuple[ServerThread, RawUpstream]:
    gw, upstream = edge
    upstream.requests.clear()
    upstream.respond = answer_json
    return gw, upstream


# ------------------------------------------------------------ the request target


@pytest.mark.parametrize(
    "path",
    [
        "/v1/..;/admin",
        "/v1/foo/..;/..;/x",
        "/v1/..;jsessionid=1/admin",
        "/v1/.;/models",
        "/v1/..%3b/admin",
        "/v1/..%3B/admin",
        "/v1/%2e%2e;/admin",
        "/v1/.%2e;/admin",
    ],
)
def test_matrix_parameter_traversal_is_400_and_never_forwarded(
    fresh: tuple[ServerThread, RawUpstream], path: str
) -> None:
    gw, upstream = fresh
    status, raw = raw_exchange(gw.port, path)
    assert status == 400, raw
    assert b'"code":"bad_path"' in raw.replace(b" ", b"")
    assert upstream.requests == []


TARGETS = [
    "/v1/models?p=a%2Fb%3Fc",
    "/v1/files/a;b=c/x%7Ey?q=%7e~&r=a+b&s=%zz&t=%20&u=%E2%82%AC",
    '/v1/x{y}|z^?q="<>`',
    "/v1/x?a=1&a=2&&b=&=c",
    # Longer than the 256 bytes whose aiohttp URL is cached: built per request.
    "/v1/models?long=" + "a%2Fb" * 60,
]


@pytest.mark.parametrize("target", TARGETS)
def test_path_and_query_reach_the_upstream_byte_for_byte(
    fresh: tuple[ServerThread, RawUpstream], target: str
) -> None:
    gw, upstream = fresh
    status, raw = raw_exchange(gw.port, target)
    assert status == 200, raw
    (seen,) = upstream.requests
    # The base URL is <upstream>/v1, the route prefix /v1: the target is unchanged.
    assert seen.target == target.encode()


def test_base_url_query_is_merged_and_the_operators_parameters_win() -> None:
    with raw_upstream(answer_json) as upstream:
        base = upstream.url + "/openai/deployments/d1?api-version=2024-10-21"
        routes = [{"name": "azure", "prefix": "/v1", "upstream": base}]
        with gateway_for("", routes=routes) as gw:
            cases = {
                "/v1/chat/completions": "/openai/deployments/d1/chat/completions"
                "?api-version=2024-10-21",
                "/v1/chat/completions?user=a%2Fb&n=1": "/openai/deployments/d1/chat/completions"
                "?api-version=2024-10-21&user=a%2Fb&n=1",
                # a client cannot override the operator's api-version, however it spells it
                "/v1/chat/completions?api-version=evil&API-Version=x&api%2Dversion=y"
                "&z=1;api-version=w&keep=1": "/openai/deployments/d1/chat/completions"
                "?api-version=2024-10-21&keep=1",
                "/v1": "/openai/deployments/d1?api-version=2024-10-21",
            }
            for sent, expected in cases.items():
                upstream.requests.clear()
                status, raw = raw_exchange(gw.port, sent)
                assert status == 200, raw
                (seen,) = upstream.requests
                assert seen.target == expected.encode(), sent
                host = seen.header_values(b"host")
                assert host == [f"127.0.0.1:{upstream.port}".encode()]


# ------------------------------------------------------------ broken answers


# Over the limits of both transports: aiohttp takes 8190 bytes a line and 128
# fields, httpcore (h11) 100 KiB of an unfinished head.
BAD_HEADS = {
    "header_over_the_limit": b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * 300_000 + b"\r\n\r\n",
    "too_many_headers": b"HTTP/1.1 200 OK\r\n"
    + b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 1000) for i in range(300))
    + b"\r\n",
    "bad_status_line": b"HTTP/1.1 abc OK\r\ncontent-length: 0\r\n\r\n",
    "not_http": b"garbage garbage\r\n\r\n",
    "bad_header_name": b"HTTP/1.1 200 OK\r\nx y: z\r\ncontent-length: 0\r\n\r\n",
}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
@pytest.mark.parametrize("head", list(BAD_HEADS))
def test_a_malformed_or_oversized_head_is_a_bad_upstream_response(
    fresh: tuple[ServerThread, RawUpstream],
    capsys: pytest.CaptureFixture[str],
    head: str,
    stream: bool,
) -> None:
    gw, upstream = fresh

    async def bad_head(
        request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writer.write(BAD_HEADS[head])
        await writer.drain()

    upstream.respond = bad_head
    rid = f"bad-head-{head}-{stream}"
    before = web.get(gw.url + "/metrics").text
    response = web.post(
        gw.url + "/v1/chat/completions",
        json=dict(CHAT, stream=stream),
        headers={"x-request-id": rid},
        timeout=20,
    )
    assert response.status_code == 502
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == "upstream_disconnect"
    for leak in ("127.0.0.1", "aiohttp", "h11", "traceback", "garbage"):
        assert leak not in response.text.lower()
    entry = access_log_line(capsys, rid)
    assert (entry["status"], entry["error"]) == (502, "upstream_bad_response")
    after = web.get(gw.url + "/metrics").text
    labels = {"outcome": "incomplete", "reason": "upstream_disconnect"}
    counted = metric_value(after, "gateway_streams_total", **labels) - metric_value(
        before, "gateway_streams_total", **labels
    )
    assert counted == (1 if stream else 0)
    assert entry["reason"] == ("upstream_disconnect" if stream else None)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_bad_chunk_size_mid_stream_is_upstream_disconnect_at_once(transport: str) -> None:
    """A valid head, one good event, then ``zz``: the verdict comes at once, not when
    the 30 s idle timeout fires (the client waits at most 10 s for it)."""
    first_event_seen = threading.Event()
    event = CHAT_STREAM.split(b"\n\n")[0] + b"\n\n"

    async def bad_chunk(
        request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writer.write(sse_head() + chunk(event))
        await writer.drain()
        # Once the client has the good event, the bad chunk size.
        await asyncio.to_thread(first_event_seen.wait, 20)
        writer.write(b"zz\r\nnot a chunk\r\n")
        await writer.drain()
        # The connection stays open until the gateway closes it: only the parse
        # error can end the stream before the idle timeout.
        await reader.read()

    with (
        raw_upstream(bad_chunk) as upstream,
        gateway_for(
            upstream.url + "/v1",
            upstream_transport=transport,
            timeouts={"first_byte": 30.0, "idle": 30.0, "total": 60.0},
        ) as gw,
    ):
        body = b""
        timeout = httpx.Timeout(10.0)
        with web.stream(
            "POST", gw.url + "/v1/chat/completions", json=CHAT, timeout=timeout
        ) as response:
            assert response.status_code == 200
            for data in response.iter_raw():
                body += data
                if event in body:
                    first_event_seen.set()
        assert body.startswith(event)
        note = annotation(body)
        assert (note["outcome"], note["reason"]) == ("incomplete", "upstream_disconnect")
        metrics = web.get(gw.url + "/metrics").text
        assert (
            metric_value(
                metrics, "gateway_streams_total", outcome="incomplete", reason="upstream_disconnect"
            )
            == 1
        )
        assert metric_value(metrics, "gateway_active_streams") == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_idle_upstream_connection_is_closed_before_the_upstream_closes_it(
    transport: str,
) -> None:
    """An upstream closes an idle connection when its own keep-alive runs out (uvicorn,
    vLLM, Node: 5 s); a POST written on it just then fails, and is never sent twice
    (502 ``upstream_disconnect``). This upstream is that race at its worst: it answers
    one request per connection and closes the connection when a second one arrives on
    it. With ``upstream_keepalive_seconds`` shorter than the idle time, the gateway
    has closed the connection itself and opens a new one; with a keep-alive longer
    than the idle time (what the gateway had, 30 s), the second request fails."""

    async def one_per_connection(
        request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writer.write(sse_head() + chunk(CHAT_STREAM) + b"0\r\n\r\n")
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")  # a second request: closed unanswered

    def two_requests(keepalive: float) -> list[httpx.Response]:
        with (
            raw_upstream(one_per_connection) as upstream,
            gateway_for(
                upstream.url + "/v1",
                upstream_transport=transport,
                upstream_keepalive_seconds=keepalive,
            ) as gw,
        ):
            first = web.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)
            time.sleep(0.5)  # idle: past a 0.1 s keep-alive (longer under load, never less)
            second = web.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)
        return [first, second]

    for answer in two_requests(0.1):
        assert answer.status_code == 200
        assert annotation(answer.content)["outcome"] == "complete"
    first, second = two_requests(30.0)
    assert annotation(first.content)["outcome"] == "complete"
    assert second.status_code == 502
    assert second.json()["error"]["code"] == "upstream_disconnect"


# ------------------------------------------------------------ exit status


def test_sigterm_exits_0_after_the_drain() -> None:
    with gateway_process(
        ["--simulator", "--drain-timeout", "5"], env={"GATEWAY_ACCESS_LOG": "false"}
    ) as gw:
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(timeout=30) == 0


def test_sigterm_exits_0_after_an_in_flight_stream_finishes_in_the_drain(
    simulator: ServerThread,
) -> None:
    with gateway_process(
        ["--upstream", simulator.url + "/v1", "--drain-timeout", "20"],
        env={"GATEWAY_ACCESS_LOG": "false"},
    ) as gw:
        # 15 deltas at 10 per second: the stream outlives the signal by about a second.
        headers = {"x-sim-tokens": "15", "x-sim-tps": "10"}
        body = b""
        with web.stream(
            "POST", gw.url + "/v1/chat/completions", json=CHAT, headers=headers, timeout=20
        ) as response:
            for data in response.iter_raw():
                if not body:  # in flight: now stop the gateway
                    gw.proc.send_signal(signal.SIGTERM)
                body += data
        note = annotation(body)
        assert (note["outcome"], note["reason"]) == ("complete", "stop")
        assert gw.proc.wait(timeout=30) == 0


def test_a_response_in_flight_keeps_neither_its_request_nor_the_request_headers() -> None:
    """An idle stream holds its response for minutes: the request (its headers, the
    credential among them, and its body) is not kept alive through it."""

    async def exchange(url: str) -> None:
        upstream = create_upstream("aiohttp", 10, 5.0)
        request = upstream.request(
            "POST",
            url + "/v1/chat/completions",
            [(b"authorization", b"Bearer sk-secret"), (b"content-type", b"application/json")],
            b'{"stream": true}',
        )
        response = await upstream.send(request)
        try:
            with pytest.raises(RuntimeError):
                _ = response.request  # httpx: no request was attached
            info = response.stream._response.request_info  # type: ignore[attr-defined]
            assert info.method == "POST"
            assert info.url.path == "/v1/chat/completions"
            assert len(info.headers) == 0
            body = b"".join([chunk async for chunk in response.aiter_raw()])
            assert body.startswith(b"data: ")
            assert body.endswith(b"data: [DONE]\n\n")
        finally:
            await response.aclose()
            await upstream.aclose()

    with raw_upstream() as up:
        asyncio.run(exchange(up.url))
        (seen,) = up.requests
        assert (b"authorization", b"Bearer sk-secret") in seen.headers  # it was sent
