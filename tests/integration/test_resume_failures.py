"""Resume and the stream store under failure: two gateway processes on one real
``redis-server``, an owner SIGKILLed, Redis SIGSTOPped (issue 44).

- A stream resumes only under the route that made it.
- A made-up id, a young one included, costs what any other unknown id costs: one
  look at the store (no timing oracle).
- A Redis pause: the store's breaker fails every call at once after the first, with
  one log line when the outage starts and one when it ends; no stream id is handed
  out that the store has not taken; ``/readyz`` says so.
- A Redis pause during a stream: the writer keeps what it could not write and writes
  it once Redis is back, so the log ends as the client's answer did (never a false
  ``owner_lost``).
- A ``resume_ttl_seconds`` shorter than the lease: a dead owner's unended log lives
  until a takeover had its chance; its follower gets the ending, not a reset.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.resume.ids import new_id
from tests import web
from tests.client_events import Splitter
from tests.conftest import GatewayProcess, ServerThread, gateway_process
from tests.integration.helpers import access_log_lines, annotation, metric_value
from tests.integration.redis_server import RedisServer, also_on_a_cluster
from tests.integration.test_resume_streams import REQUEST_ID, cut_after, resume

#: Every test here is Redis-backed: run against a cluster too (make test-redis-cluster).
pytestmark = pytest.mark.redis

BODY = {"model": "sim-model", "messages": [], "stream": True}
CHAT = "/v1/chat/completions"


def _config(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer, *, lease: float = 1.0, **route: Any
) -> Path:
    """Three resumable routes over one simulator: ``v1`` and ``v2`` (chat), ``oll``."""
    extra = "".join(f"{key} = {value!r}\n" for key, value in route.items()).replace("'", '"')
    extra = extra.replace("True", "true")
    path = tmp_path / "gateway.toml"
    path.write_text(f"""
