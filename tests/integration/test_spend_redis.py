"""Money budgets shared through a real redis-server: 200 concurrent requests over two
gateway processes against a strict $0.01 budget (and a team's) never spend past it."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import web
from tests.conftest import ServerThread, gateway_process
from tests.integration.helpers import metric_value
from tests.integration.redis_server import RedisServer, redis_server

KEYS = {"strict": "sk-strict-money-0123", "mate": "sk-team-mate-4567"}
#: The simulator reports a prompt of its body's bytes / 4: a prompt of some length keeps
#: that below the strict bound (a token a byte of the text), as any real tokenizer is.
PROMPT = "hello there " * 30


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _toml(simulator: ServerThread, redis: RedisServer) -> str:
    return f"""
limits_backend = "redis"
redis_url = "{redis.url}"
limits_timeout = 2.0
on_backend_error = "deny"
[[routes]]
name = "chat"
prefix = "/v1"
upstream = "{simulator.url}/v1"
[[teams]]
name = "eng"
[teams.limits]
usd_per_month = "0.02"
[[clients]]
name = "strict"
key_sha256 = ["{_sha(KEYS["strict"])}"]
budget_enforcement = "strict"
team = "eng"
[clients.limits]
usd_per_day = "0.01"
[[clients]]
name = "mate"
key_sha256 = ["{_sha(KEYS["mate"])}"]
budget_enforcement = "strict"
team = "eng"
"""


async def _fire(urls: list[str], client: str, count: int) -> list[int]:
    limits = httpx.Limits(max_connections=count)
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"authorization": f"Bearer {KEYS[client]}", "x-sim-tokens": "300"}
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:

        async def one(index: int) -> int:
            url = urls[index % len(urls)] + "/v1/chat/completions"
            return (await http.post(url, json=body, headers=headers)).status_code

        return list(await asyncio.gather(*(one(i) for i in range(count))))


def test_two_gateways_on_one_redis_never_spend_past_a_strict_money_budget(
    simulator: ServerThread, redis: RedisServer, tmp_path: Path
) -> None:
    """A client's $0.01 a day, its team's $0.02 a month, gpt-4o: 200 concurrent streams of
    the client over two gateways, then 200 of its team mate. Spend never passes either
    budget; the budget's remaining header is told in dollars."""
    config = tmp_path / "gateway.toml"
    config.write_text(_toml(simulator, redis))
    with (
        gateway_process(["--config", str(config)]) as one,
        gateway_process(["--config", str(config)]) as two,
    ):
        statuses = asyncio.run(_fire([one.url, two.url], "strict", 200))
        mate = asyncio.run(_fire([one.url, two.url], "mate", 200))
        metrics = [web.get(gw.url + "/metrics", timeout=30).text for gw in (one, two)]
    assert statuses.count(200) > 0
    assert statuses.count(429) > 0
    assert set(statuses) <= {200, 429}
    assert mate.count(429) > 0

    def spent(client: str) -> float:
        return sum(metric_value(t, "gateway_spend_usd_total", client=client) for t in metrics)

    assert 0 < spent("strict") <= 0.01
    assert 0 < spent("strict") + spent("mate") <= 0.02
    assert (
        metric_value(metrics[0] + metrics[1], "gateway_spend_usd_total", evidence="estimated") == 0
    )
