"""Money budgets shared through a real redis-server: 200 concurrent requests over two
gateway processes against a strict $0.01 budget (and a team's) never spend past it."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import httpx
import pytest

from tests import web
from tests.conftest import ServerThread, gateway_process
from tests.integration.helpers import gateway_for, metric_value, wait_until
from tests.integration.redis_server import RedisServer, also_on_a_cluster, redis_server

#: Every test here is Redis-backed: run against a cluster too (make test-redis-cluster).
pytestmark = pytest.mark.redis

#: The strict test's runs: each with fresh budgets (a client, its team mate and their
#: team of their own), on the same two gateways and Redis. One in the suite (about 25 s
#: on the loaded 2-core machine; five take about 110 s, near the suite's 120 s timeout):
#: ``tests/perf/strict_money_runs.py`` runs five.
RUNS = int(os.environ.get("SPEND_STRICT_RUNS", "1"))
KEYS = {
    f"{name}-{run}": f"sk-{name}-money-{run}-0123"
    for name in ("strict", "mate")
    for run in range(RUNS)
}
#: The simulator reports a prompt of its body's bytes / 4: a prompt of some length keeps
#: that below the strict bound (a token a byte of the text), as any real tokenizer is.
PROMPT = "hello there " * 30


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _toml(simulator: ServerThread, redis: RedisServer) -> str:
    runs = "".join(
        f"""
[[teams]]
name = "eng-{run}"
[teams.limits]
usd_per_month = "0.02"
[[clients]]
name = "strict-{run}"
key_sha256 = ["{_sha(KEYS[f"strict-{run}"])}"]
budget_enforcement = "strict"
team = "eng-{run}"
[clients.limits]
usd_per_day = "0.01"
[[clients]]
name = "mate-{run}"
key_sha256 = ["{_sha(KEYS[f"mate-{run}"])}"]
budget_enforcement = "strict"
team = "eng-{run}"
"""
        for run in range(RUNS)
    )
    return f"""
