"""Client limits shared through a real redis-server: two gateway processes, Redis
stopped and restarted mid-run, and a slow Redis behind a delaying proxy."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import web
from tests.conftest import ServerThread, gateway_process
from tests.integration.helpers import access_log_lines, gateway_for, metric_value
from tests.integration.redis_server import (
    DelayingProxy,
    RedisServer,
    also_on_a_cluster,
    redis_server,
)

#: Every test here is Redis-backed: run against a cluster too (make test-redis-cluster).
pytestmark = pytest.mark.redis

KEY = "sk-shared-team-0123"
DIGEST = hashlib.sha256(KEY.encode()).hexdigest()
AUTH = {"authorization": f"Bearer {KEY}"}


def _client(limits: dict[str, int]) -> list[dict[str, Any]]:
    return [{"name": "shared", "key_sha256": [DIGEST], "limits": limits}]


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": content}],
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


def _toml(simulator: ServerThread, redis: RedisServer, tpm: int) -> str:
    return f"""
limits_backend = "redis"
{redis.toml}
# A reservation that cannot be made in time is refused (503), never admitted unlimited:
# this test is about concurrency, and a loaded machine may be slow to answer.
limits_timeout = 2.0
on_backend_error = "deny"
[[routes]]
name = "chat"
prefix = "/v1"
upstream = "{simulator.url}/v1"
[[clients]]
name = "shared"
key_sha256 = ["{DIGEST}"]
[clients.limits]
tokens_per_minute = {tpm}
"""


def _reported(body: bytes) -> tuple[int, int] | None:
    """The usage chunk of a Chat stream as the client got it, or None."""
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            event = json.loads(line[6:])
            usage = event.get("usage")
            if usage:
                return usage["prompt_tokens"], usage["completion_tokens"]
    return None


def _content_chars(body: bytes) -> int:
    chars = 0
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:]).get("choices") or []:
                chars += len((choice.get("delta") or {}).get("content") or "")
    return chars


async def _fire(urls: list[str], count: int, content: str) -> list[tuple[int, bytes, bool]]:
    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def one(index: int) -> tuple[int, bool, bytes]:
            cut = index % 10 == 0
            headers = {**AUTH, "x-sim-tokens": "20"}
            if cut:
                headers["x-sim-fault"] = "drop_after_text"
            url = urls[index % len(urls)] + "/v1/chat/completions"
            response = await client.post(url, json=_chat(content, max_tokens=100), headers=headers)
            return response.status_code, response.content, cut

        answers = await asyncio.gather(*(one(i) for i in range(count)))
    return [(status, body, cut) for status, body, cut in answers]


def test_two_gateways_sharing_redis_never_admit_past_the_limit(
    simulator: ServerThread, redis: RedisServer, tmp_path: Path
) -> None:
    """200 concurrent requests of one client over two gateway processes: what they admit
    within a minute stays within tokens_per_minute, and what the gateways charged is
    exactly what the upstream reported plus the estimates of the cut streams."""
    limit = 4000
    config = tmp_path / "gateway.toml"
    config.write_text(_toml(simulator, redis, limit))
    content = "x" * 200  # estimated 51 tokens in, 100 reserved out: 151 a request
    with (
        gateway_process(["--config", str(config)]) as one,
        gateway_process(["--config", str(config)]) as two,
    ):
        first_minute = int(time.time()) // 60
        answers = asyncio.run(_fire([one.url, two.url], 200, content))
        minutes = int(time.time()) // 60 - first_minute + 1
        metrics = [web.get(gw.url + "/metrics", timeout=30).text for gw in (one, two)]
    statuses = [status for status, _, _ in answers]
    errors = sum(metric_value(text, "gateway_limit_backend_errors_total") for text in metrics)
    assert statuses.count(200) > 0
    assert statuses.count(429) > 0
    assert set(statuses) <= {200, 429, 503}
    assert statuses.count(503) <= errors, (statuses.count(503), errors)
    charged = sum(
        metric_value(text, "gateway_client_tokens_total", client="shared") for text in metrics
    )
    assert 0 < charged <= limit * minutes, (charged, minutes, errors)
    expected = 0
    for status, body, cut in answers:
        if status != 200:
            continue
        reported = _reported(body)
        if cut:
            assert reported is None
            expected += math.ceil((len(content) + len("user")) / 4) + 4 + 4  # and overheads
            expected += math.ceil(_content_chars(body) / 4)
        else:
            assert reported is not None
            expected += sum(reported)
    assert charged == expected
    estimated = sum(
        metric_value(text, "gateway_client_tokens_total", client="shared", source="estimated")
        for text in metrics
    )
    assert (estimated > 0) == any(cut and s == 200 for s, _, cut in answers)


def _request(gw: ServerThread, rid: str) -> httpx.Response:
    return web.post(
        gw.url + "/v1/chat/completions",
        json=_chat("hello"),
        headers={**AUTH, "x-request-id": rid, "x-sim-tokens": "3"},
        timeout=30,
    )


def _until_limited_again(gw: ServerThread, rid: str) -> list[int]:
    """After Redis is back: requests until one is counted (x-ratelimit headers) and then
    until one is refused; the limit holds again."""
    statuses = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        response = _request(gw, f"{rid}-{len(statuses)}")
        statuses.append(response.status_code)
        if response.status_code == 429:
            return statuses
    raise AssertionError(f"the limit never held again: {statuses}")


@pytest.mark.parametrize("policy", ["allow", "deny"])
@also_on_a_cluster
def test_redis_stopped_mid_run_then_restarted(
    simulator: ServerThread, redis: RedisServer, policy: str
) -> None:
    settings = {
        "limits_backend": "redis",
        **redis.settings,
        "on_backend_error": policy,
        "limits_timeout": 1.0,  # about Redis gone and back, not slow: a loaded machine is slow
        "clients": _client({"requests_per_minute": 3}),
    }
    with gateway_for(simulator.url + "/v1", **settings) as gw:
        assert _request(gw, "before").headers["x-ratelimit-limit-requests"] == "3"
        # from before the outage: what was served in it is counted in its own minute (a
        # cluster's restart takes seconds, and a minute may end meanwhile)
        minute = int(time.time()) // 60
        redis.stop()
        during = [_request(gw, f"down-{i}") for i in range(5)]
        text = web.get(gw.url + "/metrics").text
        assert metric_value(text, "gateway_limit_backend_errors_total", operation="reserve") >= 5
        if policy == "allow":
            assert [r.status_code for r in during] == [200] * 5
            assert all("x-ratelimit-limit-requests" not in r.headers for r in during)
        else:
            assert [r.status_code for r in during] == [503] * 5
            assert during[0].json()["error"]["code"] == "limits_backend_unavailable"
            assert (
                metric_value(
                    text, "gateway_limited_requests_total", client="shared", limit="backend_error"
                )
                == 5
            )
        redis.start()
        statuses = _until_limited_again(gw, "after")
        same_minute = int(time.time()) // 60 == minute
        if policy == "deny":
            # The refused requests' reservations were cancelled: the new server counts
            # only what was served, so at least two fit before a 429 (three, or two when
            # the "before" request's settlement was still to send when Redis stopped and
            # is sent again once it is back: what was served is counted).
            assert 2 <= statuses.count(200) <= 3, statuses
        elif same_minute:  # (a new minute would start its count from zero)
            # The five served while Redis was away are settled when it is back, at their
            # whole cost: they count against the limit (what was served is counted).
            assert statuses.count(200) < 3


def test_a_slow_redis_adds_at_most_about_twice_the_timeout(
    simulator: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    """Redis answers at start, then turns slow (60 s on every call): a request waits for
    its reservation at most about twice limits_timeout (a batch in flight, then its own),
    is served unreserved (on_backend_error = "allow") and charged all the same.

    One server behind the proxy, whatever the suite's mode (a cluster's client would
    learn its nodes' own ports and go round the proxy)."""
    with redis_server(mode="server") as redis, DelayingProxy(redis.port, delay=0.0) as slow:
        settings = {
            "limits_backend": "redis",
            "redis_url": slow.url,
            "limits_timeout": 0.05,
            "access_log": True,
            "clients": _client({"requests_per_minute": 100}),
        }
        with gateway_for(simulator.url + "/v1", **settings) as gw:
            slow.delay = 60.0
            started = time.monotonic()
            response = _request(gw, "slow-redis")
            elapsed = time.monotonic() - started
            text = web.get(gw.url + "/metrics").text
    assert response.status_code == 200
    # 60 s of delay on every Redis call: the request did not wait for any of them (the
    # bound is half the delay, so that no loaded machine is too slow for it).
    assert elapsed < 30, elapsed
    assert metric_value(text, "gateway_limit_backend_errors_total") >= 1
    lines = [
        e for e in access_log_lines(capsys.readouterr().out) if e["request_id"] == "slow-redis"
    ]
    assert lines[0]["charged"] is not None


