"""Issued keys shared through a real redis-server by two gateway processes: a change on
one is honoured by the other within a second (the openai and anthropic SDKs), 1,000 keys
created at once over both are all distinct and all listed, and the keys survive a
restart of a Redis run as the shipped compose file and Kubernetes manifest run it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests import web
from tests.conftest import GatewayProcess, ServerThread, gateway_process
from tests.integration.redis_server import RedisServer, also_on_a_cluster
from tests.sdk import anthropic, openai

#: Every test here is Redis-backed: run against a cluster too (make test-redis-cluster).
pytestmark = pytest.mark.redis

ADMIN = "sk-keys-admin-0123"
REPO = Path(__file__).resolve().parents[2]
#: What "every replica agrees within a second" allows, from the change's answer.
AGREEMENT_SECONDS = 1.0


def _toml(simulator: ServerThread, redis: RedisServer) -> str:
    digest = hashlib.sha256(ADMIN.encode()).hexdigest()
    return f"""
{redis.toml}
[keys]
store = "redis"
last_used_seconds = 0.2
[[routes]]
name = "chat"
prefix = "/v1"
upstream = "{simulator.url}/v1"
[[clients]]
name = "ops"
key_sha256 = ["{digest}"]
keys_admin = true
"""


@pytest.fixture
def pair(
    simulator: ServerThread, redis: RedisServer, tmp_path: Path
) -> Iterator[tuple[GatewayProcess, GatewayProcess]]:
    config = tmp_path / "gateway.toml"
    config.write_text(_toml(simulator, redis))
    with (
        gateway_process(["--config", str(config)]) as one,
        gateway_process(["--config", str(config)]) as two,
    ):
        yield one, two


def _api(url: str, method: str, path: str = "", **kwargs: Any) -> httpx.Response:
    return web.request(
        method,
        f"{url}/v1/gateway/keys{path}",
        headers={"authorization": f"Bearer {ADMIN}"},
        timeout=30,
        **kwargs,
    )


def _status(url: str, key: str) -> int:
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
    answer = web.post(
        url + "/v1/chat/completions",
        json={**body, "max_tokens": 3},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    return answer.status_code


def _within(seconds: float, holds: Callable[[], bool]) -> float:
    """How long after now ``holds()`` first held (AssertionError past ``seconds``)."""
    started = time.monotonic()
    while not holds():
        elapsed = time.monotonic() - started
        assert elapsed < seconds, f"did not hold within {seconds} s"
        time.sleep(0.01)
    return time.monotonic() - started


@also_on_a_cluster
def test_a_change_on_one_gateway_holds_on_the_other_within_a_second(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    one, two = pair
    created = _api(one.url, "POST", json={"client": "replicated"})
    assert created.status_code == 201
    key, key_id = created.json()["key"], created.json()["id"]
    _within(AGREEMENT_SECONDS, lambda: _status(two.url, key) == 200)
    client = openai.OpenAI(base_url=two.url + "/v1", api_key=key, max_retries=0)
    reply = client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert reply.choices[0].message.content
    claude = anthropic.Anthropic(base_url=two.url, api_key=key, max_retries=0)
    message = claude.messages.create(
        model="sim", max_tokens=3, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.content
    # rotated on the second: the old secret works during the overlap on the first, and
    # not after it; the new one works there within a second
    rotated = _api(two.url, "POST", f"/{key_id}/rotate", json={"overlap_seconds": 2})
    new = rotated.json()["key"]
    _within(AGREEMENT_SECONDS, lambda: _status(one.url, new) == 200)
    assert _status(one.url, key) == 200
    _within(10, lambda: _status(one.url, key) == 401)
    assert _status(one.url, new) == 200
    # revoked on the second: refused on the first within a second
    assert _api(two.url, "POST", f"/{key_id}/revoke").status_code == 200
    _within(AGREEMENT_SECONDS, lambda: _status(one.url, new) == 401)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=one.url + "/v1", api_key=new, max_retries=0).models.list()
    # last use was written by both (at most once per interval each) and is listed
    shown = _within(5, lambda: _api(one.url, "GET", f"/{key_id}").json()["last_used"] is not None)
    assert shown >= 0


async def _create_many(urls: list[str], count: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=32)
    headers = {"authorization": f"Bearer {ADMIN}"}
    gate = asyncio.Semaphore(32)
    async with httpx.AsyncClient(timeout=60, limits=limits, headers=headers) as client:

        async def one(index: int) -> httpx.Response:
            async with gate:
                url = f"{urls[index % len(urls)]}/v1/gateway/keys"
                return await client.post(url, json={"client": f"bulk-{index}"})

        return await asyncio.gather(*(one(i) for i in range(count)))


def test_a_thousand_keys_created_at_once_over_two_gateways_are_distinct_and_listed(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    one, two = pair
    answers = asyncio.run(_create_many([one.url, two.url], 1000))
    assert [a.status_code for a in answers] == [201] * 1000
    ids = {a.json()["id"] for a in answers}
    secrets = {a.json()["key"] for a in answers}
    assert len(ids) == len(secrets) == 1000
    for gw in (one, two):
        listed = {k["id"] for k in _api(gw.url, "GET").json()["data"]}
        assert listed == ids
    # the last one created on the first is honoured by the second within a second
    last = answers[-2].json()["key"]
    _within(AGREEMENT_SECONDS, lambda: _status(two.url, last) == 200)


def _shipped_redis_args() -> list[list[str]]:
    """The redis-server arguments of the compose file and of the Kubernetes manifest."""
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    command = compose["services"]["redis"]["command"][1:]
    manifest = list(yaml.safe_load_all((REPO / "config/kubernetes/redis/redis.yaml").read_text()))
    deployment = next(o for o in manifest if o["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return [command, args]


def _options(args: list[str]) -> dict[str, str]:
    names = args[0::2]
    assert all(n.startswith("--") for n in names), args
    return {n[2:]: v for n, v in zip(names, args[1::2], strict=True)}


@pytest.mark.parametrize("source", ["compose", "kubernetes"])
def test_issued_keys_survive_a_restart_of_redis_run_as_shipped(
    simulator: ServerThread, tmp_path: Path, source: str
) -> None:
    shipped = _options(_shipped_redis_args()[["compose", "kubernetes"].index(source)])
    assert shipped["appendonly"] == "yes"
    persistence = {**shipped, "dir": str(tmp_path)}
    persistence.pop("maxmemory", None)
    server = RedisServer(persistence=persistence).start()
    try:
        config = tmp_path / "gateway.toml"
        config.write_text(_toml(simulator, server))
        with gateway_process(["--config", str(config)]) as gw:
            created = [_api(gw.url, "POST", json={"client": f"kept-{i}"}).json() for i in range(5)]
            _api(gw.url, "POST", f"/{created[0]['id']}/revoke")
            server.stop()  # SIGTERM: what a container stop sends
            server.start()
            listed = _within(10, lambda: _api(gw.url, "GET").status_code == 200)
            assert listed >= 0
            keys = {k["id"]: k for k in _api(gw.url, "GET").json()["data"]}
            assert set(keys) == {k["id"] for k in created}
            assert keys[created[0]["id"]]["state"] == "revoked"
        with gateway_process(["--config", str(config)]) as fresh:  # a replica started after
            assert _status(fresh.url, created[1]["key"]) == 200
            assert _status(fresh.url, created[0]["key"]) == 401
    finally:
        server.stop()


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", "keys", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_the_cli_issues_rotates_and_revokes_keys_a_running_gateway_honours(
    simulator: ServerThread, redis: RedisServer, tmp_path: Path
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(_toml(simulator, redis))
    with gateway_process(["--config", str(config)]) as gw:
        made = _cli(config, "create", "--client", "from-cli", "--metadata", "owner=ana")
        assert made.returncode == 0, made.stderr
        created = json.loads(made.stdout)
        assert "key create: id=" in made.stderr
        assert created["key"] not in made.stderr
        _within(AGREEMENT_SECONDS, lambda: _status(gw.url, created["key"]) == 200)
        listed = json.loads(_cli(config, "list").stdout)["data"]
        assert [k["id"] for k in listed] == [created["id"]]
        assert created["key"] not in _cli(config, "list").stdout
        shown = json.loads(_cli(config, "show", created["id"]).stdout)
        assert shown["metadata"] == {"owner": "ana"}
        rotated = json.loads(_cli(config, "rotate", created["id"], "--overlap", "0").stdout)
        _within(AGREEMENT_SECONDS, lambda: _status(gw.url, rotated["key"]) == 200)
        assert _status(gw.url, created["key"]) == 401
        assert _cli(config, "revoke", created["id"]).returncode == 0
        _within(AGREEMENT_SECONDS, lambda: _status(gw.url, rotated["key"]) == 401)
        clash = _cli(config, "create", "--client", "ops")
        assert clash.returncode == 1
        assert "existing_client" in clash.stderr
        missing = _cli(config, "show", "key_000000000000000000000000")
        assert missing.returncode == 1
    memory = tmp_path / "memory.toml"
    memory.write_text(_toml(simulator, redis).replace('store = "redis"', 'store = "memory"'))
    assert _cli(memory, "list").returncode == 2
