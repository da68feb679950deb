"""The relay's layers driven in-process: httpx's ASGI transport in front, a mock upstream behind.

No sockets and no servers: each test builds the real app with an
``httpx.MockTransport`` as its upstream transport, runs its lifespan, and
talks to it through ``httpx.ASGITransport``. What only a socket shows
(backpressure, disconnects, the drain, the SDKs) stays in the real-uvicorn
tests; this file covers the send path's decisions fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.protocols import REGISTRY
from gateway.settings import load_settings
from gateway.store import End
from tests.integration.helpers import access_log_line, annotation, metric_value

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]

CHAT = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
SSE = {"content-type": "text/event-stream"}


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chat_stream(model: str = "answer-model", finish: bool = True, usage: bool = False) -> bytes:
    parts = [_event({"model": model, "choices": [{"index": 0, "delta": {"content": "hi"}}]})]
    if finish:
        parts.append(
            _event(
                {"model": model, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            )
        )
    if usage:
        parts.append(_event({"model": model, "choices": [], "usage": {"prompt_tokens": 3}}))
    if finish:
        parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def answer(status: int, body: bytes = b"", **headers: str) -> httpx.Response:
    """An upstream response whose body streams (an httpx response built from bytes
    arrives already read, so the relay could not stream it)."""
    return httpx.Response(status, headers=headers, content=_once(body))


class Upstream:
    """A mock upstream: answers with ``reply`` and keeps every request it got."""

    def __init__(self, reply: Callable[[httpx.Request], httpx.Response]) -> None:
        self.reply = reply
        self.requests: list[httpx.Request] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        self.requests.append(request)
        return self.reply(request)


@contextlib.asynccontextmanager
async def in_process(upstream: Upstream, **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    options: dict[str, Any] = {"access_log": False}
    if "routes" not in settings:
        options["upstream_url"] = "http://upstream.test/v1"
    options.update(settings)
    app = create_app(load_settings(**options), transport=httpx.MockTransport(upstream))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client,
    ):
        yield client


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def test_a_complete_stream_is_relayed_then_annotated_and_counted() -> None:
    upstream = Upstream(lambda r: answer(200, chat_stream(), **SSE))

    async def test() -> None:
        async with in_process(upstream) as client:
            response = await client.post("/v1/chat/completions", json=CHAT)
            metrics = (await client.get("/metrics")).text
        assert response.content.startswith(chat_stream())
        note = annotation(response.content)
        assert (note["outcome"], note["reason"]) == ("complete", "stop")
        assert note["rid"] == response.headers["x-request-id"]
        assert response.headers["cache-control"] == "no-cache"
        # the label is the model the upstream answered with, not the client's claim
        assert metric_value(metrics, "gateway_streams_total", model="answer-model") == 1

    run(test)


def test_a_cut_stream_gets_the_error_event_and_no_terminator() -> None:
    upstream = Upstream(lambda r: answer(200, chat_stream(finish=False), **SSE))

    async def test() -> None:
        async with in_process(upstream) as client:
            response = await client.post("/v1/chat/completions", json=CHAT)
        assert b"[DONE]" not in response.content
        assert b'"code": "missing_done"' in response.content.replace(b'":"', b'": "')
        assert annotation(response.content)["reason"] == "missing_done"

    run(test)


def test_an_upstream_error_status_is_relayed_unchanged() -> None:
    body = b'{"error":{"message":"slow down","type":"rate_limit"}}'
    upstream = Upstream(
        lambda r: answer(429, body, **{"retry-after": "7", "content-type": "application/json"})
    )

    async def test() -> None:
        async with in_process(upstream) as client:
            response = await client.post("/v1/chat/completions", json=CHAT)
            metrics = (await client.get("/metrics")).text
        assert response.status_code == 429
        assert response.content == body
        assert response.headers["retry-after"] == "7"
        assert metric_value(metrics, "gateway_streams_total", reason="upstream_status") == 1

    run(test)


def test_an_unreachable_upstream_is_a_502_that_names_no_host() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused to upstream.test:443", request=request)

    async def test() -> None:
        async with in_process(Upstream(refuse)) as client:
            response = await client.post("/v1/chat/completions", json=CHAT)
            metrics = (await client.get("/metrics")).text
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "upstream_unavailable"
        assert "upstream.test" not in response.text
        assert metric_value(metrics, "gateway_request_errors_total", error="connect_error") == 1

    run(test)


@pytest.mark.parametrize(
    ("protocol", "path", "header", "value"),
    [
        ("chat", "/v1/chat/completions", "authorization", "Bearer sk-route"),
        ("messages", "/v1/messages", "x-api-key", "sk-route"),
        ("gemini", "/v1/models/g:streamGenerateContent", "x-goog-api-key", "sk-route"),
    ],
)
def test_the_route_credential_goes_in_its_protocols_header(
    monkeypatch: pytest.MonkeyPatch, protocol: str, path: str, header: str, value: str
) -> None:
    monkeypatch.setenv("GW_TEST_ROUTE_KEY", "sk-route")
    route = {
        "name": "r",
        "prefix": "/v1",
        "upstream": "http://upstream.test/v1",
        "protocol": protocol,
        "credential_env": "GW_TEST_ROUTE_KEY",
    }
    upstream = Upstream(
        lambda r: answer(200, b'{"ok": true}', **{"content-type": "application/json"})
    )

    async def test() -> None:
        async with in_process(upstream, routes=[route]) as client:
            await client.post(path, json={"model": "m"}, headers={"x-api-key": "client-key"})
        (sent,) = upstream.requests
        assert sent.headers[header] == value
        others = {"authorization", "x-api-key", "x-goog-api-key"} - {header}
        assert not others & set(sent.headers.keys())  # the client's key never passes

    run(test)


@pytest.mark.parametrize(
    ("upstream_url", "path", "header"),
    [
        # a path a protocol claims: that protocol's style, whatever the host
        ("http://upstream.test/v1", "/v1/messages", "x-api-key"),
        ("http://upstream.test/v1", "/v1/models/g:streamGenerateContent", "x-goog-api-key"),
        ("http://api.anthropic.test/v1", "/v1/chat/completions", "authorization"),
        ("http://upstream.test/v1", "/v1/api/chat", "authorization"),
        # a path no protocol claims: guessed from the upstream's host
        ("http://api.anthropic.test/v1", "/v1/models", "x-api-key"),
        ("http://upstream.test/v1", "/v1/models", "authorization"),
    ],
)
def test_on_a_route_for_any_path_the_credential_style_is_the_request_protocols(
    monkeypatch: pytest.MonkeyPatch, upstream_url: str, path: str, header: str
) -> None:
    monkeypatch.setenv("GW_TEST_ROUTE_KEY", "sk-route")
    route = {
        "name": "r",
        "prefix": "/v1",
        "upstream": upstream_url,
        "credential_env": "GW_TEST_ROUTE_KEY",
    }
    upstream = Upstream(
        lambda r: answer(200, b'{"ok": true}', **{"content-type": "application/json"})
    )

    async def test() -> None:
        async with in_process(upstream, routes=[route]) as client:
            await client.post(path, json={"model": "m", "stream": False})
        (sent,) = upstream.requests
        expected = "Bearer sk-route" if header == "authorization" else "sk-route"
        assert sent.headers[header] == expected
        others = {"authorization", "x-api-key", "x-goog-api-key"} - {header}
        assert not others & set(sent.headers.keys())

    run(test)


PULL_PROGRESS = b'{"status":"pulling manifest"}\n{"status":"success"}\n'


@pytest.mark.parametrize("protocol", ["ollama", "auto"])
def test_an_ndjson_answer_no_request_streamed_is_relayed_plain_and_not_invalid_json(
    protocol: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Ollama's /api/pull answers with NDJSON progress lines: a bulk answer, not a stream
    upstream = Upstream(
        lambda r: answer(200, PULL_PROGRESS, **{"content-type": "application/x-ndjson"})
    )
    route = {"name": "o", "prefix": "/api", "upstream": "http://upstream.test/api"}
    routes = [{**route, "protocol": protocol}]

    async def test() -> None:
        async with in_process(upstream, routes=routes, access_log=True) as c:
            response = await c.post(
                "/api/pull", json={"model": "m"}, headers={"x-request-id": "pull-1"}
            )
            metrics = (await c.get("/metrics")).text
        assert response.content == PULL_PROGRESS  # nothing appended
        assert metric_value(metrics, "gateway_streams_total", route="o") == 0

    run(test)
    line = access_log_line(capsys, "pull-1")
    assert line["error"] is None
    assert line["stream"] is False
    assert line["outcome"] is None


def test_usage_is_asked_for_and_withheld_from_a_client_that_did_not() -> None:
    upstream = Upstream(lambda r: answer(200, chat_stream(usage=True), **SSE))
    route = {
        "name": "r",
        "prefix": "/v1",
        "upstream": "http://upstream.test/v1",
        "inject_include_usage": True,
    }

    async def test() -> None:
        async with in_process(upstream, routes=[route]) as client:
            response = await client.post("/v1/chat/completions", json=CHAT)
            metrics = (await client.get("/metrics")).text
        sent = json.loads(upstream.requests[0].content)
        assert sent["stream_options"] == {"include_usage": True}
        assert b'"usage"' not in response.content
        assert metric_value(metrics, "gateway_tokens_total", type="input") == 3

    run(test)


def test_a_stream_asked_for_in_the_url_is_counted_before_any_answer() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    route = {"name": "g", "prefix": "/v1beta", "upstream": "http://upstream.test/v1beta"}

    async def test() -> None:
        async with in_process(Upstream(refuse), routes=[route]) as client:
            path = "/v1beta/models/g:streamGenerateContent?alt=sse"
            response = await client.post(path, json={"contents": []})
            metrics = (await client.get("/metrics")).text
        assert response.status_code == 502
        assert metric_value(metrics, "gateway_streams_total", reason="upstream_unavailable") == 1

    run(test)


def test_a_broken_plain_answer_is_recorded() -> None:
    upstream = Upstream(lambda r: answer(200, b'{"id": ', **{"content-type": "application/json"}))

    async def test() -> None:
        async with in_process(upstream) as client:
            response = await client.post("/v1/chat/completions", json={"model": "m"})
            metrics = (await client.get("/metrics")).text
        assert response.status_code == 200
        assert response.content == b'{"id": '  # relayed unchanged
        assert metric_value(metrics, "gateway_request_errors_total", error="invalid_json") == 1

    run(test)


def test_request_ids_and_forwarding_headers() -> None:
    upstream = Upstream(
        lambda r: answer(200, b"{}", **{"x-request-id": "up-1", "content-type": "application/json"})
    )

    async def test() -> None:
        async with in_process(upstream) as client:
            response = await client.post(
                "/v1/chat/completions",
                json={"model": "m"},
                headers={"x-request-id": "mine-1", "x-forwarded-for": "6.6.6.6"},
            )
        assert response.headers["x-request-id"] == "mine-1"
        assert response.headers["x-upstream-request-id"] == "up-1"
        (sent,) = upstream.requests
        assert sent.headers["x-request-id"] == "mine-1"
        # the client's claim is kept, and the real peer is appended after it
        assert sent.headers["x-forwarded-for"].startswith("6.6.6.6, ")

    run(test)


def test_each_read_that_carries_output_after_the_first_is_one_chunk_gap() -> None:
    """Four content reads: one time to first token and three gaps, bucketed once per stream."""

    def event(content: str | None, finish: str | None = None) -> bytes:
        delta = {"content": content} if content is not None else {}
        return _event(
            {"model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        )

    async def reads() -> AsyncIterator[bytes]:
        for piece in ("a", "b", "c", "d"):
            yield event(piece)
        yield event(None, "stop") + b"data: [DONE]\n\n"  # carries no output: no gap

    upstream = Upstream(lambda r: httpx.Response(200, headers=SSE, content=reads()))

    async def test() -> None:
        async with in_process(upstream) as client:
            response = await client.post("/v1/chat/completions", json=CHAT)
            metrics = (await client.get("/metrics")).text
        assert annotation(response.content)["outcome"] == "complete"
        gaps = "gateway_time_per_output_chunk_seconds"
        assert metric_value(metrics, gaps + "_count", route="default", model="m") == 3
        assert metric_value(metrics, gaps + "_bucket", route="default", le="+Inf") == 3
        assert metric_value(metrics, "gateway_time_to_first_token_seconds_count", model="m") == 1

    run(test)


LIMITED_SPECS = [s for s in REGISTRY if s.output_limit and s.requests is not None]


@pytest.mark.parametrize("spec", LIMITED_SPECS, ids=lambda spec: spec.name)
def test_a_named_clients_reservation_is_the_requests_own_output_limit(spec: Any) -> None:
    """A request that allows itself 50 tokens, in its protocol's own field, reserves 50
    tokens of output, not the route's default (which alone would not fit the client's
    minute): each protocol's request, as its own clients write it."""
    upstream = Upstream(lambda r: answer(200, b"{}", **{"content-type": "application/json"}))
    route = {
        "name": "r",
        "prefix": "/p",
        "upstream": "http://upstream.test",
        "protocol": spec.name,
        "default_output_reservation": 100_000,
    }
    clients = [
        {
            "name": "team",
            "key_sha256": [hashlib.sha256(b"sk-team").hexdigest()],
            "limits": {"tokens_per_minute": 10_000},
        }
    ]
    assert spec.requests is not None
    body = spec.requests.text("m", "hi", 50, False)

    async def test() -> httpx.Response:
        async with in_process(upstream, routes=[route], clients=clients) as client:
            return await client.post(
                "/p" + spec.requests.path("m", False),
                json=body,
                headers={"authorization": "Bearer sk-team", **spec.requests.headers},
            )

    response = asyncio.run(test())
    assert response.status_code != 429, response.text
    assert len(upstream.requests) == 1
    reserved = 10_000 - int(response.headers["x-ratelimit-remaining-tokens"])
    assert 50 <= reserved < 50 + 100  # the output, and a few tokens of input


