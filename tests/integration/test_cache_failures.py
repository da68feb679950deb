"""The response cache under failure: two gateway processes on one real ``redis-server``,
a leader SIGKILLed, Redis SIGSTOPped (issue 44, item 7).

- A follower on another gateway whose leader dies ends with the protocol's error
  event and trailer (``owner_lost``), never with a bare cut.
- A new identical request while the dead leader's lease runs on is not labelled
  ``X-Gateway-Cache: HIT``: it waits for the log to grow, finds it orphaned, and
  goes upstream itself (leading, ``MISS``), with a whole answer.
- Redis paused while a leader answers: its follower on the other gateway ends as
  the leader ended; a request during the pause goes upstream, never labelled a hit.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import web
from tests.client_events import Splitter
from tests.conftest import ServerThread
from tests.integration.helpers import annotation
from tests.integration.redis_server import RedisServer
from tests.integration.test_cache import without_trailer
from tests.integration.test_resume_failures import paused, two_gateways

#: Every test here is Redis-backed: run against a cluster too (make test-redis-cluster).
pytestmark = pytest.mark.redis

CHAT = "/v1/chat/completions"


def _config(tmp_path: Path, simulator: ServerThread, redis: RedisServer) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(f"""
stream_store = "redis"
{redis.toml}
stream_lease_seconds = 1.0
stream_store_timeout = 0.5
[[routes]]
name = "v1"
prefix = "/v1"
upstream = "{simulator.url}/v1"
cache = true
""")
    return path


def _body(content: str) -> dict[str, Any]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": content}],
            "stream": True}  # fmt: skip


class Reader(threading.Thread):
    """One streamed request read to its end in a thread: its head, its events, its bytes,
    and how it ended (an httpx error: cut)."""

    def __init__(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.url, self.body, self.headers = url, body, headers
        self.cache: str | None = None
        self.events = 0
        self.content = b""
        self.error: Exception | None = None

    def run(self) -> None:
        splitter = Splitter(False)
        try:
            with web.stream("POST", self.url, json=self.body, headers=self.headers,
                            timeout=60) as response:  # fmt: skip
                self.cache = response.headers.get("x-gateway-cache")
                for chunk in response.iter_raw():
                    self.content += chunk
                    self.events += len(splitter.feed(chunk))
        except httpx.HTTPError as exc:
            self.error = exc

    def wait_events(self, count: int, seconds: float = 30.0) -> None:
        deadline = time.monotonic() + seconds
        while self.events < count:
            assert self.is_alive(), (self.cache, self.error, self.content[-300:])
            assert time.monotonic() < deadline, f"{self.events} events of {count}"
            time.sleep(0.02)


def _lost(content: bytes) -> bool:
    """The stream ends with the Chat error event for ``owner_lost`` and its trailer."""
    squeezed = content.replace(b" ", b"")
    return (
        b'"type":"stream_incomplete","code":"owner_lost"' in squeezed
        and annotation(content)["reason"] == "owner_lost"
    )


def test_a_dead_leaders_follower_gets_the_ending_and_no_one_else_a_false_hit(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer
) -> None:
    """The leader's gateway SIGKILLed mid-answer: its follower on the other gateway ends
    with the error event and trailer; a new identical request sent at once (the dead
    leader's lease still running) is not a hit: it goes upstream and gets it all."""
    body = _body("leader killed")
    slow = {"x-sim-tokens": "400", "x-sim-tps": "20"}
    with two_gateways(_config(tmp_path, simulator, redis)) as (a, b):
        leader = Reader(a.url + CHAT, body, slow)
        leader.start()
        leader.wait_events(3)
        follower = Reader(b.url + CHAT, body, slow)
        follower.start()
        follower.wait_events(3)
        os.kill(a.proc.pid, signal.SIGKILL)
        a.proc.wait(30)
        fresh = web.post(b.url + CHAT, json=body, headers={"x-sim-tokens": "20"}, timeout=60)
        follower.join(60)
    assert follower.cache == "HIT"
    assert follower.error is None, follower.error
    assert _lost(follower.content), follower.content[-400:]
    assert fresh.headers["x-gateway-cache"] == "MISS"
    assert annotation(fresh.content)["outcome"] == "complete"


def test_a_redis_pause_under_a_leader_ends_its_follower_as_the_leader_ended(
    tmp_path: Path, simulator: ServerThread, redis: RedisServer
) -> None:
    """Redis SIGSTOPped for 3 s while a leader on one gateway answers and a follower on
    the other reads it: the follower gets what the leader's client got; a request made
    during the pause goes upstream, not labelled a hit."""
    body = _body("redis paused")
    slow = {"x-sim-tokens": "60", "x-sim-tps": "10"}
    with two_gateways(_config(tmp_path, simulator, redis)) as (a, b):
        leader = Reader(a.url + CHAT, body, slow)
        leader.start()
        leader.wait_events(3)
        follower = Reader(b.url + CHAT, body, slow)
        follower.start()
        follower.wait_events(3)
        with paused(redis):
            time.sleep(1.0)  # the pause is the scenario: Redis away while both read on
            during = web.post(b.url + CHAT, json=body, headers={"x-sim-tokens": "5"},
                              timeout=30)  # fmt: skip
            time.sleep(2.0)
        leader.join(60)
        follower.join(60)
    assert leader.error is None
    assert annotation(leader.content)["outcome"] == "complete"
    assert follower.cache == "HIT"
    assert follower.error is None, follower.error
    same = without_trailer(follower.content) == without_trailer(leader.content)
    assert same or _lost(follower.content), follower.content[-400:]
    assert during.headers["x-gateway-cache"] != "HIT"
    assert annotation(during.content)["outcome"] == "complete"