stream_store = "redis"
{redis.toml}
stream_lease_seconds = {lease}
stream_store_timeout = 2.0
[[routes]]
name = "v1"
prefix = "/v1"
upstream = "{simulator.url}/v1"
resume = true
{extra}
[[routes]]
name = "v2"
prefix = "/v2"
upstream = "{simulator.url}/v1"
resume = true
[[routes]]
name = "oll"
prefix = "/api"
upstream = "{simulator.url}/api"
protocol = "ollama"
resume = true
""")
    return path


@contextlib.contextmanager
def two_gateways(config: Path) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    with (
        gateway_process(["--config", str(config)]) as a,
        gateway_process(["--config", str(config)]) as b,
    ):
        yield a, b


@contextlib.contextmanager
def paused(redis: RedisServer) -> Iterator[None]:
    """Redis SIGSTOPped for the block (SIGCONT whatever happens)."""
    with redis.pause():
        yield


def test_a_stream_resumes_only_on_its_own_route(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer
) -> None:
    """A /v1 stream is not found under another chat route nor under an Ollama route
    (whose error shape, continuation upstream and credentials differ)."""
    with two_gateways(_config(tmp_path, simulator, redis)) as (a, b):
        made = web.post(a.url + CHAT, json=BODY, headers={"x-sim-tokens": "20"}, timeout=30)
        stream_id = made.headers["x-gateway-stream-id"]
        own = resume(b.url + "/v1", stream_id, 0, headers={})
        other = resume(b.url + "/v2", stream_id, 0, headers={})
        ollama = resume(b.url + "/api", stream_id, 0, headers={})
        cancel = web.post(f"{b.url}/v2/gateway/streams/{stream_id}/cancel", timeout=30)
    assert own.status_code == 200
    assert REQUEST_ID.sub(b"", own.content) == REQUEST_ID.sub(b"", made.content)
    assert (other.status_code, other.json()["error"]["code"]) == (404, "stream_not_found")
    assert ollama.status_code == 404
    assert "stream_not_found" in ollama.text
    assert cancel.status_code == 404


def test_a_made_up_young_id_costs_what_any_unknown_id_costs(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer
) -> None:
    """A well-formed id stamped now, another owner's real id and an old made-up id:
    the same 404 after the same one look at the store (counted in Redis itself)."""
    with two_gateways(_config(tmp_path, simulator, redis)) as (a, b):
        theirs = web.post(
            a.url + CHAT,
            json=BODY,
            headers={"x-sim-tokens": "5", "authorization": "Bearer someone-else"},
            timeout=30,
        ).headers["x-gateway-stream-id"]
        young, old = new_id(), new_id()[:-8] + "00000001"
        for stream_id in (young, theirs, young, old):
            before = redis.calls("hgetall")
            answer = resume(b.url + "/v1", stream_id, 0, headers={})
            looks = redis.calls("hgetall") - before
            assert answer.status_code in (404, 410), stream_id
            if stream_id != old:
                assert (answer.status_code, answer.json()["error"]["code"]) == (
                    404,
                    "stream_not_found",
                )
            assert looks == 1, (stream_id, looks)


def _first_byte(url: str) -> tuple[float, dict[str, str], bytes]:
    started = time.monotonic()
    headers = {"x-sim-tokens": "20", "x-sim-tps": "400"}
    with web.stream("POST", url + CHAT, json=BODY, headers=headers, timeout=60) as answer:
        waited = time.monotonic() - started
        assert answer.status_code == 200
        return waited, dict(answer.headers), answer.read()


@also_on_a_cluster
def test_a_redis_pause_costs_new_streams_one_bounded_wait(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer
) -> None:
    """Redis SIGSTOPped: the first stream waits at most twice stream_store_timeout (2 s)
    (a call, then the PING that confirms the outage) and
    goes without resume; once the outage is confirmed (one PING, one log line) the next
    ones do not wait on the store at all; no stream id is
    handed out that answers 404 once Redis is back; one log line at the outage's start,
    one at its end; /readyz says the store is unavailable and stays 200."""
    with two_gateways(_config(tmp_path, simulator, redis)) as (a, b):
        answers = []
        with paused(redis):
            answers.append(_first_byte(a.url))
            a.wait_stderr(b"stream store: Redis unavailable", timeout=30)
            for _ in range(5):
                answers.append(_first_byte(a.url))
            ready = web.get(a.url + "/readyz", timeout=10)
        a.wait_stderr(b"Redis answers again", timeout=30)
        resumes = [
            resume(b.url + "/v1", headers["x-gateway-stream-id"], 0, headers={})
            for _, headers, _ in answers
            if "x-gateway-stream-id" in headers
        ]
        after = _first_byte(a.url)
        _, err = a.stop()
    assert all(annotation(body)["outcome"] == "complete" for _, _, body in answers)
    assert [r.status_code for r in resumes] == [200] * len(resumes)
    assert answers[0][0] < 2 * 2.0 + 1.5  # one bounded wait (the timeout, then a PING's)
    assert [w < 1.0 for w, _, _ in answers[1:]] == [True] * 5  # then none at all
    assert {h.get("x-gateway-resume") for _, h, _ in answers[1:]} == {"off; reason=store_error"}
    assert ready.status_code == 200
    assert ready.json()["stream_store"] == "unavailable"
    assert err.count(b"stream store: Redis unavailable") == 1
    assert err.count(b"Redis answers again") == 1
    assert "x-gateway-stream-id" in after[1]


def test_a_redis_pause_never_writes_a_false_ending(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer
) -> None:
    """A stream whose client got it whole while Redis was SIGSTOPped for longer than
    the lease: once Redis is back its log is the client's answer, complete, on either
    gateway (before: owner_lost after what was logged before the pause)."""
    headers = {"x-sim-tokens": "80", "x-sim-tps": "10", "x-sim-seed": "3"}
    with two_gateways(_config(tmp_path, simulator, redis)) as (a, b):
        got: list[bytes] = []
        with web.stream("POST", a.url + CHAT, json=BODY, headers=headers, timeout=60) as live:
            stream_id = live.headers["x-gateway-stream-id"]
            chunks = live.iter_raw()
            got.append(next(chunks))
            with paused(redis):
                deadline = time.monotonic() + 5  # the lease is 1 s, the timeout 2 s
                for chunk in chunks:
                    got.append(chunk)
                    if time.monotonic() > deadline:
                        break
            got += list(chunks)
        whole = b"".join(got)
        a.wait_stderr(b"Redis answers again", timeout=30)
        a.wait_stderr(b"caught up", timeout=30)
        on_b = resume(b.url + "/v1", stream_id, 0, headers={})
        on_a = resume(a.url + "/v1", stream_id, 0, headers={})
    assert annotation(whole)["outcome"] == "complete"
    for again in (on_a, on_b):
        assert again.status_code == 200
        assert REQUEST_ID.sub(b"", again.content) == REQUEST_ID.sub(b"", whole)


def test_a_ttl_shorter_than_the_lease_keeps_a_dead_owners_stream(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer
) -> None:
    """resume_ttl_seconds = 1 with a 2 s lease, the owner SIGKILLed while B follows:
    the follower gets what was logged, then the protocol's error event and trailer
    (owner_lost), never a reset; a second reader gets the same, not 410."""
    config = _config(tmp_path, simulator, redis, lease=2.0, resume_ttl_seconds=1)
    headers = {"x-sim-tokens": "400", "x-sim-tps": "20", "x-sim-seed": "5"}
    with two_gateways(config) as (a, b):
        stream_id, _, head = cut_after(a.url + CHAT, BODY, headers, 3)
        followed: dict[str, Any] = {}
        follower = threading.Thread(
            target=lambda: followed.setdefault("r", resume(b.url + "/v1", stream_id, 3, {}))
        )
        follower.start()
        time.sleep(0.5)  # the follower is on the live tail (nothing to poll for)
        os.kill(a.proc.pid, signal.SIGKILL)
        a.proc.wait(30)
        follower.join(60)
        second = resume(b.url + "/v1", stream_id, 3, headers={})
        metrics = web.get(b.url + "/metrics").text
    first = followed["r"]
    assert first.status_code == 200
    note = annotation(head + first.content)
    assert (note["outcome"], note["reason"]) == ("incomplete", "owner_lost")
    assert b'"code":"owner_lost"' in first.content.replace(b" ", b"")
    assert second.status_code == 200
    assert REQUEST_ID.sub(b"", second.content) == REQUEST_ID.sub(b"", first.content)
    assert metric_value(metrics, "gateway_resumes_total", result="owner_lost") == 1
    events = Splitter(False).feed(head + first.content)
    assert len(events) > 3
    assert re.search(rb"outcome=incomplete", first.content)


def _held_then_kill(url: str, owner: GatewayProcess, k: int) -> tuple[str, list[bytes]]:
    """Read a stream until ``k`` whole events came, SIGKILL its gateway at once, and
    read what was still on the way: the stream id and every whole event the client got."""
    headers = {"x-sim-tokens": "60", "x-sim-tps": "20", "x-sim-seed": "9"}
    splitter = Splitter(False)
    events: list[bytes] = []
    with web.stream("POST", url + CHAT, json=BODY, headers=headers, timeout=60) as live:
        stream_id = live.headers["x-gateway-stream-id"]
        chunks = live.iter_raw()
        with contextlib.suppress(Exception):  # the connection dies with its process
            for chunk in chunks:
                events += splitter.feed(chunk)
                if len(events) >= k:
                    os.kill(owner.proc.pid, signal.SIGKILL)
                    owner.proc.wait(30)
                    break
            for chunk in chunks:
                events += splitter.feed(chunk)
    return stream_id, events


@pytest.mark.parametrize("k", [3, 8, 17])
def test_a_client_is_never_ahead_of_a_killed_owners_log(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer, k: int
) -> None:
    """The owner SIGKILLed at once after an event reached its client: the cursor of
    every event the client holds resumes on the other gateway, at once and after the
    lease, to the same owner_lost ending (before: 400 bad_cursor, one event ahead)."""
    client = redis.client()
    with two_gateways(_config(tmp_path, simulator, redis)) as (a, b):
        stream_id, events = _held_then_kill(a.url, a, k)
        logged = client.xlen(f"gateway:s:{{{stream_id}}}:log")
        at_once = resume(b.url + "/v1", stream_id, len(events), headers={})
        again = resume(b.url + "/v1", stream_id, len(events), headers={})
        whole = resume(b.url + "/v1", stream_id, 0, headers={})
    assert logged >= len(events)
    for answer in (at_once, again):
        assert answer.status_code == 200
        note = annotation(b"".join(events) + answer.content)
        assert (note["outcome"], note["reason"]) == ("incomplete", "owner_lost")
    assert whole.content.startswith(b"".join(events))


def _count(body: bytes, lines: bool = False) -> int:
    return len(Splitter(lines).feed(body))


def test_one_cursor_rule_for_every_ending_and_ids_only_where_events_have_them(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer
) -> None:
    """A cursor counts whole events, the ending's included (the error event, the
    trailer comment): up to the end it gets the rest (maybe nothing) and 200, past it
    400, complete or not, SSE or NDJSON. ``?ids=1`` and ``Last-Event-ID`` on NDJSON
    add nothing (every line stays JSON). A resume of a finished log is logged as a
    stream with its outcome."""
    sse = {"x-sim-tokens": "5", "x-sim-seed": "2"}
    cut = {**sse, "x-sim-fault": "drop_before_done"}
    ollama = ("/api/chat", {"model": "sim-model", "messages": []})
    with two_gateways(_config(tmp_path, simulator, redis)) as (a, b):
        complete = web.post(a.url + CHAT, json=BODY, headers=sse, timeout=30)
        broken = web.post(a.url + CHAT, json=BODY, headers=cut, timeout=30)
        lines = web.post(a.url + ollama[0], json=ollama[1], headers=sse, timeout=30)
        got: dict[str, list[tuple[int, bytes]]] = {}
        for name, answer, base, extra in (
            ("complete", complete, "/v1", 3),
            ("broken", broken, "/v1", 3),
            ("ndjson", lines, "/api", 2),
        ):
            stream_id = answer.headers["x-gateway-stream-id"]
            events = _count(answer.content, lines=base == "/api")
            got[name] = []
            for after in range(events - 1, events + extra):
                again = resume(b.url + base, stream_id, after, headers={})
                got[name].append((again.status_code, again.content))
                if again.status_code == 200 and after <= events:
                    held = Splitter(base == "/api").feed(answer.content)[:after]
                    assert REQUEST_ID.sub(b"", b"".join(held) + again.content) == (
                        REQUEST_ID.sub(b"", answer.content)
                    ), (name, after)
        ndjson_id = lines.headers["x-gateway-stream-id"]
        with_ids = resume(b.url + "/api", ndjson_id, 0, headers={}, ids="1")
        last_id = resume(b.url + "/api", ndjson_id, 0, headers={"last-event-id": "2"})
        out, _ = b.stop()
    assert [s for s, _ in got["complete"]] == [200, 200, 200, 400]  # N-1, N, N+1, N+2
    assert got["complete"][2][1] == b""
    # The error event is one the client counted, the trailer comment one more.
    assert [s for s, _ in got["broken"]] == [200, 200, 200, 400]
    assert [s for s, _ in got["ndjson"]] == [200, 200, 400]
    for answer in (with_ids, last_id):
        assert answer.status_code == 200
        assert all(line.startswith(b"{") for line in answer.content.splitlines()), answer.content
    assert with_ids.content == lines.content.replace(
        lines.headers["x-request-id"].encode(), with_ids.headers["x-request-id"].encode()
    ) or REQUEST_ID.sub(b"", with_ids.content) == REQUEST_ID.sub(b"", lines.content)
    logged = [
        line
        for line in access_log_lines(out)
        if line.get("path", "").startswith("/v1/gateway/streams/") and line["status"] == 200
    ]
    assert logged, out[-1500:]
    assert {(line["stream"], line["outcome"]) for line in logged} >= {(True, "complete")}
    assert all(line["stream"] and line["outcome"] for line in logged)


def test_a_takeovers_continuation_withholds_the_usage_the_gateway_asked_for(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer
) -> None:
    """inject_include_usage on a continuing route: the owner SIGKILLed mid-stream, the
    takeover's continuation keeps withholding the usage chunk the client never asked
    for (the log's meta says the gateway asked), as the owner would have."""
    path = tmp_path / "gateway.toml"
    path.write_text(f"""
stream_store = "redis"
{redis.toml}
stream_lease_seconds = 1.0
[[routes]]
name = "v1"
prefix = "/v1"
resume = true
continue_after_cut = true
inject_include_usage = true
[[routes.upstreams]]
name = "sim"
url = "{simulator.url}/v1"
continuation = "assistant_prefill"
""")
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    headers = {"x-sim-tokens": "200", "x-sim-tps": "40", "x-sim-seed": "8"}
    with two_gateways(path) as (a, b):
        whole = web.post(b.url + CHAT, json=body, headers=headers, timeout=60).content
        stream_id, _, head = cut_after(a.url + CHAT, body, headers, 5)
        time.sleep(0.5)  # a few more events reach the log
        os.kill(a.proc.pid, signal.SIGKILL)
        a.proc.wait(30)
        rest = resume(b.url + "/v1", stream_id, 5, headers={})
    assert b'"choices":[]' not in whole.replace(b" ", b"")  # withheld by a live relay
    got = head + rest.content
    assert annotation(got).get("continued") == "1"
    assert b'"choices":[]' not in got.replace(b" ", b"")


def test_a_redis_pause_under_a_cached_leader_never_cuts_its_followers(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer
) -> None:
    """A cache route on two gateways: the leader's answer on A, an identical request
    following it on B, Redis SIGSTOPped for 5 s meanwhile: the follower gets the
    leader's whole answer and ending once Redis is back (before: cut, no ending)."""
    path = tmp_path / "gateway.toml"
    path.write_text(f"""
stream_store = "redis"
{redis.toml}
stream_store_timeout = 1.0
[[routes]]
name = "v1"
prefix = "/v1"
upstream = "{simulator.url}/v1"
cache = true
""")
    headers = {"x-sim-tokens": "80", "x-sim-tps": "10", "x-sim-seed": "6"}
    with two_gateways(path) as (a, b):
        answers: dict[str, Any] = {}

        def ask(name: str, url: str) -> None:
            answers[name] = web.post(url + CHAT, json=BODY, headers=headers, timeout=120)

        leader = threading.Thread(target=ask, args=("leader", a.url))
        leader.start()
        time.sleep(1.0)  # the leader's log is there (a MISS takes the name at once)
        follower = threading.Thread(target=ask, args=("follower", b.url))
        follower.start()
        time.sleep(1.0)  # the follower reads the live log
        with paused(redis):
            time.sleep(5)
        leader.join(120)
        follower.join(120)
    lead, follow_ = answers["leader"], answers["follower"]
    assert lead.headers["x-gateway-cache"] == "MISS"
    assert follow_.headers["x-gateway-cache"] == "HIT"
    assert annotation(lead.content)["outcome"] == "complete"
    assert b": gateway outcome=complete reason=stop" in follow_.content
    done = b"data: [DONE]\n\n"
    assert follow_.content.split(done)[0] == lead.content.split(done)[0]
    assert follow_.content.count(done) == 1


def test_resume_and_the_cache_on_one_route_share_one_detachment(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer
) -> None:
    """A route with resume and the cache: the leader's client leaves after three
    events while a follower on the other gateway reads its answer; the answer is read
    on once, into both logs: the follower gets it whole and ended, and the leader's
    client resumes it (before: resume's read-on hid the answer's end from the cache's
    recorder and the follower was cut)."""
    path = _config(tmp_path, simulator, redis, cache=True)  # resume and the cache on v1
    headers = {"x-sim-tokens": "60", "x-sim-tps": "20", "x-sim-seed": "12"}
    with two_gateways(path) as (a, b):
        answers: dict[str, Any] = {}
        started = threading.Event()

        def lead() -> None:
            answers["lead"] = cut_after(a.url + CHAT, BODY, headers, 3)
            started.set()

        leader = threading.Thread(target=lead)
        leader.start()
        time.sleep(0.3)  # the leader's log is named before the follower asks
        follower = web.post(b.url + CHAT, json=BODY, headers=headers, timeout=120)
        leader.join(60)
        stream_id, _, head = answers["lead"]
        rest = resume(a.url + "/v1", stream_id, 3, headers={})
    assert follower.headers["x-gateway-cache"] == "HIT"
    assert b": gateway outcome=complete reason=stop" in follower.content
    assert follower.content.count(b"data: [DONE]\n\n") == 1
    assert rest.status_code == 200
    whole = head + rest.content
    assert annotation(whole)["outcome"] == "complete"
    done = b"data: [DONE]\n\n"
    assert whole.split(done)[0] == follower.content.split(done)[0]
