"""The response cache (issue 36) through a real gateway in front of a real simulator.

Every test counts what reached the upstream (the simulator's record store): a
hit is an answer that never went upstream. Bytes are compared as the client
got them, the gateway's trailer aside.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.cache import body_digest
from gateway.simulator import create_simulator_app
from tests.conftest import ServerThread, gateway_process, running
from tests.integration.helpers import access_log_until, gateway_for, metric_value, until

#: The gateway's trailer: an error event (incomplete) and the comment line.
TRAILER = re.compile(rb"(?:data: \{\"error\".*\n\n)?: gateway [^\n]*\n\Z", re.S)
HIT_TRAILER = re.compile(
    rb": gateway outcome=complete reason=(?P<reason>[a-z_]+) cache=hit age=(?P<age>\d+) "
    rb"request_id=(?P<rid>[A-Za-z0-9._-]+)\n\Z"
)
CHAT = {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}], "stream": True}
KEYS = {"alice": "key-alice", "bob": "key-bob", "carol": "key-carol"}


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


CLIENTS = [
    {"name": "alice", "key_sha256": [digest(KEYS["alice"])], "cache_admin": True},
    {"name": "bob", "key_sha256": [digest(KEYS["bob"])], "cache_admin": True},
    {"name": "carol", "key_sha256": [digest(KEYS["carol"])]},
]


@pytest.fixture
def sim() -> Iterator[ServerThread]:
    with running(create_simulator_app()) as server:
        yield server


def upstream_count(sim: ServerThread) -> int:
    return len(sim.server.config.app.state.records)


def routes(sim: ServerThread, **extra: Any) -> list[dict[str, Any]]:
    """One caching route per protocol family's prefix."""
    common = {"cache": True, **extra}
    return [
        {"name": "r", "prefix": "/v1", "upstream": f"{sim.url}/v1", **common},
        {"name": "g", "prefix": "/v1beta", "upstream": f"{sim.url}/v1beta", **common},
        {
            "name": "o",
            "prefix": "/api",
            "upstream": f"{sim.url}/api",
            "protocol": "ollama",
            **common,
        },
    ]


def without_trailer(body: bytes) -> bytes:
    return TRAILER.sub(b"", body)


def post(
    gw: ServerThread, body: Any, path: str = "/v1/chat/completions", **kw: Any
) -> httpx.Response:
    return httpx.post(f"{gw.url}{path}", json=body, timeout=30, **kw)


def auth(client: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[client]}"}


def test_a_whole_stream_is_replayed_byte_for_byte(sim: ServerThread) -> None:
    with gateway_for("", routes=routes(sim, inject_include_usage=True)) as gw:
        miss = post(gw, CHAT)
        assert miss.headers["x-gateway-cache"] == "MISS"
        key = miss.headers["x-gateway-cache-key"]
        assert re.fullmatch("[0-9a-f]{64}", key)
        hit = post(gw, CHAT)
        assert hit.headers["x-gateway-cache"] == "HIT"
        assert b'"usage":' in hit.content
        assert "x-gateway-cache-key" not in hit.headers
        assert int(hit.headers["age"]) >= 0
        assert upstream_count(sim) == 1
        assert without_trailer(hit.content) == without_trailer(miss.content)
        found = HIT_TRAILER.search(hit.content)
        assert found is not None
        assert found["reason"] == b"stop"
        assert found["rid"].decode() == hit.headers["x-request-id"]
        assert hit.headers["x-request-id"] != miss.headers["x-request-id"]
        metrics = httpx.get(f"{gw.url}/metrics").text
        assert metric_value(metrics, "gateway_cache_total", route="r", result="hit", reason="")
        assert metric_value(
            metrics, "gateway_cache_total", route="r", result="stored", reason="stop"
        )
        assert metric_value(metrics, "gateway_cache_saved_tokens_total", route="r") > 0


PROTOCOLS = [
    ("/v1/chat/completions", CHAT, {}),
    ("/v1/completions", {"model": "sim-1", "prompt": "hi", "stream": True}, {}),
    ("/v1/responses", {"model": "sim-1", "input": "hi", "stream": True}, {}),
    (
        "/v1/messages",
        {
            "model": "sim-1",
            "max_tokens": 50,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        },
        {"anthropic-version": "2023-06-01"},
    ),
    (
        "/v1beta/models/sim-1:streamGenerateContent?alt=sse",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        {},
    ),
    ("/api/chat", {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}]}, {}),
    ("/v1/chat/completions", {**CHAT, "stream": False}, {}),
    (
        "/v1/messages",
        {"model": "sim-1", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]},
        {"anthropic-version": "2023-06-01"},
    ),
    (
        "/v1beta/models/sim-1:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        {},
    ),
    (
        "/api/chat",
        {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}], "stream": False},
        {},
    ),
]


