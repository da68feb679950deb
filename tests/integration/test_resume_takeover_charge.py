"""A takeover's continuation is its client's request still (issue 44, item 4).

Two gateway processes on one real ``redis-server`` (the stream store and the
limits' counters), a named client with a token limit, the owner SIGKILLed
mid-stream on a route that continues cut streams: the other gateway takes the
stream over and continues it upstream; the client's token counter then holds
what the continuation cost, as does the metric of the request that took the
stream over (it carries the charge: its receipt and the spend report too), and
the client never sees the usage chunk the gateway asked for on its behalf (its
limits charge reported usage).
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

import pytest
from redis import Redis

from tests import web
from tests.conftest import GatewayProcess, ServerThread
from tests.integration.helpers import annotation, metric_value, wait_until
from tests.integration.redis_server import RedisServer
from tests.integration.test_resume_failures import two_gateways
from tests.integration.test_resume_streams import cut_after, resume

#: Every test here is Redis-backed: run against a cluster too (make test-redis-cluster).
pytestmark = pytest.mark.redis

CHAT = "/v1/chat/completions"
KEY = "sk-alice-takeover"


def _tokens_today(client: Redis) -> int:
    """alice's tokens_per_day counter, as the limits' Redis script keeps it."""
    keys = [k for k in client.scan_iter("*alice|tokens_per_day|*") if b":id:" not in k]
    return sum(int(client.get(k) or 0) for k in keys)


def _config(tmp_path: Path, simulator: ServerThread, redis: RedisServer, tokens: int) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(f"""
stream_store = "redis"
limits_backend = "redis"
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
[[clients]]
name = "alice"
key_sha256 = ["{hashlib.sha256(KEY.encode()).hexdigest()}"]
[clients.limits]
tokens_per_day = {tokens}
""")
    return path


BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
AUTH = {"authorization": f"Bearer {KEY}"}
HEADERS = {"x-sim-tokens": "200", "x-sim-tps": "40", "x-sim-seed": "8", **AUTH}


def _owner_killed(a: GatewayProcess) -> tuple[str, bytes]:
    """A stream of alice's on ``a``, its client gone after 5 events, ``a`` SIGKILLed."""
    stream_id, _, head = cut_after(a.url + CHAT, BODY, HEADERS, 5)
    time.sleep(0.3)  # a few more events reach the log
    os.kill(a.proc.pid, signal.SIGKILL)
    a.proc.wait(30)
    return stream_id, head


def test_a_takeovers_continuation_is_charged_to_its_client(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer
) -> None:
    counters = redis.client()
    with two_gateways(_config(tmp_path, simulator, redis, 10_000_000)) as (a, b):
        stream_id, head = _owner_killed(a)
        before = _tokens_today(counters)  # the dead owner's reservation
        rest = resume(b.url + "/v1", stream_id, 5, headers=AUTH)
        after = _tokens_today(counters)

        def charged() -> float:  # on the resume's record: its metric (and its receipt)
            metrics = web.get(b.url + "/metrics", timeout=10).text
            return metric_value(metrics, "gateway_client_tokens_total", client="alice")

        wait_until(lambda: charged() > 0, "the takeover's charge in the metric")
        metric = charged()
    got = head + rest.content
    assert rest.status_code == 200
    assert annotation(got).get("continued") == "1"
    assert annotation(got)["outcome"] == "complete"
    # the usage chunk the gateway asked for (alice's limits charge reported usage) is
    # not the client's: withheld by the heir as by the owner
    assert b'"choices":[]' not in got.replace(b" ", b"")
    assert before > 0
    # the continuation (more than half the 200 tokens: the owner died within a second
    # at 40 a second) is in alice's counter
    assert after - before >= 100, (before, after)
    # the counter, and the metric of the request that took the stream over, agree
    assert metric == after - before


def test_a_client_its_limits_refuse_is_not_continued(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer
) -> None:
    """1,500 tokens a day: the owner's reservation (its input and 1,024 output tokens)
    fits, a second one for the continuation does not: the log ends owner_lost, and
    nothing more is counted."""
    counters = redis.client()
    with two_gateways(_config(tmp_path, simulator, redis, 1500)) as (a, b):
        stream_id, head = _owner_killed(a)
        before = _tokens_today(counters)
        rest = resume(b.url + "/v1", stream_id, 5, headers=AUTH)
        after = _tokens_today(counters)
    got = head + rest.content
    assert rest.status_code == 200
    assert annotation(got)["reason"] == "owner_lost"
    assert "continued" not in annotation(got)
    assert b'"code":"owner_lost"' in got.replace(b" ", b"")
    assert after == before > 0
