"""Upstream pools end to end: failover before the first byte, passive health, balancing.

Real gateways on loopback ports in front of real upstreams: simulators that
fail as a whole (their default fault), and raw sockets for what an HTTP
server will not do (a bad head, a stream cut before its first event). Which
upstream a request tries first is the pool's choice, at random by weight: the
failing upstream gets the larger weight, and a scenario is repeated until a
request did try it (``first_on``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import pytest

from gateway.app import create_app
from gateway.server.edge import uvicorn_options
from gateway.settings import load_settings
from gateway.simulator import create_simulator_app, expected_text
from tests import web
from tests.cli import run_cli
from tests.conftest import ServerThread, running
from tests.integration.control import WAIT_SECONDS
from tests.integration.helpers import (
    access_log_lines,
    annotation,
    assert_whole_events,
    gateway_for,
    metric_value,
)
from tests.integration.raw_upstream import (
    CHAT_STREAM,
    RawRequest,
    RawUpstream,
    chunk,
    raw_upstream,
    sse_head,
)
from tests.sdk import anthropic, openai

T = TypeVar("T")

CHAT = {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}], "stream": True}
TEXT = expected_text(20)
ATTEMPTS = "gateway_upstream_attempts_total"


# -- upstreams ----------------------------------------------------------------------------


def _simulator(**defaults: Any) -> Iterator[ServerThread]:
    with running(create_simulator_app(**defaults)) as server:
        yield server


@pytest.fixture(scope="module")
def healthy() -> Iterator[ServerThread]:
    yield from _simulator()


@pytest.fixture(scope="module")
def unavailable() -> Iterator[ServerThread]:
    """503 with ``retry-after: 1`` to every request."""
    yield from _simulator(default_fault="status", default_status=503)


@pytest.fixture(scope="module")
def broken() -> Iterator[ServerThread]:
    """500 (no Retry-After) to every request."""
    yield from _simulator(default_fault="status", default_status=500)


@pytest.fixture(scope="module")
def limited() -> Iterator[ServerThread]:
    """429 with ``retry-after: 1`` to every request."""
    yield from _simulator(default_fault="status", default_status=429)


@pytest.fixture(scope="module")
def refusing() -> Iterator[ServerThread]:
    """400 to every request: the client's fault."""
    yield from _simulator(default_fault="status", default_status=400)


@pytest.fixture(scope="module")
def stalling() -> Iterator[ServerThread]:
    """Sends no head for an hour (a client that leaves ends the stall)."""
    yield from _simulator(default_fault="stall_before_headers")


@pytest.fixture(scope="module")
def cutting() -> Iterator[ServerThread]:
    """A few deltas, then the body is cut without its terminating chunk."""
    yield from _simulator(default_fault="abort_mid_body")


def up(name: str, url: str, **options: Any) -> dict[str, Any]:
    return {"name": name, "url": url, **options}


def pool(*upstreams: dict[str, Any], **route: Any) -> list[dict[str, Any]]:
    return [{"name": "chat", "prefix": "/v1", "upstreams": list(upstreams), **route}]


def pair(primary: Any, fallback: ServerThread, weight: int = 100) -> list[dict[str, Any]]:
    """A route whose heavy "primary" (tried first nearly always) fails over to "fallback"."""
    return pool(
        up("primary", primary.url + "/v1", weight=weight), up("fallback", fallback.url + "/v1")
    )


def sim_saw(server: ServerThread, request_id: str) -> dict[str, Any] | None:
    """What a simulator recorded of one request, or None when it never got it."""
    response = web.get(f"{server.url}/_sim/requests/{request_id}")
    return response.json() if response.status_code == 200 else None


def raw_saw(upstream: RawUpstream, request_id: str) -> list[RawRequest]:
    return [
        r for r in upstream.requests if r.header_values(b"x-request-id") == [request_id.encode()]
    ]


def metrics(gateway: ServerThread) -> str:
    return web.get(gateway.url + "/metrics").text


def first_on(gateway: ServerThread, upstream: str, send: Callable[[str], T], tag: str) -> T:
    """Send fresh requests (``send(request_id)``) until one was attempted on ``upstream``
    (the pool picks at random by weight); return what that one's ``send`` returned.

    Bounded by time, not by a count: an upstream that a ``Retry-After`` keeps out gets
    requests again only once that has passed, however fast the requests go."""
    deadline = time.monotonic() + WAIT_SECONDS
    sent = 0
    while True:
        before = metric_value(metrics(gateway), ATTEMPTS, upstream=upstream)
        result = send(f"{tag}-{sent}")
        sent += 1
        if metric_value(metrics(gateway), ATTEMPTS, upstream=upstream) > before:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"none of {sent} requests was attempted on {upstream}")