@pytest.mark.parametrize(("path", "body", "headers"), PROTOCOLS)
def test_hit_bytes_equal_miss_bytes_in_every_protocol(
    sim: ServerThread, path: str, body: dict[str, Any], headers: dict[str, str]
) -> None:
    with gateway_for("", routes=routes(sim)) as gw:
        miss = post(gw, body, path, headers=headers)
        assert miss.status_code == 200
        assert miss.headers["x-gateway-cache"] == "MISS"
        hit = post(gw, body, path, headers=headers)
        assert hit.headers["x-gateway-cache"] == "HIT", hit.headers
        assert upstream_count(sim) == 1
        assert hit.headers["content-type"] == miss.headers["content-type"]
        assert without_trailer(hit.content) == without_trailer(miss.content)
        if miss.content.endswith(b"\n") and b": gateway " in miss.content:
            assert HIT_TRAILER.search(hit.content) is not None


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("drop_before_done", "missing_done"),
        ("invalid_tool_arguments", "invalid_tool_arguments"),
        ("done_without_finish", "missing_finish"),
        ("done_after_cut", "missing_finish"),
        ("length", "length"),
        ("error_event", "upstream_error"),
        ("status", "upstream_status"),
        ("tool_calls", "tool_calls"),
    ],
)
def test_an_answer_not_whole_is_refused(sim: ServerThread, fault: str, reason: str) -> None:
    with gateway_for("", routes=routes(sim)) as gw:
        first = post(gw, CHAT, headers={"x-sim-fault": fault})
        assert first.headers["x-gateway-cache"] == "MISS"
        second = post(gw, CHAT)
        assert second.headers["x-gateway-cache"] == f"REFUSED; reason={reason}"
        third = post(gw, CHAT)
        assert third.headers["x-gateway-cache"] == "HIT"
        assert upstream_count(sim) == 2
        assert without_trailer(third.content) == without_trailer(second.content)


def test_tool_calls_are_cached_when_the_route_says_so(sim: ServerThread) -> None:
    with gateway_for("", routes=routes(sim, cache_reasons=["stop", "tool_calls"])) as gw:
        first = post(gw, CHAT, headers={"x-sim-fault": "tool_calls"})
        second = post(gw, CHAT, headers={"x-sim-fault": "tool_calls"})
        assert second.headers["x-gateway-cache"] == "HIT"
        assert upstream_count(sim) == 1
        assert without_trailer(first.content) == without_trailer(second.content)
        assert b"tool_calls" in second.content


def test_a_plain_answer_cut_or_unfinished_is_refused(sim: ServerThread) -> None:
    plain = {**CHAT, "stream": False}
    with gateway_for("", routes=routes(sim)) as gw:
        post(gw, plain, headers={"x-sim-fault": "length"})
        second = post(gw, plain)
        assert second.headers["x-gateway-cache"] == "REFUSED; reason=length"
        assert post(gw, plain).headers["x-gateway-cache"] == "HIT"
        assert upstream_count(sim) == 2


def test_a_longer_answer_than_the_entry_bound_is_refused(sim: ServerThread) -> None:
    with gateway_for("", routes=routes(sim, cache_max_entry_bytes=2048)) as gw:
        post(gw, CHAT, headers={"x-sim-tokens": "200"})
        second = post(gw, CHAT, headers={"x-sim-tokens": "200"})
        assert second.headers["x-gateway-cache"] == "REFUSED; reason=too_large"
        assert upstream_count(sim) == 2


def test_client_scope_keeps_clients_apart_and_route_scope_shares(sim: ServerThread) -> None:
    with gateway_for("", routes=routes(sim), clients=CLIENTS) as gw:
        assert post(gw, CHAT, headers=auth("alice")).headers["x-gateway-cache"] == "MISS"
        assert post(gw, CHAT, headers=auth("bob")).headers["x-gateway-cache"] == "MISS"
        assert post(gw, CHAT, headers=auth("alice")).headers["x-gateway-cache"] == "HIT"
        assert upstream_count(sim) == 2
    with gateway_for("", routes=routes(sim, cache_scope="route"), clients=CLIENTS) as gw:
        assert post(gw, CHAT, headers=auth("alice")).headers["x-gateway-cache"] == "MISS"
        assert post(gw, CHAT, headers=auth("bob")).headers["x-gateway-cache"] == "HIT"


class Clock:
    """The cache's clock in a running gateway, moved by the test (no sleeping)."""

    def __init__(self, gw: ServerThread) -> None:
        self.now = time.time()
        gw.server.config.app.gateway.cache.clock = lambda: self.now


def test_request_controls(sim: ServerThread) -> None:
    with gateway_for("", routes=routes(sim)) as gw:
        clock = Clock(gw)
        nostore = post(gw, CHAT, headers={"cache-control": "no-store"})
        assert nostore.headers["x-gateway-cache"] == "BYPASS"
        assert post(gw, CHAT).headers["x-gateway-cache"] == "MISS"  # nothing was stored
        assert (
            post(gw, CHAT, headers={"x-gateway-cache": "off"}).headers["x-gateway-cache"]
            == "BYPASS"
        )
        assert upstream_count(sim) == 3
        nocache = post(gw, CHAT, headers={"cache-control": "no-cache"})
        assert nocache.headers["x-gateway-cache"] == "MISS"  # not read, stored again
        assert upstream_count(sim) == 4
        hit = post(gw, CHAT)
        assert hit.headers["x-gateway-cache"] == "HIT"
        assert without_trailer(hit.content) == without_trailer(nocache.content)
        clock.now += 5
        assert post(gw, CHAT).headers["age"] == "5"
        young = post(gw, CHAT, headers={"cache-control": "max-age=4"})
        assert young.headers["x-gateway-cache"] == "MISS"
        assert upstream_count(sim) == 5
        old_enough = post(gw, CHAT, headers={"cache-control": "max-age=4"})
        assert old_enough.headers["x-gateway-cache"] == "HIT"  # the new one, age 0
        assert old_enough.headers["age"] == "0"
        assert upstream_count(sim) == 5


def test_entries_expire(sim: ServerThread) -> None:
    with gateway_for("", routes=routes(sim, cache_ttl_seconds=100)) as gw:
        clock = Clock(gw)
        post(gw, CHAT)
        clock.now += 99
        hit = post(gw, CHAT)
        assert hit.headers["x-gateway-cache"] == "HIT"
        assert HIT_TRAILER.search(hit.content)["age"] == b"99"
        clock.now += 1
        assert post(gw, CHAT).headers["x-gateway-cache"] == "MISS"
        assert upstream_count(sim) == 2