ID_HEADERS = [
    (spec, header)
    for spec in REGISTRY
    if spec.requests is not None
    for header in spec.request_id_headers
]


@pytest.mark.parametrize(("spec", "header"), ID_HEADERS, ids=lambda v: getattr(v, "name", v))
def test_the_upstreams_request_id_is_read_from_its_protocols_header(spec: Any, header: str) -> None:
    """Each protocol's upstreams name their request id in their own header: the client
    gets it as ``x-upstream-request-id``."""
    head = {"content-type": "application/json", header: "up-1"}
    upstream = Upstream(lambda r: answer(200, b"{}", **head))
    route = {"name": "r", "prefix": "/p", "upstream": "http://upstream.test", "protocol": spec.name}
    assert spec.requests is not None

    async def test() -> httpx.Response:
        async with in_process(upstream, routes=[route]) as client:
            return await client.post(
                "/p" + spec.requests.path("m", False),
                json=spec.requests.text("m", "hi", 5, False),
                headers=dict(spec.requests.headers),
            )

    assert asyncio.run(test()).headers["x-upstream-request-id"] == "up-1"


def test_the_limits_settle_last_once_the_entry_is_kept_and_the_slot_is_free() -> None:
    """The stages' order is a behaviour: a named client's reservation is settled after
    the cache kept the answer's entry and the stream's slot was given back (the limits
    are outermost of the cache's serve and the stream slot: ``app.py``'s ``_stages``).
    Listed inside either, the settle would see the entry unended or the slot held."""
    from gateway.cache.entry import entry_name

    upstream = Upstream(lambda r: answer(200, chat_stream(usage=True), **SSE))
    route = {"name": "r", "prefix": "/v1", "upstream": "http://upstream.test/v1", "cache": True}
    clients = [
        {
            "name": "team",
            "key_sha256": [hashlib.sha256(b"sk-team").hexdigest()],
            "limits": {"tokens_per_minute": 10_000},
        }
    ]
    settings = load_settings(access_log=False, routes=[route], clients=clients)
    app = create_app(settings, transport=httpx.MockTransport(upstream))
    gateway = app.gateway  # type: ignore[attr-defined]
    at_settle: list[tuple[dict[str, Any], int]] = []

    async def test() -> tuple[httpx.Response, str | None]:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c,
        ):
            limiter, store = gateway.limiter, gateway.store
            settle = limiter.settle

            async def observed(reservation: Any, cost: Any, served: bool = True) -> None:
                ends = {sid: log.end for sid, log in store._logs.items()}
                at_settle.append((ends, gateway.relay.admission.active_streams))
                await settle(reservation, cost, served)

            limiter.settle = observed
            response = await c.post(
                "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer sk-team"}
            )
            entry = await store.resolve(entry_name(response.headers["x-gateway-cache-key"]))
            return response, entry

    response, entry = asyncio.run(test())
    assert response.headers["x-gateway-cache"] == "MISS"
    assert len(at_settle) == 1
    ends, active = at_settle[0]
    assert ends[entry] is not None  # the entry's log had its end
    assert ends[entry].fields["stored"] == "1"  # and was kept
    assert active == 0


