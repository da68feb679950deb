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
from redis import Redis

from gateway.resume.ids import new_id
from tests import web
from tests.client_events import Splitter
from tests.conftest import GatewayProcess, ServerThread, gateway_process
from tests.integration.helpers import annotation, metric_value
from tests.integration.redis_server import RedisServer, redis_server
from tests.integration.test_resume_streams import REQUEST_ID, cut_after, resume

BODY = {"model": "sim-model", "messages": [], "stream": True}
CHAT = "/v1/chat/completions"


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def _config(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer, *, lease: float = 1.0, **route: Any
) -> Path:
    """Three resumable routes over one simulator: ``v1`` and ``v2`` (chat), ``oll``."""
    extra = "".join(f"{key} = {value!r}\n" for key, value in route.items()).replace("'", '"')
    extra = extra.replace("True", "true")
    path = tmp_path / "gateway.toml"
    path.write_text(f"""
stream_store = "redis"
redis_url = "{redis.url}"
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
    assert redis.proc is not None
    redis.proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        redis.proc.send_signal(signal.SIGCONT)


def _hgetall_calls(client: Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_hgetall", {}).get("calls", 0))


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
    client = Redis.from_url(redis.url)
    with two_gateways(_config(tmp_path, simulator, redis)) as (a, b):
        theirs = web.post(
            a.url + CHAT,
            json=BODY,
            headers={"x-sim-tokens": "5", "authorization": "Bearer someone-else"},
            timeout=30,
        ).headers["x-gateway-stream-id"]
        young, old = new_id(), new_id()[:-8] + "00000001"
        for stream_id in (young, theirs, young, old):
            before = _hgetall_calls(client)
            answer = resume(b.url + "/v1", stream_id, 0, headers={})
            looks = _hgetall_calls(client) - before
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


def test_a_redis_pause_costs_new_streams_one_bounded_wait(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer
) -> None:
    """Redis SIGSTOPped: the first stream waits at most stream_store_timeout (2 s) and
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
    assert answers[0][0] < 2.0 + 1.5  # one bounded wait (the store's timeout)
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
