"""Resumable streams end to end in one gateway (the memory store) before the simulator.

A client cut after K events that resumes from K gets, with what it had, the
bytes an uncut client gets (the trailer's request id aside), for every protocol
and for an upstream that ends its lines with CRLF; a client that leaves early
leaves the generation running (detached, judged whole, charged); bad ids and
cursors get their 404/410/400; a cancel ends the stream ``cancelled``; many
resumers of one live stream each get every byte of one upstream read; and the
store's bounds hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import socket
import time
from typing import Any

import httpx
import pytest

from gateway.settings import Settings
from tests import web
from tests.client_events import Splitter
from tests.conftest import ServerThread
from tests.integration.helpers import access_log_until, annotation, gateway_for, metric_value
from tests.integration.redis_server import redis_server

KEY_A, KEY_B = "sk-resume-alice-0001", "sk-resume-bob-0002"
AUTH_A = {"authorization": f"Bearer {KEY_A}"}
AUTH_B = {"authorization": f"Bearer {KEY_B}"}
STREAM_ID = re.compile(r"[A-Za-z0-9_-]{27}~[0-9a-f]+")
REQUEST_ID = re.compile(rb"request_id=[A-Za-z0-9._-]+")

PROTOCOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": [], "stream": True}),
    "completions": ("/v1/completions", {"prompt": "p", "stream": True}),
    "responses": ("/v1/responses", {"input": "p", "stream": True}),
    "messages": ("/v1/messages", {"messages": [], "max_tokens": 64, "stream": True}),
    "gemini": ("/v1beta/models/sim-model:streamGenerateContent?alt=sse", {"contents": []}),
    "ollama": ("/api/chat", {"messages": []}),
}


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _routes(simulator: ServerThread, **extra: Any) -> list[dict[str, Any]]:
    common = {"resume": True, **extra}
    return [
        {"name": "v1", "prefix": "/v1", "upstream": simulator.url + "/v1", **common},
        {"name": "gem", "prefix": "/v1beta", "upstream": simulator.url + "/v1beta", **common},
        {
            "name": "oll",
            "prefix": "/api",
            "upstream": simulator.url + "/api",
            "protocol": "ollama",
            **common,
        },
    ]


CLIENTS = [
    {"name": "alice", "key_sha256": [_sha(KEY_A)]},
    {"name": "bob", "key_sha256": [_sha(KEY_B)]},
]


@pytest.fixture(scope="module")
def gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    return {"routes": _routes(simulator), "clients": CLIENTS}


def _request(protocol: str, **sim: str) -> tuple[str, dict[str, Any], dict[str, str]]:
    path, body = PROTOCOLS[protocol]
    headers = {**AUTH_A, **{f"x-sim-{k.replace('_', '-')}": v for k, v in sim.items()}}
    return path, {"model": "sim-model", **body}, headers


def _events(body: bytes, ndjson: bool = False) -> list[bytes]:
    return Splitter(ndjson).feed(body)


def cut_after(
    url: str, body: dict[str, Any], headers: dict[str, str], k: int, ndjson: bool = False
) -> tuple[str, str, bytes]:
    """Read a stream until ``k`` whole events came, then drop the connection: the
    stream id, the request id and the events received."""
    splitter = Splitter(ndjson)
    got: list[bytes] = []
    with web.stream("POST", url, json=body, headers=headers, timeout=30) as response:
        assert response.status_code == 200
        stream_id = response.headers["x-gateway-stream-id"]
        request_id = response.headers["x-request-id"]
        if k:
            for chunk in response.iter_raw():
                got += splitter.feed(chunk)
                if len(got) >= k:
                    break
    return stream_id, request_id, b"".join(got[:k])


def resume(
    base: str, stream_id: str, after: object, headers: dict[str, str] | None = None, **params: Any
) -> httpx.Response:
    """``GET {base}/gateway/streams/{id}?starting_after=after`` (None: no cursor)."""
    query = {**params} if after is None else {"starting_after": after, **params}
    return web.get(
        f"{base}/gateway/streams/{stream_id}",
        params=query,
        headers=AUTH_A if headers is None else headers,
        timeout=60,
    )


def _prefix(path: str) -> str:
    return "/" + path.split("/")[1]


def _same(a: bytes, b: bytes) -> bool:
    """Equal bytes, the request ids (trailer, error messages) aside."""
    return REQUEST_ID.sub(b"", a) == REQUEST_ID.sub(b"", b)


@pytest.mark.parametrize("crlf", [False, True], ids=["lf", "crlf"])
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_cut_and_resumed_is_the_uncut_stream(
    gateway: ServerThread, protocol: str, crlf: bool
) -> None:
    path, body, headers = _request(protocol, tokens="40", tps="400", seed="7", crlf=str(crlf))
    whole = web.post(gateway.url + path, json=body, headers=headers, timeout=30)
    assert whole.status_code == 200
    assert STREAM_ID.fullmatch(whole.headers["x-gateway-stream-id"])
    ndjson = protocol == "ollama"
    events = _events(whole.content, ndjson)
    assert len(events) > 10
    if crlf:
        assert b"\r\n" in whole.content
    for k in (0, 1, 3, len(events) // 2):
        stream_id, _, head = cut_after(gateway.url + path, body, headers, k, ndjson)
        rest = resume(gateway.url + _prefix(path), stream_id, k)
        assert rest.status_code == 200, rest.text
        assert rest.headers["content-type"] == whole.headers["content-type"]
        assert rest.headers["x-gateway-stream-id"] == stream_id
        assert _same(head + rest.content, whole.content), (protocol, k)


def test_a_client_that_leaves_at_event_3_of_200(
    simulator: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    path, body, headers = _request("chat", tokens="200", tps="100", seed="3")
    body["stream_options"] = {"include_usage": True}
    with gateway_for("", routes=_routes(simulator), clients=CLIENTS, access_log=True) as gw:
        uncut = web.post(gw.url + path, json=body, headers=headers, timeout=30).content
        stream_id, request_id, head = cut_after(gw.url + path, body, headers, 3)
        # The upstream is read to its end without the client: its line comes then.
        line = next(
            e for e in access_log_until(capsys, request_id) if e["request_id"] == request_id
        )
        rest = resume(gw.url + "/v1", stream_id, 3)
        metrics = web.get(gw.url + "/metrics").text
    assert line["detached"] is True
    assert (line["outcome"], line["reason"]) == ("complete", "stop")
    assert line["error"] is None
    reported = next(e for e in _events(uncut) if b'"usage":{' in e and b'"prompt_tokens"' in e)
    assert line["usage"] is not None
    assert f'"completion_tokens":{line["usage"]["output"]}'.encode() in reported.replace(b" ", b"")
    assert line["charged"]["source"] == "reported"
    assert line["charged"]["output"] == line["usage"]["output"]
    assert line["bytes_out"] < len(uncut)  # what the client got, not the whole answer
    assert rest.status_code == 200
    assert len(_events(uncut)) > 200
    assert _events(rest.content)[:-1] == _events(uncut)[3:-1]  # events 4 on, then the trailer
    assert _same(head + rest.content, uncut)
    assert annotation(rest.content)["outcome"] == "complete"
    assert metric_value(metrics, "gateway_resumes_total", route="v1", result="ok") == 1
    assert metric_value(metrics, "gateway_detached_streams", route="v1") == 0


def test_bad_ids_and_cursors(simulator: ServerThread) -> None:
    routes = _routes(simulator, resume_ttl_seconds=1.0)
    with gateway_for("", routes=routes, clients=CLIENTS) as gw:
        path, body, headers = _request("chat", tokens="5", seed="1")
        answer = web.post(gw.url + path, json=body, headers=headers, timeout=30)
        stream_id = answer.headers["x-gateway-stream-id"]
        count = len(_events(answer.content))
        assert resume(gw.url + "/v1", stream_id, count).status_code == 200  # at the end: ok
        # The trailer comment counted as an event: the rest of the ending, nothing.
        past = resume(gw.url + "/v1", stream_id, count + 1)
        assert (past.status_code, past.content) == (200, b"")
        statuses = {
            after: resume(gw.url + "/v1", stream_id, after).status_code
            for after in ("-1", "1.5", "abc", "", "0x1", str(count + 2), "9" * 30)
        }
        assert statuses == dict.fromkeys(statuses, 400), statuses
        bad = resume(gw.url + "/v1", stream_id, "abc")
        assert bad.json()["error"]["code"] == "bad_cursor"
        # Another client's id and ids that never were: the same 404.
        others = resume(gw.url + "/v1", stream_id, 0, headers=AUTH_B)
        never = resume(gw.url + "/v1", stream_id[:-9] + "A" * 9 + stream_id[-9:], 0)
        junk = ("x", "a" * 300, "not.an.id", "Z" * 27 + ".zz")
        garbage = [resume(gw.url + "/v1", bad_id, 0) for bad_id in junk]
        for refused in (others, never, *garbage):
            assert refused.status_code == 404, refused.text
            assert refused.json()["error"]["code"] == "stream_not_found"
        assert others.content.split(b"request_id=")[0] == never.content.split(b"request_id=")[0]
        cancel = web.post(f"{gw.url}/v1/gateway/streams/{stream_id}/cancel", headers=AUTH_B)
        assert cancel.status_code == 404
        time.sleep(2.2)  # the TTL passes (the sweeper runs once a second)
        expired = resume(gw.url + "/v1", stream_id, 0)
        assert expired.status_code == 410, expired.text
        assert expired.json()["error"]["code"] == "stream_expired"
        metrics = web.get(gw.url + "/metrics").text
    for result, count in (("bad_cursor", 8), ("not_found", 6), ("expired", 1), ("ok", 2)):
        assert metric_value(metrics, "gateway_resumes_total", result=result) == count, result


def test_the_messages_route_answers_in_its_error_shape(simulator: ServerThread) -> None:
    routes = [{"name": "a", "prefix": "/anthropic", "upstream": simulator.url + "/v1",
               "protocol": "messages", "resume": True}]  # fmt: skip
    with gateway_for("", routes=routes) as gw:
        missing = resume(gw.url + "/anthropic", "nope", 0, headers={})
    assert missing.status_code == 404
    assert missing.json()["type"] == "error"
    assert missing.json()["error"]["type"] == "not_found_error"


def test_last_event_id_and_ids(gateway: ServerThread) -> None:
    path, body, headers = _request("chat", tokens="10", seed="2")
    answer = web.post(gateway.url + path, json=body, headers=headers, timeout=30)
    stream_id = answer.headers["x-gateway-stream-id"]
    events = _events(answer.content)
    by_header = resume(
        gateway.url + "/v1", stream_id, None, headers={**AUTH_A, "last-event-id": "4"}
    )
    by_query = resume(gateway.url + "/v1", stream_id, 4, ids="1")
    assert by_header.content == by_query.content
    assert _events(by_header.content) == [
        b"id: %d\n%s" % (n, e) for n, e in enumerate(events[4:], start=5)
    ]
    plain = resume(gateway.url + "/v1", stream_id, 4)
    assert b"id: " not in plain.content
    # An EventSource reconnects to the URL it was given (docs/resume.md's has
    # starting_after=0) with Last-Event-ID: the header, which is newer, wins.
    reconnect = resume(
        gateway.url + "/v1", stream_id, 0, headers={**AUTH_A, "last-event-id": "4"}, ids="1"
    )
    assert reconnect.content == by_header.content


def test_opting_out_and_a_route_without_resume(simulator: ServerThread) -> None:
    routes = [*_routes(simulator)[:1], {"name": "plain", "prefix": "/plain",
              "upstream": simulator.url + "/v1"}]  # fmt: skip
    with gateway_for("", routes=routes, clients=CLIENTS) as gw:
        path, body, headers = _request("chat", tokens="5")
        off = web.post(gw.url + path, json=body, headers={**headers, "x-gateway-resume": "off"})
        plain = web.post(gw.url + "/plain/chat/completions", json=body, headers=headers)
        on = web.post(gw.url + path, json=body, headers=headers)
        seen = web.get(simulator.url + "/_sim/requests", params={"limit": 3}).json()["data"]
        wrong_method = web.delete(f"{gw.url}/v1/gateway/streams/abc", headers=AUTH_A)
        deeper = web.get(f"{gw.url}/v1/gateway/streams/abc/def", headers=AUTH_A)
    assert "x-gateway-stream-id" not in off.headers
    assert "x-gateway-stream-id" not in plain.headers
    # The gateway's own header and paths never reach the upstream.
    assert all("x-gateway-resume" not in {k.lower() for k in r["headers"]} for r in seen)
    assert (wrong_method.status_code, deeper.status_code) == (405, 404)
    assert off.content == plain.content.replace(
        plain.headers["x-request-id"].encode(), off.headers["x-request-id"].encode()
    )
    assert "x-gateway-stream-id" in on.headers


def test_cancel_ends_the_stream_cancelled(gateway: ServerThread) -> None:
    path, body, headers = _request("chat", tokens="2000", tps="50")
    with web.stream("POST", gateway.url + path, json=body, headers=headers, timeout=60) as live:
        stream_id = live.headers["x-gateway-stream-id"]
        chunks = live.iter_raw()
        first = next(chunks)
        cancel = web.post(f"{gateway.url}/v1/gateway/streams/{stream_id}/cancel", headers=AUTH_A)
        rest = b"".join(chunks)
    assert cancel.status_code == 200
    assert cancel.json()["reason"] == "cancelled"
    got = first + rest
    assert annotation(got)["reason"] == "cancelled"
    assert b'"code":"cancelled"' in got or b'"code": "cancelled"' in got
    again = web.post(f"{gateway.url}/v1/gateway/streams/{stream_id}/cancel", headers=AUTH_A)
    assert again.status_code == 200
    assert again.json() == cancel.json()
    replay = resume(gateway.url + "/v1", stream_id, 0)
    assert _same(replay.content, got)


def test_a_hundred_resumers_of_one_live_stream(simulator: ServerThread) -> None:
    path, body, headers = _request("chat", tokens="300", tps="150", seed="5")

    async def main(url: str) -> tuple[bytes, list[bytes]]:
        async with web.async_client(timeout=60) as client:
            async with client.stream("POST", url + path, json=body, headers=headers) as live:
                stream_id = live.headers["x-gateway-stream-id"]
                readers = [
                    asyncio.create_task(
                        client.get(f"{url}/v1/gateway/streams/{stream_id}", headers=AUTH_A)
                    )
                    for _ in range(100)
                ]
                original = await live.aread()
            answers = await asyncio.gather(*readers)
        assert {a.status_code for a in answers} == {200}
        return original, [a.content for a in answers]

    with gateway_for("", routes=_routes(simulator), clients=CLIENTS) as gw:
        before = web.get(simulator.url + "/_sim/requests").json()["total"]
        original, copies = asyncio.run(main(gw.url))
        after = web.get(simulator.url + "/_sim/requests").json()["total"]
    assert after - before == 1  # the upstream was read once
    assert annotation(original)["outcome"] == "complete"
    for copy in copies:
        assert copy == original


@pytest.mark.parametrize("store", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_thousand_resumable_streams_stay_within_the_store(
    simulator: ServerThread, store: str
) -> None:
    """1,000 streams at once, each past its route's resume_max_bytes, and together past
    the store's bound: every client gets its whole stream; the store holds at most its
    bound; once it is spent, new streams go without resume and say so."""
    cap, bound = 2048, 512 * 1024
    routes = _routes(simulator, resume_max_bytes=cap)
    path, body, headers = _request("chat", tokens="40", seed="6")

    async def one(client: httpx.AsyncClient, url: str) -> httpx.Response:
        return await client.post(url + path, json=body, headers=headers)

    async def main(url: str) -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=1000)
        async with web.async_client(timeout=120, limits=limits) as client:
            return await asyncio.gather(*(one(client, url) for _ in range(1000)))

    with contextlib.ExitStack() as stack:
        options: dict[str, Any] = {}
        if store == "redis":
            server = stack.enter_context(redis_server())
            options = {"stream_store": "redis", **server.settings}
        gw = stack.enter_context(
            gateway_for("", routes=routes, clients=CLIENTS, stream_store_max_bytes=bound, **options)
        )
        answers = asyncio.run(main(gw.url))
        # After the burst the store is spent (a burst's logs may all have opened before
        # it was: each then stops at the bound): the next stream is refused.
        answers.append(web.post(gw.url + path, json=body, headers=headers, timeout=60))
        metrics = web.get(gw.url + "/metrics").text
        kept = [a for a in answers if "x-gateway-stream-id" in a.headers]
        stopped = resume(gw.url + "/v1", kept[0].headers["x-gateway-stream-id"], 30)
    refused = [(a.status_code, a.content[:300]) for a in answers if a.status_code != 200]
    assert not refused, (len(refused), refused[:3])  # with what the gateway said
    assert {annotation(a.content)["outcome"] for a in answers} == {"complete"}
    assert len({_same(a.content, answers[0].content) for a in answers}) == 1
    assert len(answers[0].content) > 2 * cap  # every stream is past its cap
    off = [a for a in answers if "x-gateway-stream-id" not in a.headers]
    assert answers[-1] in off  # the store's bound was reached ...
    assert {a.headers["x-gateway-resume"] for a in off} == {"off; reason=store_full"}
    assert len(kept) >= bound // cap // 2  # ... after it held many logs
    held = metric_value(metrics, "gateway_stream_store_bytes")
    assert 0 < held <= bound
    assert metric_value(metrics, "gateway_resume_off_total", reason="store_full") == len(off)
    assert stopped.status_code == 410  # beyond what its log kept


@pytest.mark.parametrize("store", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_cursor_past_a_live_streams_kept_part_is_gone(
    simulator: ServerThread, store: str
) -> None:
    """While the stream still runs, a cursor past the part its log kept (its
    resume_max_bytes) is 410 ``stream_expired``, as after its end: the Redis log's
    counters are written with its kept events only, so its count of events lags once
    it stopped, which must not read as a cursor beyond the stream (400)."""
    routes = _routes(simulator, resume_max_bytes=2048)
    path, body, headers = _request("chat", tokens="400", tps="20", seed="3")
    with contextlib.ExitStack() as stack:
        options: dict[str, Any] = {}
        if store == "redis":
            server = stack.enter_context(redis_server())
            options = {"stream_store": "redis", **server.settings}
        gw = stack.enter_context(gateway_for("", routes=routes, clients=CLIENTS, **options))
        stream_id, _, head = cut_after(gw.url + path, body, headers, 20)
        assert len(head) > 2048  # the client got past what the log keeps
        live = resume(gw.url + "/v1", stream_id, 20)
        cancel = web.post(f"{gw.url}/v1/gateway/streams/{stream_id}/cancel", headers=AUTH_A)
    assert cancel.json()["reason"] == "cancelled"  # it was still running
    assert live.status_code == 410, live.text
    assert live.json()["error"]["code"] == "stream_expired"


def test_a_stalled_client_is_cut_and_the_answer_goes_on(
    simulator: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.integration.test_relay_failures import _raw_request

    routes = _routes(simulator, resume_max_bytes=64 * 1024 * 1024)
    body = json.dumps({"model": "sim-model", "messages": [], "stream": True}).encode()
    sim = {"x-sim-tokens": "1500", "x-sim-chunk-bytes": "5000", **AUTH_A}
    timeouts = {"client_send": 1.0}
    with gateway_for("", routes=routes, clients=CLIENTS, access_log=True, timeouts=timeouts) as gw:
        conn = _raw_request(gw.port, sim, body, rcvbuf=64 * 1024)
        with conn:
            conn.settimeout(30)
            head = conn.recv(65536, socket.MSG_PEEK).partition(b"\r\n\r\n")[0]
            match = re.search(rb"x-gateway-stream-id: (\S+)", head, re.IGNORECASE)
            assert match is not None
            request_id = re.search(rb"x-request-id: (\S+)", head, re.IGNORECASE)
            assert request_id is not None
            # The client never reads: cut after client_send, the answer read on.
            lines = access_log_until(capsys, request_id.group(1).decode())
        line = next(e for e in lines if e["request_id"] == request_id.group(1).decode())
        replay = resume(gw.url + "/v1", match.group(1).decode(), 0)
    assert line["error"] == "client_stalled"
    assert line["detached"] is True
    assert (line["outcome"], line["reason"]) == ("complete", "stop")
    assert replay.status_code == 200
    assert len(replay.content) > 1500 * 5000 // 2
    assert annotation(replay.content)["outcome"] == "complete"


def test_on_client_disconnect_cancel_closes_the_upstream(
    simulator: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    routes = _routes(simulator, on_client_disconnect="cancel")
    path, body, headers = _request("chat", tokens="2000", tps="100")
    with gateway_for("", routes=routes, clients=CLIENTS, access_log=True) as gw:
        stream_id, request_id, head = cut_after(gw.url + path, body, headers, 3)
        line = next(
            e for e in access_log_until(capsys, request_id) if e["request_id"] == request_id
        )
        rest = resume(gw.url + "/v1", stream_id, 3)
    assert (line["outcome"], line["reason"], line["detached"]) == (
        "incomplete",
        "client_disconnect",
        False,
    )
    assert rest.status_code == 200
    assert annotation(head + rest.content)["reason"] == "client_disconnect"


def test_settings_refuse_what_cannot_work() -> None:
    route = {"name": "r", "prefix": "/v1", "upstream": "http://127.0.0.1:9/v1", "resume": True}
    with pytest.raises(ValueError, match='stream_store = "redis"'):
        Settings(routes=[route], workers=2)
    Settings(routes=[route], workers=2, stream_store="redis", redis_url="redis://127.0.0.1:1")
    with pytest.raises(ValueError, match="needs resume = true"):
        Settings(routes=[{**route, "resume": False, "on_client_disconnect": "finish"}])
    with pytest.raises(ValueError, match="needs redis_url"):
        Settings(routes=[route], stream_store="redis")
    assert Settings(routes=[route]).routes[0].detaches
    assert not Settings(routes=[{**route, "on_client_disconnect": "cancel"}]).routes[0].detaches


def test_a_detached_stream_is_read_for_detach_max_seconds_at_most(
    simulator: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    routes = _routes(simulator, detach_max_seconds=1.0)
    path, body, headers = _request("chat", tokens="100000", tps="100")
    with gateway_for("", routes=routes, clients=CLIENTS, access_log=True) as gw:
        stream_id, request_id, head = cut_after(gw.url + path, body, headers, 3)
        line = next(
            e for e in access_log_until(capsys, request_id) if e["request_id"] == request_id
        )
        rest = resume(gw.url + "/v1", stream_id, 3)
        metrics = web.get(gw.url + "/metrics").text
    assert line["detached"] is True
    assert (line["outcome"], line["reason"]) == ("incomplete", "total_timeout")
    assert annotation(head + rest.content)["reason"] == "total_timeout"
    assert len(_events(rest.content)) > 10  # it did go on after the client left
    assert metric_value(metrics, "gateway_detached_streams", route="v1") == 0