def test_a_password_in_the_url_authenticates_and_a_wrong_one_is_never_ready(
    simulator: ServerThread,
) -> None:
    with redis_server(password="s3cret-pw") as secured:
        good = {
            "limits_backend": "redis",
            "redis_url": secured.url,
            "limits_timeout": 1.0,
            "clients": _client({"requests_per_minute": 5}),
        }
        with gateway_for(simulator.url + "/v1", **good) as gw:
            assert _request(gw, "auth-ok").headers["x-ratelimit-limit-requests"] == "5"
        bad = {**good, "redis_url": secured.url.replace("s3cret-pw", "wrong")}
        with gateway_for(simulator.url + "/v1", **bad) as gw:
            ready = web.get(gw.url + "/readyz")
            response = _request(gw, "auth-bad")
        # Redis never answered: not ready, and nothing admitted unlimited, even with
        # on_backend_error = "allow"
        assert ready.status_code == 503
        assert ready.json()["status"] == "limits_backend_unavailable"
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "limits_backend_unavailable"


def test_a_rediss_url_speaks_tls_to_a_tls_only_redis(
    simulator: ServerThread, tmp_path: Path
) -> None:
    """``rediss://`` with the server's CA (``ssl_ca_certs``): the limits hold over TLS; the
    same server's port does not answer plain RESP."""
    with redis_server(tls=tmp_path) as secured:
        assert secured.url.startswith("rediss://")
        settings = {
            "limits_backend": "redis",
            "redis_url": secured.url,
            "limits_timeout": 2.0,
            "on_backend_error": "deny",
            "clients": _client({"requests_per_minute": 2}),
        }
        with gateway_for(simulator.url + "/v1", **settings) as gw:
            statuses = [_request(gw, f"tls-{i}").status_code for i in range(3)]
            text = web.get(gw.url + "/metrics", timeout=30).text
        assert statuses == [200, 200, 429]
        assert metric_value(text, "gateway_limit_backend_errors_total") == 0
        plain = {**settings, "redis_url": f"redis://127.0.0.1:{secured.port}/0"}
        with gateway_for(simulator.url + "/v1", **plain) as gw:
            assert _request(gw, "tls-plain").status_code == 503  # deny: the backend failed