def test_delete_by_an_admin_of_its_own_key_only(sim: ServerThread) -> None:
    with gateway_for("", routes=routes(sim), clients=CLIENTS) as gw:
        key = post(gw, CHAT, headers=auth("alice")).headers["x-gateway-cache-key"]
        url = f"{gw.url}/v1/gateway/cache/{key}"
        assert httpx.delete(url, headers=auth("bob")).status_code == 404
        assert httpx.delete(url, headers=auth("carol")).status_code == 403
        assert (
            httpx.delete(f"{gw.url}/v1/gateway/cache/{'0' * 64}", headers=auth("alice")).status_code
            == 404
        )
        assert post(gw, CHAT, headers=auth("alice")).headers["x-gateway-cache"] == "HIT"
        assert httpx.delete(url, headers=auth("alice")).status_code == 204
        assert httpx.delete(url, headers=auth("alice")).status_code == 404
        assert post(gw, CHAT, headers=auth("alice")).headers["x-gateway-cache"] == "MISS"
        assert upstream_count(sim) == 2


def test_a_namespace_changes_every_key(sim: ServerThread) -> None:
    with gateway_for("", routes=routes(sim, cache_namespace="a")) as gw:
        key_a = post(gw, CHAT).headers["x-gateway-cache-key"]
    with gateway_for("", routes=routes(sim, cache_namespace="b")) as gw:
        key_b = post(gw, CHAT).headers["x-gateway-cache-key"]
    assert key_a != key_b


def test_the_key_reads_the_json_not_its_spelling(sim: ServerThread) -> None:
    spelled = json.dumps(dict(reversed(list(CHAT.items()))), indent=2).encode()
    with gateway_for("", routes=routes(sim)) as gw:
        post(gw, CHAT)
        again = httpx.post(
            f"{gw.url}/v1/chat/completions",
            content=spelled,
            headers={"content-type": "application/json"},
            timeout=30,
        )
        assert again.headers["x-gateway-cache"] == "HIT"
        other = post(gw, {**CHAT, "temperature": 0.5})
        assert other.headers["x-gateway-cache"] == "MISS"
        beta = post(gw, CHAT, headers={"openai-beta": "assistants=v2"})
        assert beta.headers["x-gateway-cache"] == "MISS"


def test_a_body_that_is_not_json_is_relayed_and_never_cached(sim: ServerThread) -> None:
    with gateway_for("", routes=routes(sim)) as gw:
        for _ in range(2):
            got = httpx.post(
                f"{gw.url}/v1/chat/completions",
                content=b"not json {",
                headers={"content-type": "application/json"},
                timeout=30,
            )
            assert got.headers["x-gateway-cache"] == "BYPASS"
        assert upstream_count(sim) == 2


def test_a_10_mb_body_is_hashed_and_cached(sim: ServerThread) -> None:
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * (10 * 1024 * 1024)}]}
    with gateway_for("", routes=routes(sim)) as gw:
        bodies = gw.server.config.app.gateway.relay.bodies
        hashed: list[int] = []
        run = bodies.run

        async def spy(work: Any, body: bytes, *args: Any) -> Any:
            if work is body_digest:
                hashed.append(len(body))
            return await run(work, body, *args)

        bodies.run = spy
        first = post(gw, big)
        assert first.headers["x-gateway-cache"] == "MISS"
        second = post(gw, big)
        assert second.headers["x-gateway-cache"] == "HIT"
        assert upstream_count(sim) == 1
        # hashed by the body parser's helper process (bodies over its bound never
        # parse on the loop), which is running now
        assert len(hashed) == 2
        assert min(hashed) > bodies.off_loop_bytes
        assert bodies._pool is not None


@contextlib.contextmanager
def store_settings(kind: str) -> Iterator[dict[str, Any]]:
    if kind == "memory":
        yield {}
        return
    from tests.integration.redis_server import redis_server

    with redis_server(mode="cluster" if kind == "cluster" else None) as redis:
        yield {"stream_store": "redis", **redis.settings}


@pytest.mark.parametrize(
    "store",
    [
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.redis),
    ],
)
def test_fifty_identical_requests_make_one_upstream_call(sim: ServerThread, store: str) -> None:
    slow = {"x-sim-tps": "20", "x-sim-tokens": "20"}  # about a second of stream

    async def all_of_them(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=60)) as c:
            return await asyncio.gather(*(c.post(url, json=CHAT, headers=slow) for _ in range(50)))

    with store_settings(store) as extra, gateway_for("", routes=routes(sim), **extra) as gw:
        answers = asyncio.run(all_of_them(f"{gw.url}/v1/chat/completions"))
        assert upstream_count(sim) == 1
        bodies = {without_trailer(a.content) for a in answers}
        assert len(bodies) == 1
        assert all(a.status_code == 200 for a in answers)
        assert all(b"data: [DONE]" in a.content for a in answers)
        assert all(re.search(rb"outcome=complete", a.content) for a in answers)
        assert sorted(a.headers["x-gateway-cache"] for a in answers).count("MISS") == 1