limits_backend = "redis"
{redis.toml}
limits_timeout = 2.0
on_backend_error = "deny"
[[routes]]
name = "chat"
prefix = "/v1"
upstream = "{simulator.url}/v1"
{runs}
"""


async def _fire(urls: list[str], client: str, count: int, **extra: int) -> list[int]:
    limits = httpx.Limits(max_connections=count)
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
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
    """``RUNS`` runs, each with fresh budgets: a client's $0.01 a day, its team's $0.02
    a month, gpt-4o: 200 concurrent streams of the client over two gateways, then 200 of
    its team mate. Spend never passes either budget in any run."""
    config = tmp_path / "gateway.toml"
    config.write_text(_toml(simulator, redis))
    with (
        gateway_process(["--config", str(config)]) as one,
        gateway_process(["--config", str(config)]) as two,
    ):
        runs = []
        for run in range(RUNS):
            statuses = asyncio.run(_fire([one.url, two.url], f"strict-{run}", 200))
            mate = asyncio.run(_fire([one.url, two.url], f"mate-{run}", 200))
            runs.append((statuses, mate))
        metrics = [web.get(gw.url + "/metrics", timeout=30).text for gw in (one, two)]

    def spent(client: str) -> float:
        return sum(metric_value(t, "gateway_spend_usd_total", client=client) for t in metrics)

    for run, (statuses, mate) in enumerate(runs):
        print(  # the five runs' script shows them (pytest -s)
            f"run {run + 1}: client ${spent(f'strict-{run}'):.9f} of $0.01 "
            f"({statuses.count(200)} of 200 served), team "
            f"${spent(f'strict-{run}') + spent(f'mate-{run}'):.9f} of $0.02"
        )
        assert statuses.count(200) > 0, run
        assert statuses.count(429) > 0, run
        assert set(statuses) <= {200, 429}, run
        assert mate.count(429) > 0, run
        assert 0 < spent(f"strict-{run}") <= 0.01, run
        assert 0 < spent(f"strict-{run}") + spent(f"mate-{run}") <= 0.02, run
    assert (
        metric_value(metrics[0] + metrics[1], "gateway_spend_usd_total", evidence="estimated") == 0
    )


def _snapshot(redis: RedisServer) -> dict[str, object]:
    """Every key Redis holds (counters, totals, receipts) with its value."""

    client = redis.client(decode_responses=True)
    try:
        found: dict[str, object] = {}
        for key in client.scan_iter(count=1000):
            kind = client.type(key)
            if kind == "string":
                found[key] = client.get(key)
            elif kind == "hash":
                found[key] = client.hgetall(key)
            elif kind == "zset":
                found[key] = client.zrange(key, 0, -1, withscores=True)
        return found
    finally:
        client.close()


def _get(gw: ServerThread, path: str) -> httpx.Response:
    return web.get(
        gw.url + path, headers={"authorization": f"Bearer {KEYS['strict-0']}"}, timeout=30
    )


def _until(gw: ServerThread, path: str) -> httpx.Response:
    """GET ``path`` until it answers 200 (a receipt is written by a task; a Redis that
    just came back answers the second call), bounded."""
    for _ in range(200):
        answer = _get(gw, path)
        if answer.status_code == 200:
            return answer
    raise AssertionError(f"{path}: {answer.status_code} {answer.text}")


def test_redis_restarted_from_its_append_only_file_has_every_counter_and_receipt(
    simulator: ServerThread, tmp_path: Path
) -> None:
    """Redis run as the shipped compose file and manifests run it (append-only), killed
    as a crash would and started again: every budget counter, spend total and receipt is
    there, and the gateway reads them again."""
    aof = tmp_path / "aof"
    aof.mkdir()
    with redis_server(persist=aof) as redis:
        clients = [
            {
                "name": "strict",
                "key_sha256": [_sha(KEYS["strict-0"])],
                "limits": {"usd_per_day": "5", "tokens_per_day": 1_000_000},
            }
        ]
        routes = [{"name": "chat", "prefix": "/v1", "upstream": f"{simulator.url}/v1"}]
        with gateway_for(
            "", routes=routes, clients=clients, limits_backend="redis", **redis.settings
        ) as gw:
            body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
            ids = [f"kept-{i}" for i in range(5)]
            for rid in ids:
                headers = {
                    "authorization": f"Bearer {KEYS['strict-0']}",
                    "x-request-id": rid,
                    "x-sim-tokens": "20",
                }
                answer = web.post(gw.url + "/v1/chat/completions", json=body, headers=headers)
                assert answer.status_code == 200
            receipts = {rid: _until(gw, f"/v1/gateway/receipts/{rid}").json() for rid in ids}
            report = _until(gw, "/v1/gateway/spend").json()
            before = _snapshot(redis)
            assert any(":receipt:" in key for key in before)
            assert any("usd_per_day" in key for key in before)
            assert any("tokens_per_day" in key for key in before)
            redis.kill()
            redis.start()
            after = _snapshot(redis)
            assert after == before
            for rid in ids:
                assert _until(gw, f"/v1/gateway/receipts/{rid}").json() == receipts[rid]
            assert _until(gw, "/v1/gateway/spend").json() == report
            assert report["total"]["nanos"] == sum(r["cost"]["nanos"] for r in receipts.values())


@pytest.mark.parametrize("policy", ["allow", "deny"])
@also_on_a_cluster
def test_redis_stopped_while_traffic_flows_money_follows_on_backend_error(
    simulator: ServerThread,
    redis: RedisServer,
    policy: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis goes away: a money-budgeted client is served unreserved (allow) or refused
    (deny), like the token limits; when Redis is back, what was served while it was away
    is settled at its whole cost (allow), and nothing refused is charged (deny). The
    receipts kept meanwhile are written when it is back: the ledger logs the outage
    once when it starts and once when it ends, not once a receipt."""

    clients = [
        {"name": "strict", "key_sha256": [_sha(KEYS["strict-0"])], "limits": {"usd_per_day": "5"}}
    ]
    routes = [{"name": "chat", "prefix": "/v1", "upstream": f"{simulator.url}/v1"}]
    settings = {
        "limits_backend": "redis",
        **redis.settings,
        "on_backend_error": policy,
        "limits_timeout": 1.0,
    }
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
    headers = {"authorization": f"Bearer {KEYS['strict-0']}", "x-sim-tokens": "20"}

    def counted() -> int:
        client = redis.client(decode_responses=True)
        try:
            keys = [k for k in client.scan_iter(match="*usd_per_day*")]
            return sum(int(client.get(k) or 0) for k in keys)
        finally:
            client.close()

    with gateway_for("", routes=routes, clients=clients, **settings) as gw:
        url = gw.url + "/v1/chat/completions"
        assert web.post(url, json=body, headers=headers).status_code == 200

        def spent() -> float:
            text = web.get(gw.url + "/metrics").text
            return metric_value(text, "gateway_spend_usd_total", client="strict")

        # settled just after the answer's last byte (until then Redis holds the larger
        # reservation): wait until it holds the request's cost
        wait_until(
            lambda: 0 < counted() == round(spent() * 10**9),
            "the first request settled in Redis at its cost",
        )
        before = counted()
        redis.stop()
        during = [web.post(url, json=body, headers=headers) for _ in range(4)]
        wait_until(  # a request is counted just after its answer's last byte
            lambda: (
                metric_value(
                    web.get(gw.url + "/metrics").text, "gateway_requests_total", client="strict"
                )
                == 5
            ),
            "the five requests counted",
        )
        spent_during = spent()
        redis.start()  # empty: what it holds now is what was settled since
        if policy == "allow":
            assert [r.status_code for r in during] == [200] * 4
            expected = round(spent_during * 10**9) - before
            for _ in range(400):  # the link sends the settlements again until Redis answers
                if counted() >= expected:
                    break
                web.get(gw.url + "/healthz")
            assert counted() == expected
            wait_until(
                lambda: "spend ledger: Redis answers again" in caplog.text,
                "the receipts kept written (the ledger retries every second)",
            )
            assert caplog.text.count("spend ledger: Redis does not answer") == 1
            assert caplog.text.count("spend ledger: Redis answers again") == 1
        else:
            assert [r.status_code for r in during] == [503] * 4
            assert during[0].json()["error"]["code"] == "limits_backend_unavailable"
            assert counted() == 0