def test_a_log_written_before_logs_kept_their_head_is_not_read_as_one() -> None:
    """A resumable stream logged by a version that kept no head (its event 1 is the
    stream's first event, its content type in the meta) is answered 404, as a stream
    that never was, never read with its first event taken for a head."""
    from gateway.resume.ids import new_id

    upstream = Upstream(lambda r: answer(200, chat_stream(), **SSE))
    route = {"name": "r", "prefix": "/v1", "upstream": "http://upstream.test/v1", "resume": True}
    clients = [{"name": "team", "key_sha256": [hashlib.sha256(b"sk-team").hexdigest()]}]
    settings = load_settings(access_log=False, routes=[route], clients=clients)
    app = create_app(settings, transport=httpx.MockTransport(upstream))
    gateway = app.gateway  # type: ignore[attr-defined]
    auth = {"authorization": "Bearer sk-team"}

    async def test() -> tuple[httpx.Response, httpx.Response]:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c,
        ):
            old_meta = {"content_type": "text/event-stream", "path": "/chat/completions"}
            writer = await gateway.store.open(
                "client:team",
                {**old_meta, "request_id": "old", "route": "r"},
                max_bytes=1 << 20,
                ttl=60,
                lease=5,
                stream_id=new_id(),
            )
            writer.append(chat_stream())
            await writer.finish(End(b"", {"outcome": "complete", "reason": "stop"}))
            old = await c.get(f"/v1/gateway/streams/{writer.id}", headers=auth)
            fresh = await c.post("/v1/chat/completions", json=CHAT, headers=auth)
            stream_id = fresh.headers["x-gateway-stream-id"]
            return old, await c.get(f"/v1/gateway/streams/{stream_id}", headers=auth)

    old, again = asyncio.run(test())
    assert old.status_code == 404
    assert old.json()["error"]["code"] == "stream_not_found"
    assert again.status_code == 200  # a log of this version is read from its head on
    assert again.content.startswith(chat_stream())
