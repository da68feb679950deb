"""Resumable streams across gateway processes on one real redis-server.

A stream made on gateway A is resumed on gateway B while A still generates (the
live tail) and after it ended; A killed with SIGKILL mid-stream: a resume on B
returns what A logged, then the stream's end ``owner_lost``, written once for
every reader. Once the TTLs passed, nothing is left in Redis.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests import web
from tests.client_events import Splitter
from tests.conftest import ServerThread, gateway_process
from tests.integration.helpers import annotation, metric_value, wait_until
from tests.integration.redis_server import RedisServer, also_on_a_cluster
from tests.integration.test_resume_streams import REQUEST_ID, cut_after, resume

#: Every test here is Redis-backed: run against a cluster too (make test-redis-cluster).
pytestmark = pytest.mark.redis

BODY = {"model": "sim-model", "messages": [], "stream": True}


def _config(tmp_path: Path, simulator: ServerThread, redis: RedisServer, ttl: float) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(f"""
stream_store = "redis"
{redis.toml}
stream_lease_seconds = 1.0
[[routes]]
name = "v1"
prefix = "/v1"
upstream = "{simulator.url}/v1"
resume = true
resume_ttl_seconds = {ttl}
""")
    return path


def _logged(redis: RedisServer, stream_id: str) -> int:
    """How many events the store holds of a stream (its log's length in Redis)."""
    with redis.client() as client:
        return int(client.xlen(f"gateway:s:{{{stream_id}}}:log"))


@also_on_a_cluster
def test_two_gateways_share_the_streams_and_a_killed_one_is_taken_over(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer
) -> None:
    config = _config(tmp_path, simulator, redis, ttl=3.0)
    url = "/v1/chat/completions"
    with (
        gateway_process(["--config", str(config)]) as a,
        gateway_process(["--config", str(config)]) as b,
    ):
        # A stream on A, resumed on B while A is still generating, then after its end.
        headers = {"x-sim-tokens": "300", "x-sim-tps": "100", "x-sim-seed": "4"}
        whole: dict[str, bytes] = {}
        with web.stream("POST", a.url + url, json=BODY, headers=headers, timeout=60) as live:
            stream_id = live.headers["x-gateway-stream-id"]
            reader = threading.Thread(target=lambda: whole.setdefault("a", live.read()))
            reader.start()
            tail = resume(b.url + "/v1", stream_id, 2, headers={})
            reader.join(60)
        assert tail.status_code == 200
        original = whole["a"]
        events = Splitter(False).feed(original)
        assert tail.content == original[len(b"".join(events[:2])) :]
        after = resume(b.url + "/v1", stream_id, len(events), headers={})
        assert after.content == original[len(b"".join(events)) :]  # the trailer alone
        assert annotation(after.content)["outcome"] == "complete"

        # A killed mid-stream: B returns what was logged, then owner_lost.
        long = {"x-sim-tokens": "5000", "x-sim-tps": "50", "x-sim-seed": "4"}
        stream_id, _, head = cut_after(a.url + url, BODY, long, 5)
        wait_until(lambda: _logged(redis, stream_id) >= 8, "a few more events reach the log")
        a.proc.kill()
        a.proc.wait(30)
        killed = time.monotonic()
        rest = resume(b.url + "/v1", stream_id, 5, headers={})
        waited = time.monotonic() - killed
        assert rest.status_code == 200
        got = head + rest.content
        assert annotation(got)["reason"] == "owner_lost"
        assert b'"code":"owner_lost"' in got.replace(b" ", b"")
        assert waited < 30  # within the lease (1 s) and a reader's look (1 s), on a loaded box
        again = resume(b.url + "/v1", stream_id, 0, headers={})
        assert REQUEST_ID.sub(b"", again.content) == REQUEST_ID.sub(b"", got)
        metrics = web.get(b.url + "/metrics").text
        assert metric_value(metrics, "gateway_resumes_total", result="owner_lost") == 1
        # Nothing is left once the TTLs passed.
        client = redis.client()
        assert client.dbsize() > 0
        deadline = time.monotonic() + 30
        while client.dbsize() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.keys("*") == []


def test_a_killed_gateways_stream_is_continued_on_a_route_that_continues(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer
) -> None:
    """A route with continue_after_cut: the takeover continues the logged answer with the
    existing continuation, and the resumed stream is whole, ``continued=1``."""
    from tests.integration.test_failover import chat_text

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
[[routes.upstreams]]
name = "sim"
url = "{simulator.url}/v1"
continuation = "assistant_prefill"
""")
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    headers = {"x-sim-tokens": "200", "x-sim-tps": "40", "x-sim-seed": "8"}
    whole = web.post(simulator.url + "/v1/chat/completions", json=body, headers=headers).content
    with (
        gateway_process(["--config", str(path)]) as a,
        gateway_process(["--config", str(path)]) as b,
    ):
        stream_id, _, head = cut_after(a.url + "/v1/chat/completions", body, headers, 5)
        wait_until(lambda: _logged(redis, stream_id) >= 8, "a few more events reach the log")
        a.proc.kill()
        a.proc.wait(30)
        rest = resume(b.url + "/v1", stream_id, 5, headers={})
        metrics = web.get(b.url + "/metrics").text
    assert rest.status_code == 200
    got = head + rest.content
    note = annotation(got)
    assert (note["outcome"], note["reason"], note.get("continued")) == ("complete", "stop", "1")
    assert chat_text(got) == chat_text(whole)
    assert got.count(b"data: [DONE]") == 1
    assert metric_value(metrics, "gateway_resumes_total", result="continued") == 1
    assert metric_value(metrics, "gateway_continuations_total", result="ok") == 1


def test_redis_going_away_never_touches_the_clients_stream(
    simulator: ServerThread, redis: RedisServer
) -> None:
    """Redis stopped mid-stream: the client still gets its whole stream; a resume then
    says 503 (the store is unavailable), and the streams after it are served as ever,
    without resume (saying so) until Redis is back."""
    from tests.integration.helpers import gateway_for

    routes = [{"name": "v1", "prefix": "/v1", "upstream": simulator.url + "/v1", "resume": True}]
    headers = {"x-sim-tokens": "100", "x-sim-tps": "50", "x-sim-seed": "2"}
    with gateway_for(
        "", routes=routes, stream_store="redis", **redis.settings, stream_store_timeout=0.5
    ) as gw:
        with web.stream("POST", gw.url + "/v1/chat/completions", json=BODY, headers=headers,
                        timeout=60) as live:  # fmt: skip
            stream_id = live.headers["x-gateway-stream-id"]
            chunks = live.iter_raw()
            first = next(chunks)
            redis.stop()
            got = first + b"".join(chunks)
        assert annotation(got)["outcome"] == "complete"
        later = web.post(gw.url + "/v1/chat/completions", json=BODY, timeout=30)
        assert annotation(later.content)["outcome"] == "complete"
        # Its writes failed: the next stream is told it has no resume, not given an
        # id that no resume could serve (docs/resume.md, the wire contract).
        assert "x-gateway-stream-id" not in later.headers
        assert later.headers["x-gateway-resume"] == "off; reason=store_error"
        refused = resume(gw.url + "/v1", stream_id, 0, headers={})
        redis.start()
        deadline = time.monotonic() + 30
        while True:  # back within about a second of Redis (one PING a second)
            again = web.post(gw.url + "/v1/chat/completions", json=BODY, timeout=30)
            if "x-gateway-stream-id" in again.headers or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        metrics = web.get(gw.url + "/metrics").text
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "store_error"
    assert "x-gateway-stream-id" in again.headers
    assert metric_value(metrics, "gateway_resume_off_total", reason="store_error") >= 1