def stream(gateway: ServerThread, request_id: str, body: Any = CHAT) -> httpx.Response:
    return web.post(
        gateway.url + "/v1/chat/completions",
        json=body,
        headers={"x-request-id": request_id},
        timeout=30,
    )


def chat_text(body: bytes) -> str:
    """The text of a Chat stream as a client assembles it (content deltas of choice 0)."""
    text = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            event = json.loads(line[6:])
            for choice in event.get("choices", []):
                text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


def assert_complete_from(response: httpx.Response, upstream: str) -> None:
    assert response.status_code == 200, response.text
    assert response.headers["x-gateway-upstream"] == upstream
    assert annotation(response.content)["outcome"] == "complete"
    assert response.content.count(b": gateway outcome=") == 1
    assert chat_text(response.content) == TEXT


# -- raw upstreams for what a server library will not send ---------------------------------


async def _eof_before_first_event(
    request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """A clean end of an event stream before any event (a comment only)."""
    writer.write(sse_head() + chunk(b": starting\n\n") + b"0\r\n\r\n")
    await writer.drain()


async def _cut_before_first_event(
    request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """The head and a heartbeat, then the connection closes without the body's end."""
    writer.write(sse_head() + chunk(b": ping\n\n"))
    await writer.drain()


async def _bad_head(
    request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    writer.write(b"HTTP/1.1 two hundred\r\n\r\n")
    await writer.drain()


async def _silent_after_head(
    request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """The head of an event stream, then nothing until the gateway leaves."""
    writer.write(sse_head())
    await writer.drain()
    await reader.read()


async def _error_event_first(
    request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """A 200 stream whose first event is the upstream's own error (an overloaded server)."""
    error = b'data: {"error": {"message": "overloaded", "type": "server_error"}}\n\n'
    writer.write(sse_head(b"connection: close\r\n") + chunk(error) + b"0\r\n\r\n")
    await writer.drain()


# -- failover on each retryable cause -------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "result"),
    [
        ("unavailable", "status_5xx"),
        ("broken", "status_5xx"),
        ("limited", "status_429"),
    ],
)
def test_a_failing_status_is_answered_by_the_other_upstream(
    request: pytest.FixtureRequest, healthy: ServerThread, fixture: str, result: str
) -> None:
    failing: ServerThread = request.getfixturevalue(fixture)
    routes = pool(
        up("primary", failing.url + "/v1", weight=100), up("fallback", healthy.url + "/v1")
    )
    with gateway_for("", routes=routes) as gw:
        response = first_on(gw, "primary", lambda rid: stream(gw, rid), f"status-{fixture}")
        assert_complete_from(response, "fallback")
        rid = response.headers["x-request-id"]
        assert sim_saw(failing, rid) is not None
        assert sim_saw(healthy, rid) is not None
        text = metrics(gw)
        assert metric_value(text, ATTEMPTS, upstream="primary", result=result) == 1
        assert metric_value(text, ATTEMPTS, upstream="fallback", result="ok") >= 1
        # One verdict per stream request, however many attempts it took.
        requests = metric_value(text, "gateway_requests_total")
        assert metric_value(text, "gateway_streams_total") == requests
        assert metric_value(text, "gateway_streams_total", outcome="complete") == requests
        assert metric_value(text, "gateway_upstream_active_streams") == 0


@pytest.mark.parametrize(
    ("responder", "result"),
    [
        (_eof_before_first_event, "early_eof"),
        (_cut_before_first_event, "early_eof"),
        (_bad_head, "early_eof"),
        (_error_event_first, "early_eof"),
    ],
)
def test_an_answer_that_breaks_before_its_first_event_is_retried(
    healthy: ServerThread, responder: Any, result: str
) -> None:
    with raw_upstream(responder) as raw:
        routes = pool(
            up("primary", raw.url + "/v1", weight=100), up("fallback", healthy.url + "/v1")
        )
        with gateway_for("", routes=routes) as gw:
            response = first_on(gw, "primary", lambda rid: stream(gw, rid), "early")
            assert_complete_from(response, "fallback")
            assert len(raw_saw(raw, response.headers["x-request-id"])) == 1
            text = metrics(gw)
            assert metric_value(text, ATTEMPTS, upstream="primary", result=result) == 1
            assert metric_value(text, "gateway_streams_total", outcome="incomplete") == 0


def test_an_unreachable_upstream_is_retried(healthy: ServerThread, dead_port: int) -> None:
    closed = f"http://127.0.0.1:{dead_port}/v1"
    routes = pool(up("primary", closed, weight=100), up("fallback", healthy.url + "/v1"))
    with gateway_for("", routes=routes) as gw:
        response = first_on(gw, "primary", lambda rid: stream(gw, rid), "connect")
        assert_complete_from(response, "fallback")
        text = metrics(gw)
        assert metric_value(text, ATTEMPTS, upstream="primary", result="connect_error") == 1
        # A plain (non-streamed) request fails over the same way.
        answer = first_on(
            gw,
            "primary",
            lambda rid: stream(gw, rid, CHAT | {"stream": False}),
            "connect-plain",
        )
        assert answer.status_code == 200
        assert answer.headers["x-gateway-upstream"] == "fallback"
        assert answer.json()["choices"][0]["message"]["content"] == TEXT


@pytest.mark.parametrize("where", ["before the head", "after the head"])
def test_a_first_byte_timeout_is_retried_only_when_the_route_opts_in(
    stalling: ServerThread, healthy: ServerThread, where: str
) -> None:
    # Request ids of their own per case: the healthy simulator is the module's, and a
    # first request the pool sent there in the other case must not be taken for this one's.
    case = where.replace(" ", "-")
    with raw_upstream(_silent_after_head) as raw:
        slow_url = stalling.url + "/v1" if where == "before the head" else raw.url + "/v1"
        slow = up("primary", slow_url, weight=100, timeouts={"first_byte": 0.5})
        fallback = up("fallback", healthy.url + "/v1")
        with gateway_for("", routes=pool(slow, fallback)) as gw:
            response = first_on(gw, "primary", lambda rid: stream(gw, rid), f"fbt-default-{case}")
            # Not retried by default: the slow upstream may bill the generation it started.
            rid = response.headers["x-request-id"]
            assert sim_saw(healthy, rid) is None
            if where == "before the head":
                assert response.status_code == 504
                assert response.json()["error"]["code"] == "first_byte_timeout"
            else:
                assert response.headers["x-gateway-upstream"] == "primary"
                assert annotation(response.content)["reason"] == "first_byte_timeout"
            assert metric_value(metrics(gw), ATTEMPTS, upstream="primary", result="timeout") == 1
        routes = pool(slow, fallback, retry_on=["connect", "5xx", "first_byte_timeout"])
        with gateway_for("", routes=routes) as gw:
            response = first_on(gw, "primary", lambda rid: stream(gw, rid), f"fbt-opt-in-{case}")
            assert_complete_from(response, "fallback")
            assert metric_value(metrics(gw), ATTEMPTS, upstream="primary", result="timeout") == 1


async def _heartbeat_then_stream(
    request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """A heartbeat comment, a pause, then a whole stream in one piece."""
    writer.write(sse_head(b"connection: close\r\n") + chunk(b": ping\n\n"))
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.write(chunk(CHAT_STREAM) + b"0\r\n\r\n")
    await writer.drain()


async def _plain_cut_before_its_body(
    request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
    )
    await writer.drain()


def test_a_held_head_goes_out_with_what_was_read_while_it_was_held(
    healthy: ServerThread,
) -> None:
    """The heartbeat before the first event, then the whole stream (in one read): the
    client gets exactly the upstream's bytes and one annotation."""
    with (
        raw_upstream(_heartbeat_then_stream) as raw,
        gateway_for("", routes=pair(raw, healthy)) as gw,
    ):
        response = first_on(gw, "primary", lambda rid: stream(gw, rid), "held")
        assert response.headers["x-gateway-upstream"] == "primary"
        rid = response.headers["x-request-id"]
        assert response.content == (
            b": ping\n\n" + CHAT_STREAM + b": gateway outcome=complete reason=stop "
            b"request_id=" + rid.encode() + b"\n"
        )
        assert sim_saw(healthy, rid) is None
        text = metrics(gw)
        assert metric_value(text, ATTEMPTS, upstream="primary", result="ok") == 1
        assert metric_value(text, "gateway_time_to_first_byte_seconds_count") >= 1


def test_a_plain_answer_cut_before_its_first_byte_is_retried(healthy: ServerThread) -> None:
    with (
        raw_upstream(_plain_cut_before_its_body) as raw,
        gateway_for("", routes=pair(raw, healthy)) as gw,
    ):
        plain = CHAT | {"stream": False}
        answer = first_on(gw, "primary", lambda rid: stream(gw, rid, plain), "plain-cut")
        assert answer.status_code == 200
        assert answer.headers["x-gateway-upstream"] == "fallback"
        assert answer.json()["choices"][0]["message"]["content"] == TEXT
        result = "early_eof"
        assert metric_value(metrics(gw), ATTEMPTS, upstream="primary", result=result) == 1


def test_a_pool_of_healthy_upstreams_answers_exactly_as_one_does(healthy: ServerThread) -> None:
    """Held or not (a first attempt holds, a pool of one never does), the same bytes."""
    with gateway_for(healthy.url + "/v1") as single:
        one = stream(single, "same-1")
        one_plain = stream(single, "same-1p", CHAT | {"stream": False, "sim": {"seed": 3}})
    routes = pool(up("a", healthy.url + "/v1"), up("b", healthy.url + "/v1"))
    with gateway_for("", routes=routes) as gw:
        two = stream(gw, "same-1")
        two_plain = stream(gw, "same-1p", CHAT | {"stream": False, "sim": {"seed": 3}})
        assert metric_value(metrics(gw), ATTEMPTS, result="ok") == 2
    assert two.content == one.content
    assert two_plain.content == one_plain.content
    assert two.headers["x-gateway-upstream"] in ("a", "b")


def test_a_client_that_leaves_while_the_head_is_held_frees_its_upstream(
    healthy: ServerThread,
) -> None:
    with (
        raw_upstream(_silent_after_head) as raw,
        gateway_for("", routes=pair(raw, healthy, 1000)) as gw,
    ):
        for _ in range(40):  # until one request went to the silent upstream first
            try:
                response = web.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=2)
            except httpx.ReadTimeout:  # the client leaves: nothing came in 2 s
                if raw.requests:
                    break
                continue  # only a loaded machine's slow answer from the healthy one
            assert_complete_from(response, "fallback")
        assert len(raw.requests) == 1
        loop = asyncio.new_event_loop()
        deadline = loop.time() + 10
        while True:  # the gateway notices the client left, and lets the upstream go
            text = metrics(gw)
            if metric_value(text, ATTEMPTS, upstream="primary") == 1:
                break
            assert loop.time() < deadline, "the attempt never ended"
            loop.run_until_complete(asyncio.sleep(0.02))
        loop.close()
        assert metric_value(text, ATTEMPTS, upstream="primary", result="incomplete") == 1
        assert metric_value(text, "gateway_upstream_active_streams") == 0
        assert metric_value(text, "gateway_streams_total", reason="client_disconnect") == 1
        assert metric_value(text, "gateway_upstream_ejected", upstream="primary") == 0


# -- what is never retried --------------------------------------------------------------------


@pytest.mark.parametrize("fault_fixture", ["cutting"])
def test_nothing_is_retried_once_a_byte_reached_the_client(
    request: pytest.FixtureRequest, healthy: ServerThread, fault_fixture: str
) -> None:
    cutting: ServerThread = request.getfixturevalue(fault_fixture)
    routes = pool(
        up("primary", cutting.url + "/v1", weight=100), up("fallback", healthy.url + "/v1")
    )
    with gateway_for("", routes=routes) as gw:
        response = first_on(gw, "primary", lambda rid: stream(gw, rid), "after-first-byte")
        assert response.headers["x-gateway-upstream"] == "primary"
        rid = response.headers["x-request-id"]
        assert sim_saw(healthy, rid) is None
        body = response.content
        assert body.count(b": gateway outcome=") == 1
        assert body.count(b'"stream_incomplete"') == 1
        assert annotation(body) == {
            "outcome": "incomplete",
            "reason": "upstream_disconnect",
            "rid": rid,
        }
        before_annotation = body[: body.index(b'data: {"error"')]
        assert_whole_events(before_annotation)
        text = chat_text(before_annotation)
        assert text
        assert TEXT.startswith(text)  # once, never twice
        assert len(text) < len(TEXT)
        assert metric_value(metrics(gw), ATTEMPTS, upstream="primary", result="incomplete") == 1


def test_a_4xx_travels_back_unchanged_and_is_not_retried(
    refusing: ServerThread, healthy: ServerThread
) -> None:
    routes = pool(
        up("primary", refusing.url + "/v1", weight=100), up("fallback", healthy.url + "/v1")
    )
    with gateway_for("", routes=routes) as gw:
        response = first_on(gw, "primary", lambda rid: stream(gw, rid), "4xx")
        assert response.status_code == 400
        assert response.headers["x-gateway-upstream"] == "primary"
        assert "Simulated upstream error (status 400)" in response.json()["error"]["message"]
        assert sim_saw(healthy, response.headers["x-request-id"]) is None
        text = metrics(gw)
        assert metric_value(text, ATTEMPTS, upstream="primary", result="status_4xx") == 1
        assert metric_value(text, "gateway_streams_total", reason="upstream_status") == 1


@pytest.mark.parametrize("max_attempts", [1, 2, 3])
def test_max_attempts_is_honoured_and_the_last_answer_is_relayed(
    broken: ServerThread, max_attempts: int
) -> None:
    # Three upstreams, all failing: the same simulator under three names.
    upstreams = [up(name, broken.url + "/v1") for name in ("a", "b", "c")]
    with gateway_for("", routes=pool(*upstreams, max_attempts=max_attempts)) as gw:
        response = stream(gw, f"max-{max_attempts}")
        assert response.status_code == 500
        assert "Simulated upstream error (status 500)" in response.json()["error"]["message"]
        text = metrics(gw)
        assert metric_value(text, ATTEMPTS) == max_attempts
        assert metric_value(text, ATTEMPTS, result="status_5xx") == max_attempts
        for name in ("a", "b", "c"):  # each upstream at most once per request
            assert metric_value(text, ATTEMPTS, upstream=name) <= 1
        assert metric_value(text, "gateway_streams_total", reason="upstream_status") == 1
        tried = {k: v for k, v in response.headers.items() if k == "x-gateway-upstream"}
        assert tried["x-gateway-upstream"] in ("a", "b", "c")


def test_the_total_deadline_ends_the_attempts(stalling: ServerThread) -> None:
    """Each attempt may take first_byte (4 s), the request only total (6 s): the
    second attempt is cut by the deadline and no third one starts. (At 0.6 s and
    1.0 s, a loaded loop's late first timeout left the deadline no second attempt; 2 s
    and 3.5 s left a margin of 1.5 s, 4 s and 6 s leave 2 s either side.)"""
    upstreams = [up(name, stalling.url + "/v1") for name in ("a", "b", "c")]
    routes = pool(
        *upstreams,
        max_attempts=3,
        retry_on=["first_byte_timeout"],
        timeouts={"first_byte": 4.0, "total": 6.0},
    )
    with gateway_for("", routes=routes) as gw:
        response = stream(gw, "deadline")
        assert response.status_code == 504
        assert response.json()["error"]["code"] == "total_timeout"
        text = metrics(gw)
        assert metric_value(text, ATTEMPTS, result="timeout") == 2
        assert metric_value(text, ATTEMPTS) == 2
        assert metric_value(text, "gateway_streams_total", reason="total_timeout") == 1


# -- Retry-After, ejection and recovery ---------------------------------------------------------


def _rate_limited(retry_after: bytes) -> Any:
    async def respond(
        request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        body = b'{"error": {"message": "slow down", "type": "rate_limit_error"}}'
        writer.write(
            b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
            b"retry-after: " + retry_after + b"\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body
        )
        await writer.drain()

    return respond


def test_retry_after_keeps_requests_away_until_it_passes(healthy: ServerThread) -> None:
    with raw_upstream(_rate_limited(b"3600")) as raw:
        routes = pool(
            up("primary", raw.url + "/v1", weight=1000), up("fallback", healthy.url + "/v1")
        )
        with gateway_for("", routes=routes) as gw:
            response = first_on(gw, "primary", lambda rid: stream(gw, rid), "cool")
            assert_complete_from(response, "fallback")
            # Weight 1000 to 1 would send nearly every request to primary: it is cooling down.
            for i in range(20):
                assert_complete_from(stream(gw, f"cooling-{i}"), "fallback")
            assert len(raw.requests) == 1
    with raw_upstream(_rate_limited(b"1")) as raw:
        routes = pool(
            up("primary", raw.url + "/v1", weight=1000), up("fallback", healthy.url + "/v1")
        )
        with gateway_for("", routes=routes) as gw:
            first_on(gw, "primary", lambda rid: stream(gw, rid), "cool-1s")
            loop = asyncio.new_event_loop()
            deadline = loop.time() + 15
            while len(raw.requests) < 2:  # it gets requests again once the second passed
                assert loop.time() < deadline, "the upstream never came back from Retry-After"
                assert_complete_from(stream(gw, "after-cool"), "fallback")
            loop.close()


def test_ejection_then_a_half_open_probe_returns_the_upstream(healthy: ServerThread) -> None:
    state = {"failing": True}

    async def respond(
        request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if state["failing"]:
            writer.write(b"HTTP/1.1 500 Oops\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        else:
            writer.write(sse_head(b"connection: close\r\n") + chunk(CHAT_STREAM) + b"0\r\n\r\n")
        await writer.drain()

    with raw_upstream(respond) as raw:
        primary = up("primary", raw.url + "/v1", weight=1000)
        routes = pool(
            primary,
            up("fallback", healthy.url + "/v1"),
            eject_after=3,
            eject_base_seconds=2.0,
        )
        with gateway_for("", routes=routes) as gw:
            ejected = 'gateway_upstream_ejected{route="chat",upstream="primary"}'
            for i in range(3):
                response = first_on(gw, "primary", lambda rid: stream(gw, rid), f"eject-{i}")
                assert_complete_from(response, "fallback")
            assert metric_value(metrics(gw), "gateway_upstream_ejected", upstream="primary") == 1
            assert ejected + " 1.0" in metrics(gw)
            # Ejected: weight 1000 to 1, yet nothing goes to it.
            seen = len(raw.requests)
            for i in range(5):
                assert_complete_from(stream(gw, f"ejected-{i}"), "fallback")
            assert len(raw.requests) == seen
            # Healthy again: once the ejection is over, one request probes it and it is back.
            state["failing"] = False
            loop = asyncio.new_event_loop()
            deadline = loop.time() + 20
            served = None
            while served != "primary":
                assert loop.time() < deadline, "the upstream never came back"
                response = stream(gw, "probe")
                assert response.status_code == 200
                served = response.headers["x-gateway-upstream"]
            loop.close()
            assert metric_value(metrics(gw), "gateway_upstream_ejected", upstream="primary") == 0


# -- balancing --------------------------------------------------------------------------------


async def _streams(base: str, total: int, concurrency: int) -> list[str]:
    """``total`` short streams, ``concurrency`` at a time; the upstream of each."""
    served: list[str] = []
    queue = iter(range(total))
    async with web.async_client(base_url=base, timeout=30) as client:

        async def worker() -> None:
            for _ in queue:
                response = await client.post("/v1/chat/completions", json=CHAT)
                assert response.status_code == 200
                assert response.content.endswith(b"\n")
                assert b"outcome=complete" in response.content
                served.append(response.headers["x-gateway-upstream"])

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return served


def test_a_thousand_streams_are_shared_by_weight() -> None:
    """Least outstanding keeps the streams in flight at 3:1. Both upstreams pace their
    answers alike (about 120 ms a stream, so that their own CPU time, which grows with
    their load, hardly counts): the streams they serve are 3:1 too."""
    with (
        running(create_simulator_app(default_tokens=3, default_tps=25)) as a,
        running(create_simulator_app(default_tokens=3, default_tps=25)) as b,
    ):
        routes = pool(up("heavy", a.url + "/v1", weight=3), up("light", b.url + "/v1", weight=1))
        with gateway_for("", routes=routes) as gw:
            served = asyncio.run(_streams(gw.url, 1000, 32))
            assert len(served) == 1000
            heavy = served.count("heavy")
            assert 675 <= heavy <= 825, heavy  # 750 within 10 %
            text = metrics(gw)
            assert metric_value(text, ATTEMPTS, upstream="heavy", result="ok") == heavy
            assert metric_value(text, "gateway_upstream_active_streams") == 0


def test_least_outstanding_sends_more_to_the_faster_upstream() -> None:
    """Equal weights, but one upstream paces its answers: it holds its streams longer
    (250 ms each), so the other (which finishes at once) is picked far more often than
    half the time. (At 100 ms a stream, a loaded machine slowed the fast one enough that
    it got 136 of 200.)"""
    with (
        running(create_simulator_app(default_tokens=5, default_tps=20)) as slow,
        running(create_simulator_app(default_tokens=5)) as fast,
    ):
        routes = pool(up("slow", slow.url + "/v1"), up("fast", fast.url + "/v1"))
        with gateway_for("", routes=routes) as gw:
            served = asyncio.run(_streams(gw.url, 200, 8))
            assert served.count("fast") >= 140, served.count("fast")


# -- what goes to each upstream ----------------------------------------------------------------


def test_the_model_map_rewrites_only_a_mapped_model_and_only_for_its_upstream(
    unavailable: ServerThread,
) -> None:
    with raw_upstream() as raw:
        fallback = up("fallback", raw.url + "/v1", models={"gpt-x": "fallback-model"})
        routes = pool(up("primary", unavailable.url + "/v1", weight=1000), fallback)
        with gateway_for("", routes=routes) as gw:
            mapped = CHAT | {"model": "gpt-x", "temperature": 0.5}
            response = first_on(gw, "primary", lambda rid: stream(gw, rid, mapped), "mapped")
            assert response.headers["x-gateway-upstream"] == "fallback"
            rid = response.headers["x-request-id"]
            seen = sim_saw(unavailable, rid)
            assert seen is not None
            assert seen["body"]["model"] == "gpt-x"  # no map there
            (sent,) = raw_saw(raw, rid)
            assert json.loads(sent.body) == mapped | {"model": "fallback-model"}

            # A model the map does not name: the body goes byte for byte.
            odd = b'{ "model" : "gpt-y",\n "stream": true, "messages": [ ] , "n": 1}'

            def send_odd(rid: str) -> httpx.Response:
                return web.post(
                    gw.url + "/v1/chat/completions",
                    content=odd,
                    headers={"x-request-id": rid, "content-type": "application/json"},
                )

            response = first_on(gw, "primary", send_odd, "unmapped")
            (sent,) = raw_saw(raw, response.headers["x-request-id"])
            assert sent.body == odd


def test_each_upstream_gets_its_own_credential_and_never_another(
    unavailable: ServerThread, healthy: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GW_TEST_KEY_A", "sk-upstream-a")
    monkeypatch.setenv("GW_TEST_KEY_B", "sk-upstream-b")
    settings = load_settings(
        access_log=False,
        routes=pool(
            up("primary", unavailable.url + "/v1", weight=1000, credential_env="GW_TEST_KEY_A"),
            up("fallback", healthy.url + "/v1", credential_env="GW_TEST_KEY_B"),
        ),
    )
    with running(create_app(settings)) as gw:

        def send(rid: str) -> httpx.Response:
            return web.post(
                gw.url + "/v1/chat/completions",
                json=CHAT,
                headers={"x-request-id": rid, "authorization": "Bearer sk-client"},
            )

        response = first_on(gw, "primary", send, "creds")
        assert_complete_from(response, "fallback")
        rid = response.headers["x-request-id"]
        seen_a, seen_b = sim_saw(unavailable, rid), sim_saw(healthy, rid)
        assert seen_a is not None
        assert seen_b is not None
        sha = lambda value: hashlib.sha256(value.encode()).hexdigest()  # noqa: E731
        assert seen_a["headers"]["authorization"]["sha256"] == sha("Bearer sk-upstream-a")
        assert seen_b["headers"]["authorization"]["sha256"] == sha("Bearer sk-upstream-b")


def test_a_missing_upstream_credential_is_named_at_start(healthy: ServerThread) -> None:
    os.environ.pop("GW_TEST_KEY_MISSING", None)
    with pytest.raises(ValueError, match=r"routes\[0\]\.upstreams\[1\]\.credential_env"):
        load_settings(
            routes=pool(
                up("a", healthy.url + "/v1"),
                up("b", healthy.url + "/v1", credential_env="GW_TEST_KEY_MISSING"),
            )
        )


# -- the real SDKs ------------------------------------------------------------------------------


def test_openai_sdk_gets_a_whole_answer_when_the_first_upstream_answers_503(
    unavailable: ServerThread, healthy: ServerThread
) -> None:
    routes = pool(
        up("primary", unavailable.url + "/v1", weight=1000), up("fallback", healthy.url + "/v1")
    )
    with gateway_for("", routes=routes) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)

        def ask(rid: str) -> str:
            chunks = client.chat.completions.create(
                model="sim-model",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                extra_headers={"x-request-id": rid},
            )
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        assert first_on(gw, "primary", ask, "openai") == TEXT
        assert metric_value(metrics(gw), ATTEMPTS, upstream="primary", result="status_5xx") == 1


def test_anthropic_sdk_gets_a_whole_answer_when_the_first_upstream_answers_503(
    unavailable: ServerThread, healthy: ServerThread
) -> None:
    routes = pool(
        up("primary", unavailable.url + "/v1", weight=1000), up("fallback", healthy.url + "/v1")
    )
    with gateway_for("", routes=routes) as gw:
        client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)

        def ask(rid: str) -> str:
            with client.messages.stream(
                model="sim-model",
                max_tokens=1024,
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"x-request-id": rid},
            ) as answer:
                return answer.get_final_text()

        assert first_on(gw, "primary", ask, "anthropic") == TEXT
        assert metric_value(metrics(gw), ATTEMPTS, upstream="primary", result="status_5xx") == 1


# -- the access log and a pool from a config file -------------------------------------------------


def test_the_access_log_lists_every_attempt_and_the_upstream_that_served(
    unavailable: ServerThread,
    healthy: ServerThread,
    tmp_path: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = tmp_path / "pool.toml"
    config.write_text(
        f"""
[[routes]]
name = "chat"
prefix = "/v1"
max_attempts = 2
[[routes.upstreams]]
name = "primary"
url = "{unavailable.url}/v1"
weight = 1000
[[routes.upstreams]]
name = "fallback"
url = "{healthy.url}/v1"
"""
    )
    for name in list(os.environ):
        if name.upper().startswith("GATEWAY_"):
            monkeypatch.delenv(name)
    settings = load_settings(config=str(config))  # as serve loads it
    with running(create_app(settings), **uvicorn_options()) as gw:
        response = first_on(gw, "primary", lambda rid: stream(gw, rid), "log")
        assert_complete_from(response, "fallback")
    lines = access_log_lines(capsys.readouterr().out)
    (line,) = [x for x in lines if x["request_id"] == response.headers["x-request-id"]]
    assert line["upstream"] == "fallback"
    assert [(a["upstream"], a["result"]) for a in line["attempts"]] == [
        ("primary", "status_5xx"),
        ("fallback", "ok"),
    ]
    assert all(a["duration_ms"] >= 0 for a in line["attempts"])
    assert (line["status"], line["outcome"], line["reason"]) == (200, "complete", "stop")
    assert line["model"] == "sim-1"


def test_a_single_upstream_is_a_pool_of_one_that_never_retries(unavailable: ServerThread) -> None:
    with gateway_for(unavailable.url + "/v1") as gw:
        response = stream(gw, "single")
        assert response.status_code == 503
        assert response.headers["x-gateway-upstream"] == "default"
        text = metrics(gw)
        assert metric_value(text, ATTEMPTS, upstream="default", result="status_5xx") == 1
        assert metric_value(text, ATTEMPTS) == 1


# -- configuration -------------------------------------------------------------------------


def _check_config(routes: Any, **env: str) -> subprocess.CompletedProcess[str]:
    """``gateway check-config`` with ``GATEWAY_ROUTES`` (JSON), as an operator runs it
    (in-process, tests/cli.py; nothing else in the environment but PATH)."""
    return run_cli("check-config", env={"GATEWAY_ROUTES": json.dumps(routes)} | env, inherit=False)


def test_a_pool_through_gateway_routes_with_its_keys_and_credentials_redacted() -> None:
    routes = pool(
        up("a", "https://a.example/v1", credential_env="KEY_A", weight=3),
        up("b", "https://b.example/v1?api-key=secret", models={"x": "y"}),
        max_attempts=3,
        retry_on=["5xx", "first_byte_timeout"],
        eject_after=2,
    )
    result = _check_config(routes, KEY_A="sk-secret-a")
    assert result.returncode == 0, result.stderr
    assert "sk-secret-a" not in result.stdout
    assert "secret" not in result.stdout.replace("<redacted>", "")
    shown = json.loads(result.stdout)
    (route,) = shown["routes"]
    assert (route["max_attempts"], route["retry_on"], route["eject_after"]) == (
        3,
        ["5xx", "first_byte_timeout"],
        2,
    )
    (effective,) = shown["effective_routes"]
    assert effective["upstreams"] == [
        {"name": "a", "url": "https://a.example/v1", "weight": 3, "credential": "<redacted>"},
        {
            "name": "b",
            "url": "https://b.example/v1?api-key=<redacted>",
            "weight": 1,
            "credential": None,
        },
    ]


@pytest.mark.parametrize(
    ("route", "message"),
    [
        (
            {"upstream": "https://a.example/v1", "upstreams": [up("a", "https://a.example/v1")]},
            "either upstream or upstreams",
        ),
        ({"upstreams": []}, "needs an upstream"),
        (
            {"upstreams": [up("a", "https://a.example/v1"), up("a", "https://b.example/v1")]},
            "must be unique",
        ),
        ({"upstreams": [up("a b", "https://a.example/v1")]}, "[A-Za-z0-9_.-]"),
        ({"upstreams": [up("a", "ftp://a.example/v1")]}, "http:// or https://"),
        (
            {"upstreams": [up("a", "https://a.example/v1")], "credential_env": "KEY"},
            "belong to each of the route's upstreams",
        ),
        ({"upstream": "https://a.example/v1", "retry_on": ["4xx"]}, "retry_on"),
        ({"upstream": "https://a.example/v1", "max_attempts": 0}, "max_attempts"),
        (
            {"upstream": "https://a.example/v1", "eject_base_seconds": 60, "eject_max_seconds": 30},
            "eject_max_seconds must not be below eject_base_seconds",
        ),
        ({"upstreams": [up("a", "https://a.example/v1", weight=0)]}, "weight"),
    ],
)
def test_a_bad_pool_is_refused_at_start_naming_the_key(route: dict[str, Any], message: str) -> None:
    result = _check_config([{"name": "chat", "prefix": "/v1", **route}])
    assert result.returncode == 2, result.stdout
    assert "Traceback" not in result.stderr
    assert message in result.stderr, result.stderr
    assert "GATEWAY_ROUTES" in result.stderr


# -- the simulator as a provider that always fails -------------------------------------------------


def test_the_simulators_default_fault_applies_unless_a_request_names_one(
    unavailable: ServerThread,
) -> None:
    response = web.post(unavailable.url + "/v1/chat/completions", json=CHAT)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    response = web.post(
        unavailable.url + "/v1/chat/completions", json=CHAT, headers={"x-sim-fault": "none"}
    )
    assert response.status_code == 200
    with pytest.raises(ValueError, match="unknown fault"):
        create_simulator_app(default_fault="nope")