def test_followers_end_as_the_leader_did_whole_or_not(sim: ServerThread) -> None:
    cut = {"x-sim-tps": "20", "x-sim-tokens": "20", "x-sim-fault": "drop_before_done"}

    async def both(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as c:
            leader = asyncio.ensure_future(c.post(url, json=CHAT, headers=cut))
            await until(lambda: upstream_count(sim) == 1, "the leader reached the upstream")
            follower = await c.post(url, json=CHAT)
            return [await leader, follower]

    with gateway_for("", routes=routes(sim)) as gw:
        leader, follower = asyncio.run(both(f"{gw.url}/v1/chat/completions"))
        assert upstream_count(sim) == 1
        assert b"outcome=incomplete reason=missing_done" in follower.content
        assert without_trailer(follower.content) == without_trailer(leader.content)
        assert follower.headers["x-request-id"].encode() in follower.content


@pytest.mark.parametrize("store", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_followers_get_the_whole_answer_when_the_leaders_client_leaves(
    sim: ServerThread, store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The leader's client drops after its first events: the leader reads on into its log
    for the five requests following it, which all get the whole answer; it is stored (the
    next request is a hit) and the leader's access-log line says it was detached."""
    slow = {"x-sim-tps": "10", "x-sim-tokens": "30"}  # about three seconds of stream

    async def run(url: str) -> tuple[str, list[bytes]]:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=10)) as c:
            leader_id = ""
            first_events = asyncio.Event()
            followers_in = [asyncio.Event() for _ in range(5)]

            async def lead() -> None:
                nonlocal leader_id
                async with c.stream("POST", url, json=CHAT, headers=slow) as response:
                    assert response.headers["x-gateway-cache"] == "MISS"
                    leader_id = response.headers["x-request-id"]
                    chunks = response.aiter_raw()  # held: its end would close the response
                    while b"data: {" not in await anext(chunks):
                        pass
                    first_events.set()
                    for joined in followers_in:
                        await joined.wait()
                # leaving the block unread closes the leader's connection

            async def follow(joined: asyncio.Event) -> bytes:
                await first_events.wait()
                async with c.stream("POST", url, json=CHAT) as response:
                    assert response.headers["x-gateway-cache"] == "HIT"
                    joined.set()
                    return b"".join([chunk async for chunk in response.aiter_raw()])

            bodies = await asyncio.gather(lead(), *(follow(j) for j in followers_in))
            return leader_id, list(bodies[1:])

    with (
        store_settings(store) as extra,
        gateway_for("", routes=routes(sim), access_log=True, **extra) as gw,
    ):
        leader_id, followers = asyncio.run(run(f"{gw.url}/v1/chat/completions"))
        assert upstream_count(sim) == 1
        for body in followers:
            assert b"data: [DONE]" in body
            assert HIT_TRAILER.search(body) is not None  # the answer was whole, and kept
        assert len({without_trailer(body) for body in followers}) == 1
        hit = post(gw, CHAT)
        assert hit.headers["x-gateway-cache"] == "HIT"
        assert without_trailer(hit.content) == without_trailer(followers[0])
        assert upstream_count(sim) == 1
        lines = access_log_until(capsys, hit.headers["x-request-id"])
    leader = next(line for line in lines if line["request_id"] == leader_id)
    assert leader["detached"] is True
    assert (leader["outcome"], leader["reason"]) == ("complete", "stop")
    assert leader["cache"] == "miss"


def test_a_leader_whose_client_leaves_unfollowed_stops(
    sim: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nobody follows: the leader's request stops when its client leaves, as before (the
    upstream is not read on for nobody), and nothing is stored."""
    slow = {"x-sim-tps": "10", "x-sim-tokens": "100"}  # about ten seconds of stream

    async def run(url: str) -> str:
        async with (
            httpx.AsyncClient(timeout=60) as c,
            c.stream("POST", url, json=CHAT, headers=slow) as response,
        ):
            async for chunk in response.aiter_raw():
                if b"data: {" in chunk:
                    break
            return response.headers["x-request-id"]

    with gateway_for("", routes=routes(sim), access_log=True) as gw:
        leader_id = asyncio.run(run(f"{gw.url}/v1/chat/completions"))
        lines = access_log_until(capsys, leader_id)
        leader = next(line for line in lines if line["request_id"] == leader_id)
        assert leader["detached"] is False
        assert leader["reason"] == "client_disconnect"
        nxt = post(gw, CHAT)
        assert nxt.headers["x-gateway-cache"] == "REFUSED; reason=client_disconnect"


def _crlf_upstream(count: list[int]) -> Starlette:
    chunk = (
        b'data: {"id":"c1","object":"chat.completion.chunk","model":"m",\r\n'
        b'data: "choices":[{"index":0,"delta":{"content":"two\\nlines"},"finish_reason":null}]}'
        b"\r\n\r\n"
        b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":'
        b'[{"index":0,"delta":{},"finish_reason":"stop"}]}\r\n\r\n'
        b"data: [DONE]\r\n\r\n"
    )

    async def chat(request: Request) -> Response:
        count.append(1)
        return Response(chunk, media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def test_crlf_and_multi_line_data_are_replayed_as_they_came() -> None:
    count: list[int] = []
    with running(_crlf_upstream(count)) as up:
        route = {"name": "r", "prefix": "/v1", "upstream": f"{up.url}/v1", "cache": True}
        with gateway_for("", routes=[route]) as gw:
            miss = post(gw, CHAT)
            hit = post(gw, CHAT)
    assert hit.headers["x-gateway-cache"] == "HIT"
    assert len(count) == 1
    assert b'"model":"m",\r\ndata: "choices"' in hit.content
    assert without_trailer(hit.content) == without_trailer(miss.content)


def test_a_continued_stream_is_never_stored() -> None:
    with running(create_simulator_app(default_fault="drop_after_text", fault_requests=1)) as up:
        route = {
            "name": "r",
            "prefix": "/v1",
            "upstreams": [
                {"name": "only", "url": f"{up.url}/v1", "continuation": "assistant_prefill"}
            ],
            "continue_after_cut": True,
            "max_attempts": 3,
            "cache": True,
        }
        with gateway_for("", routes=[route]) as gw:
            first = post(gw, CHAT)
            assert b"continued=1" in first.content
            second = post(gw, CHAT)
            assert second.headers["x-gateway-cache"] == "REFUSED; reason=continued"
            assert post(gw, CHAT).headers["x-gateway-cache"] == "HIT"
            # two requests upstream (the simulator keeps one record per request id: the
            # cut and its continuation carry the same one), none for the hit
            assert upstream_count(up) == 2


def test_a_hit_costs_a_named_client_no_tokens(sim: ServerThread) -> None:
    clients = [{**CLIENTS[0], "limits": {"tokens_per_minute": 1_000_000}}]
    caching = routes(sim, inject_include_usage=True, default_output_reservation=5000)
    with gateway_for("", routes=caching, clients=clients) as gw:
        miss = post(gw, CHAT, headers=auth("alice"))
        # a miss reserves its estimate (input and 5000 output tokens) before it goes upstream
        assert int(miss.headers["x-ratelimit-remaining-tokens"]) <= 1_000_000 - 5000
        after_miss = httpx.get(f"{gw.url}/metrics").text
        spent = metric_value(after_miss, "gateway_client_tokens_total", client="alice")
        assert spent > 0
        hit = post(gw, CHAT, headers=auth("alice"))
        assert hit.headers["x-gateway-cache"] == "HIT"
        # a hit reserves nothing: what is used is what the miss cost, no more
        assert int(hit.headers["x-ratelimit-remaining-tokens"]) >= 1_000_000 - spent
        after_hit = httpx.get(f"{gw.url}/metrics").text
        assert metric_value(after_hit, "gateway_client_tokens_total", client="alice") == spent
        assert metric_value(after_hit, "gateway_requests_total", client="alice", code="200") == 2


@pytest.mark.parametrize("backend", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_client_past_its_token_limit_still_gets_a_hit(sim: ServerThread, backend: str) -> None:
    """A hit reserves no tokens, so a token limit that is over does not refuse it; a miss
    (an answer that would spend tokens) is refused as before."""
    # the day's budget as well as the minute's: both over, so that a minute that ends
    # between the requests changes nothing
    limits = {"tokens_per_minute": 30, "tokens_per_day": 30}
    clients = [{**CLIENTS[0], "limits": limits}]
    caching = routes(sim, inject_include_usage=True, default_output_reservation=1)
    many = {"x-sim-tokens": "60"}  # the answer costs more than the limit
    with contextlib.ExitStack() as stack:
        extra: dict[str, Any] = {}
        if backend == "redis":
            from tests.integration.redis_server import redis_server

            redis = stack.enter_context(redis_server())
            extra = {"limits_backend": "redis", **redis.settings}
        gw = stack.enter_context(gateway_for("", routes=caching, clients=clients, **extra))
        miss = post(gw, CHAT, headers={**auth("alice"), **many})
        assert miss.headers["x-gateway-cache"] == "MISS"
        assert b"outcome=complete" in miss.content
        text = httpx.get(f"{gw.url}/metrics").text
        assert metric_value(text, "gateway_client_tokens_total", client="alice") > 30
        hit = post(gw, CHAT, headers=auth("alice"))
        assert hit.status_code == 200
        assert hit.headers["x-gateway-cache"] == "HIT"
        assert without_trailer(hit.content) == without_trailer(miss.content)
        other = {**CHAT, "messages": [{"role": "user", "content": "something else"}]}
        refused = post(gw, other, headers=auth("alice"))
        assert refused.status_code == 429
        assert upstream_count(sim) == 1


@pytest.mark.redis
def test_two_gateway_processes_share_entries_through_redis(
    sim: ServerThread, tmp_path: Path
) -> None:
    from tests.integration.redis_server import redis_server

    with redis_server() as redis:
        config = tmp_path / "gateway.toml"
        config.write_text(
            f'stream_store = "redis"\n{redis.toml}\naccess_log = false\n'
            f'[[routes]]\nname = "r"\nprefix = "/v1"\nupstream = "{sim.url}/v1"\n'
            "cache = true\n"
        )
        with (
            gateway_process(["--config", str(config)]) as one,
            gateway_process(["--config", str(config)]) as two,
        ):
            miss = httpx.post(f"{one.url}/v1/chat/completions", json=CHAT, timeout=30)
            assert miss.headers["x-gateway-cache"] == "MISS"
            hit = httpx.post(f"{two.url}/v1/chat/completions", json=CHAT, timeout=30)
            assert hit.headers["x-gateway-cache"] == "HIT"
            assert upstream_count(sim) == 1
            assert without_trailer(hit.content) == without_trailer(miss.content)
            plain = {**CHAT, "stream": False}
            httpx.post(f"{two.url}/v1/chat/completions", json=plain, timeout=30)
            again = httpx.post(f"{one.url}/v1/chat/completions", json=plain, timeout=30)
            assert again.headers["x-gateway-cache"] == "HIT"
            # a refusal in one process is what the other says next
            other = {**CHAT, "user": "cut"}
            cut = {"x-sim-fault": "drop_before_done"}
            httpx.post(f"{one.url}/v1/chat/completions", json=other, headers=cut, timeout=30)
            after = httpx.post(f"{two.url}/v1/chat/completions", json=other, timeout=30)
            assert after.headers["x-gateway-cache"] == "REFUSED; reason=missing_done"
            assert upstream_count(sim) == 4


def test_the_access_log_says_what_the_cache_did(
    sim: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    with gateway_for("", routes=routes(sim), access_log=True) as gw:
        miss = post(gw, CHAT)
        hit = post(gw, CHAT)
        lines = {
            line["request_id"]: line
            for line in access_log_until(capsys, hit.headers["x-request-id"])
        }
        miss_line, hit_line = (
            lines[miss.headers["x-request-id"]],
            lines[hit.headers["x-request-id"]],
        )
    assert miss_line["cache"] == "miss"
    assert hit_line["cache"] == "hit"
    assert hit_line["attempts"] == []
    assert (hit_line["outcome"], hit_line["reason"]) == ("complete", "stop")


@pytest.mark.redis
def test_a_store_that_fails_never_fails_a_request(sim: ServerThread) -> None:
    from tests.integration.redis_server import redis_server

    with redis_server() as redis:
        settings = {"stream_store": "redis", **redis.settings}
        with gateway_for("", routes=routes(sim), **settings) as gw:
            assert post(gw, CHAT).headers["x-gateway-cache"] == "MISS"
            redis.stop()
            down = post(gw, CHAT)
            assert down.status_code == 200
            assert down.headers["x-gateway-cache"] == "BYPASS"
            assert b"outcome=complete" in down.content
            assert upstream_count(sim) == 2
            text = httpx.get(f"{gw.url}/metrics").text
            assert metric_value(
                text, "gateway_cache_total", route="r", result="bypass", reason="store_error"
            )


def test_a_follower_reads_the_leaders_answer_while_it_is_written(sim: ServerThread) -> None:
    slow = {"x-sim-tps": "10", "x-sim-tokens": "40"}  # about four seconds of stream

    async def run(url: str) -> tuple[bool, bytes, bytes]:
        async with httpx.AsyncClient(timeout=60) as c:
            leader_done = asyncio.Event()
            leader_body = bytearray()
            started = asyncio.Event()

            async def lead() -> None:
                async with c.stream("POST", url, json=CHAT, headers=slow) as response:
                    async for chunk in response.aiter_raw():
                        leader_body.extend(chunk)
                        started.set()
                leader_done.set()

            task = asyncio.ensure_future(lead())
            await started.wait()
            async with c.stream("POST", url, json=CHAT) as follower:
                assert follower.headers["x-gateway-cache"] == "HIT"
                chunks = follower.aiter_raw()
                first = await anext(chunks)
                live = not leader_done.is_set()  # a byte came before the leader's end
                rest = b"".join([chunk async for chunk in chunks])
            await task
            return live, first + rest, bytes(leader_body)

    with gateway_for("", routes=routes(sim)) as gw:
        live, follower, leader = asyncio.run(run(f"{gw.url}/v1/chat/completions"))
    assert live
    assert upstream_count(sim) == 1
    assert without_trailer(follower) == without_trailer(leader)
    assert HIT_TRAILER.search(follower) is not None


def test_an_answer_longer_than_an_entry_is_not_shared_past_its_bound(sim: ServerThread) -> None:
    # about three seconds, 150 KB: past the bound of a log (the entry's plus 64 KiB)
    long = {"x-sim-tps": "50", "x-sim-tokens": "150", "x-sim-chunk-bytes": "1000"}

    async def run(url: str) -> tuple[bytes, str, bool]:
        async with httpx.AsyncClient(timeout=60) as c:
            got = asyncio.Event()

            async def lead() -> bytes:
                body = bytearray()
                async with c.stream("POST", url, json=CHAT, headers=long) as response:
                    async for chunk in response.aiter_raw():
                        body.extend(chunk)
                        if len(body) > 80_000:
                            got.set()  # the leader's log stopped at its bound
                return bytes(body)

            task = asyncio.ensure_future(lead())
            await got.wait()
            late = await c.post(url, json=CHAT, headers=long)  # joins after the bound
            return await task, late.headers["x-gateway-cache"], b"outcome=complete" in late.content

    with gateway_for("", routes=routes(sim, cache_max_entry_bytes=2048)) as gw:
        leader, late_header, late_whole = asyncio.run(run(f"{gw.url}/v1/chat/completions"))
    assert b"outcome=complete" in leader
    assert late_header == "BYPASS"  # went upstream alone, not stored
    assert late_whole
    assert upstream_count(sim) == 2


def test_a_follower_past_the_bound_is_cut_never_given_a_false_end(sim: ServerThread) -> None:
    long = {"x-sim-tps": "50", "x-sim-tokens": "150", "x-sim-chunk-bytes": "1000"}

    async def run(url: str) -> tuple[bytes, bytes, bool]:
        async with httpx.AsyncClient(timeout=60) as c:
            started = asyncio.Event()

            async def lead() -> bytes:
                body = bytearray()
                async with c.stream("POST", url, json=CHAT, headers=long) as response:
                    async for chunk in response.aiter_raw():
                        body.extend(chunk)
                        started.set()
                return bytes(body)

            task = asyncio.ensure_future(lead())
            await started.wait()
            got = bytearray()
            cut = False
            try:
                async with c.stream("POST", url, json=CHAT) as follower:
                    assert follower.headers["x-gateway-cache"] == "HIT"
                    async for chunk in follower.aiter_raw():
                        got.extend(chunk)
            except httpx.TransportError:
                cut = True
            return await task, bytes(got), cut

    with gateway_for("", routes=routes(sim, cache_max_entry_bytes=2048)) as gw:
        leader, follower, cut = asyncio.run(run(f"{gw.url}/v1/chat/completions"))
    assert b"outcome=complete" in leader
    assert cut
    assert b": gateway" not in follower
    assert leader.startswith(follower)
    assert upstream_count(sim) == 1


@pytest.mark.parametrize(
    ("path", "body", "headers"),
    [p for p in PROTOCOLS if p[0] in ("/v1/responses", "/v1/messages") and p[1].get("stream")],
)
def test_a_terminator_right_after_a_cut_is_refused_in_every_stream_protocol(
    sim: ServerThread, path: str, body: dict[str, Any], headers: dict[str, str]
) -> None:
    with gateway_for("", routes=routes(sim)) as gw:
        cut = post(gw, body, path, headers={**headers, "x-sim-fault": "done_after_cut"})
        assert b"outcome=incomplete" in cut.content
        again = post(gw, body, path, headers=headers)
        assert again.headers["x-gateway-cache"].startswith("REFUSED; reason=")
        assert post(gw, body, path, headers=headers).headers["x-gateway-cache"] == "HIT"
        assert upstream_count(sim) == 2


def _gzip_upstream(count: list[str]) -> Starlette:
    answer = json.dumps(
        {
            "id": "chatcmpl-z",
            "object": "chat.completion",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "zipped"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
    ).encode()

    async def chat(request: Request) -> Response:
        coding = request.headers.get("accept-encoding", "")
        count.append(coding)
        if "gzip" in coding:
            body = gzip.compress(answer)
            return Response(
                body, media_type="application/json", headers={"content-encoding": "gzip"}
            )
        return Response(answer, media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def test_a_compressed_plain_answer_is_read_for_its_finish_and_replayed_as_it_came() -> None:
    count: list[str] = []
    plain = {**CHAT, "stream": False}

    def raw(gw: ServerThread, coding: str) -> tuple[httpx.Headers, bytes]:
        with httpx.stream(
            "POST",
            f"{gw.url}/v1/chat/completions",
            json=plain,
            headers={"accept-encoding": coding},
            timeout=30,
        ) as response:
            return response.headers, b"".join(response.iter_raw())

    with running(_gzip_upstream(count)) as up:
        route = {"name": "r", "prefix": "/v1", "upstream": f"{up.url}/v1", "cache": True}
        with gateway_for("", routes=[route]) as gw:
            miss_headers, miss = raw(gw, "gzip")
            hit_headers, hit = raw(gw, "gzip")
            identity_headers, identity = raw(gw, "identity")
    assert miss_headers["x-gateway-cache"] == "MISS"
    assert hit_headers["x-gateway-cache"] == "HIT"
    assert hit_headers["content-encoding"] == "gzip"
    assert hit == miss
    assert gzip.decompress(hit).startswith(b'{"id": "chatcmpl-z"')
    # another content coding is another entry: never gzip bytes to a client that did not ask
    assert identity_headers["x-gateway-cache"] == "MISS"
    assert "content-encoding" not in identity_headers
    assert identity.startswith(b'{"id": "chatcmpl-z"')
    assert len(count) == 2


def test_a_client_that_stops_reading_a_hit_is_dropped(
    sim: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    # a 16 MB entry: more than the loopback's socket buffers take, so the sends wait
    big = {"x-sim-tokens": "800", "x-sim-chunk-bytes": "20000"}
    caching = routes(sim, cache_max_entry_bytes=32 * 1024 * 1024)
    with gateway_for("", routes=caching, timeouts={"client_send": 1.0}, access_log=True) as gw:
        assert post(gw, CHAT, headers=big).headers["x-gateway-cache"] == "MISS"
        conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        conn.connect(("127.0.0.1", gw.port))
        body = json.dumps(CHAT).encode()
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-ID: stalled-hit\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        with conn:  # never read: the gateway must give up on it by itself
            lines = access_log_until(capsys, "stalled-hit")
        line = next(entry for entry in lines if entry["request_id"] == "stalled-hit")
        text = httpx.get(f"{gw.url}/metrics").text
    assert line["cache"] == "hit"
    assert line["error"] == "client_stalled"
    assert (line["outcome"], line["reason"]) == ("incomplete", "client_stalled")
    assert metric_value(text, "gateway_active_streams") == 0
    assert upstream_count(sim) == 1


def _unread_request(port: int, request_id: str) -> socket.socket:
    """A chat request on a socket with a small receive buffer, its answer left unread."""
    conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    conn.connect(("127.0.0.1", port))
    body = json.dumps(CHAT).encode()
    conn.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-ID: %s\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (request_id.encode(), len(body), body)
    )
    return conn


def test_a_client_that_leaves_a_hit_ends_it(
    sim: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    # a 16 MB entry: more than the loopback's socket buffers take, so the sends wait
    big = {"x-sim-tokens": "800", "x-sim-chunk-bytes": "20000"}
    caching = routes(sim, cache_max_entry_bytes=32 * 1024 * 1024)
    with gateway_for("", routes=caching, access_log=True) as gw:
        post(gw, CHAT, headers=big)
        with _unread_request(gw.port, "left-hit") as conn:
            assert b"x-gateway-cache: HIT" in conn.recv(65536)
        lines = access_log_until(capsys, "left-hit")
        line = next(entry for entry in lines if entry["request_id"] == "left-hit")
        text = httpx.get(f"{gw.url}/metrics").text
    assert line["cache"] == "hit"
    assert (line["outcome"], line["reason"]) == ("incomplete", "client_disconnect")
    assert metric_value(text, "gateway_active_streams") == 0


def test_a_hit_on_a_resumable_route_carries_no_stream_id_of_the_first_answer(
    sim: ServerThread,
) -> None:
    """Resume and the cache on one route: the miss is a resumable stream of its own, and
    a hit (replayed, not a stream of the store) names none; the first one's id would be
    another client's stream, or one that expires before the entry does."""
    with gateway_for("", routes=routes(sim, resume=True)) as gw:
        miss = post(gw, CHAT)
        assert miss.headers["x-gateway-cache"] == "MISS"
        assert "x-gateway-stream-id" in miss.headers
        hit = post(gw, CHAT)
        assert hit.headers["x-gateway-cache"] == "HIT"
        assert "x-gateway-stream-id" not in hit.headers
        assert hit.headers.get_list("x-gateway-cache") == ["HIT"]
        assert without_trailer(hit.content) == without_trailer(miss.content)


def test_numbers_past_a_float_and_duplicate_members_never_share_an_entry(
    sim: ServerThread,
) -> None:
    """Issue 45 item 6: two seeds past 64 bits are two keys, and a body naming a member
    twice is relayed uncached (the upstream may read the other value)."""
    with gateway_for("", routes=routes(sim, cache_scope="route")) as gw:
        for seed in (b"18446744073709551617", b"18446744073709551618"):
            got = httpx.post(
                f"{gw.url}/v1/chat/completions",
                content=b'{"model":"sim-1","stream":true,"seed":' + seed + b',"messages":'
                b'[{"role":"user","content":"hi"}]}',
                headers={"content-type": "application/json"},
                timeout=30,
            )
            assert got.headers["x-gateway-cache"] == "MISS"
        twice = (
            b'{"model":"sim-1","stream":true,"messages":[{"role":"user","content":"a"}],'
            b'"messages":[{"role":"user","content":"b"}]}'
        )
        for _ in range(2):
            got = httpx.post(
                f"{gw.url}/v1/chat/completions",
                content=twice,
                headers={"content-type": "application/json"},
                timeout=30,
            )
            assert got.headers["x-gateway-cache"] == "BYPASS"
        assert upstream_count(sim) == 4


def test_a_hit_names_the_upstream_that_answered_first(sim: ServerThread) -> None:
    """Issue 45 item 10: docs/wire-contract.md says a hit carries ``X-Gateway-Upstream``."""
    with gateway_for("", routes=routes(sim)) as gw:
        miss = post(gw, CHAT)
        hit = post(gw, CHAT)
        assert hit.headers["x-gateway-cache"] == "HIT"
        assert miss.headers["x-gateway-upstream"] == "r"
        assert hit.headers.get_list("x-gateway-upstream") == ["r"]


def test_a_stream_refused_late_is_neither_served_nor_the_upstreams_answer() -> None:
    """Issue 45 item 4: a stream the request did not announce, refused by the stream cap
    once its head was held (503), was settled as served (its client charged a request)
    and recorded by the cache as the upstream's answer (``REFUSED; reason=upstream_status``
    for the next identical request)."""
    from tests.integration.control import gated_upstream

    unannounced = {"model": "sim-1", "messages": [{"role": "user", "content": "late"}]}
    clients = [{**CLIENTS[0], "limits": {"requests_per_minute": 2}}]
    with gated_upstream() as upstream, contextlib.ExitStack() as stack:
        route = {"name": "r", "prefix": "/v1", "upstream": upstream.url + "/v1", "cache": True}
        gw = stack.enter_context(
            gateway_for(
                "",
                routes=[route],
                clients=clients,
                limits={"max_concurrent_streams": 1},
            )
        )
        with httpx.Client(timeout=30) as client:
            gate = upstream.gate("hold")
            with client.stream(
                "POST",
                f"{gw.url}/v1/chat/completions",
                json=CHAT,
                headers={**auth("alice"), "x-gate": "hold"},
            ) as held:
                assert gate.reached.wait(30)
                late = post(gw, unannounced, headers=auth("alice"))
                assert late.status_code == 503
                assert late.json()["error"]["code"] == "overloaded"
                gate.open()
                held.read()
            again = post(gw, unannounced, headers=auth("alice"))
        assert again.status_code == 200, again.text  # the refused one took no request
        assert again.headers["x-gateway-cache"] == "MISS"


def test_a_predicted_hit_that_expires_before_it_is_served_reserves_what_it_costs(
    sim: ServerThread,
) -> None:
    """Issue 45 item 3: a hit predicted for a named client's limits (no tokens) whose entry
    was gone when it was to be served went upstream on that zero-token reservation, its
    output uncapped under ``strict``. The race is made to happen: the entry is deleted
    the moment the prediction is made."""
    from gateway.cache.entry import entry_name

    clients = [
        {**CLIENTS[0], "limits": {"tokens_per_minute": 5000}, "budget_enforcement": "strict"}
    ]
    caching = routes(sim, default_output_reservation=100)
    with gateway_for("", routes=caching, clients=clients) as gw:
        cache = gw.server.config.app.gateway.cache
        peek = cache.peek

        async def peek_then_expire(plan: Any) -> bool:
            found = await peek(plan)
            if found:
                await cache.store.delete(plan.source.stream_id)
                await cache.store.forget(entry_name(plan.key))
            return bool(found)

        cache.peek = peek_then_expire
        first = post(gw, CHAT, headers={**auth("alice"), "x-request-id": "first-of-two"})
        assert first.headers["x-gateway-cache"] == "MISS"
        again = post(gw, CHAT, headers={**auth("alice"), "x-request-id": "expired-hit"})
        assert again.status_code == 200
        assert again.headers["x-gateway-cache"] != "HIT"
        assert upstream_count(sim) == 2
        sent = httpx.get(f"{sim.url}/_sim/requests/expired-hit").json()["body"]
        # strict: the request went upstream with its output capped, as a miss does
        assert sent.get("max_completion_tokens", sent.get("max_tokens")) == 100