def test_a_mixed_run_over_two_gateways_report_receipts_and_metric_agree_exactly(
    simulator: ServerThread, redis: RedisServer, tmp_path: Path
) -> None:
    """1,000 requests of three clients over two gateway processes on one Redis: streamed,
    plain, cut, served from the cache, refused by a budget and unpriced. The spend
    report's total equals the sum of the 1,000 receipts and the metric's sum, exactly."""
    keys = {name: f"sk-{name}-mixed-0123" for name in ("mixed-a", "mixed-b", "admin")}
    config = tmp_path / "gateway.toml"
    clients = "".join(
        f"""
[[clients]]
name = "{name}"
key_sha256 = ["{_sha(key)}"]
spend_admin = {"true" if name == "admin" else "false"}
[clients.limits]
usd_per_day = "{"0.01" if name == "mixed-b" else "100"}"
"""
        for name, key in keys.items()
    )
    config.write_text(
        f"""
limits_backend = "redis"
{redis.toml}
stream_store = "redis"
limits_timeout = 2.0
on_backend_error = "deny"
[[routes]]
name = "chat"
prefix = "/v1"
upstream = "{simulator.url}/v1"
cache = true
{clients}
"""
    )

    def request(index: int) -> tuple[str, str, dict[str, object], dict[str, str]]:
        client = ("mixed-a", "mixed-b", "admin")[index % 3]
        body: dict[str, object] = {
            "model": "gpt-4o",
            "messages": [{"role": "user", "content": f"question {index % 50}"}],
            "max_tokens": 200,
        }
        headers = {"authorization": f"Bearer {keys[client]}", "x-sim-tokens": "30"}
        if index % 2:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if index % 7 == 3:
            body["stream"] = True
            headers["x-sim-fault"] = "drop_after_text"
        if index % 25 == 11:
            body["model"] = "sim-model"
        if index % 10 == 4:  # the same question again: a cache hit (or a follower)
            body["messages"] = [{"role": "user", "content": "the cached question"}]
            body.pop("stream", None)
        return client, f"mixed-{index:04d}", body, headers

    async def run(urls: list[str]) -> list[tuple[str, str, int]]:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=50)) as http:
            gate = asyncio.Semaphore(50)

            async def one(index: int) -> tuple[str, str, int]:
                client, rid, body, headers = request(index)
                async with gate:
                    answer = await http.post(
                        urls[index % 2] + "/v1/chat/completions",
                        json=body,
                        headers={**headers, "x-request-id": rid},
                    )
                return client, rid, answer.status_code

            return list(await asyncio.gather(*(one(i) for i in range(1000))))

    with (
        gateway_process(["--config", str(config)]) as one,
        gateway_process(["--config", str(config)]) as two,
    ):
        sent = asyncio.run(run([one.url, two.url]))
        statuses = [status for _, _, status in sent]
        assert statuses.count(200) > 500
        assert statuses.count(429) > 0, web.get(
            f"{two.url}/v1/gateway/spend?group_by=client,evidence",
            headers={"authorization": f"Bearer {keys['admin']}"},
        ).text
        assert statuses.count(400) > 0  # unpriced
        receipts = []
        for client, rid, _ in sent:
            for _ in range(100):  # written by a task: poll, bounded
                found = web.get(
                    f"{one.url}/v1/gateway/receipts/{rid}",
                    headers={"authorization": f"Bearer {keys[client]}"},
                )
                if found.status_code == 200:
                    break
            assert found.status_code == 200, (rid, found.text)
            receipts.append(found.json())
        report = web.get(
            f"{two.url}/v1/gateway/spend?group_by=client,evidence",
            headers={"authorization": f"Bearer {keys['admin']}"},
        ).json()
        metrics = [web.get(gw.url + "/metrics", timeout=30).text for gw in (one, two)]
    summed = sum(r["cost"]["nanos"] for r in receipts)
    assert report["total"]["requests"] == 1000
    assert report["total"]["nanos"] == summed
    metric = sum(metric_value(t, "gateway_spend_usd_total") for t in metrics)
    assert round(metric * 10**9) == summed
    assert any(r["cache"] == "hit" and r["cost"]["nanos"] == 0 for r in receipts)
    assert any(r["cost"]["evidence"] == "estimated" for r in receipts)
    assert any(r["rejected"] == "unpriced" for r in receipts)
