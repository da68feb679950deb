"""Scale-out, measured: three gateway processes on one Redis, then on a three-master
Redis Cluster, side by side in one run.

Run it as a script (it is not a pytest test)::

    .venv/bin/python tests/perf/bench_redis_scale.py [--burst 2000] [--streams 1000]

For each deployment (a real ``redis-server`` on a free loopback port; a six-node
cluster, three masters with a replica each, made by ``redis-cli --cluster create``),
three ``gateway serve`` processes share it in front of the simulator (its own process):

1. **admissions/s**: a burst of ``--burst`` limited requests (100 named clients, each
   with a requests-a-minute and a tokens-a-minute limit well above the burst, so every
   one is admitted after a reservation and settled after its answer), 200 in flight,
   spread over the three gateways: admitted requests / the burst's wall time;
2. **resumable streams/s**: ``--streams`` short streams on a route with ``resume``
   (each opens a log, writes its events and its end), 100 in flight: streams / wall time.

Everything runs on this machine: on two shared cores the cluster's extra masters add
cores to no one, so what the numbers show there is what the cluster costs (routing,
more connections), not what it adds on machines of their own. Every process is
stopped by its PID; the run is bounded by its counts.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

import tests.conftest  # noqa: E402, F401  # first: it chooses the guard's build before any import of it
from tests.conftest import free_port, gateway_process  # noqa: E402
from tests.integration.redis_server import RedisServer  # noqa: E402
from tests.integration.redis_sets import ClusterSet  # noqa: E402

CLIENTS = 100


def _key(i: int) -> str:
    return f"sk-scale-client-{i:04d}"


def _config(upstream: str, redis: str) -> str:
    clients = "".join(
        f"""
[[clients]]
name = "c{i}"
key_sha256 = ["{hashlib.sha256(_key(i).encode()).hexdigest()}"]
[clients.limits]
requests_per_minute = 1000000
tokens_per_minute = 1000000000
"""
        for i in range(CLIENTS)
    )
    return f"""
access_log = false
limits_backend = "redis"
stream_store = "redis"
limits_timeout = 1.0
{redis}
[[routes]]
name = "v1"
prefix = "/v1"
upstream = "{upstream}"
resume = true
resume_ttl_seconds = 60
{clients}"""


def _body(n: int) -> dict[str, object]:
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": f"hello {n}"}],
        "stream": True,
        "max_tokens": 16,
    }


async def _fire(urls: list[str], count: int, in_flight: int, tokens: int) -> tuple[int, float]:
    """``count`` requests, ``in_flight`` at a time, round robin over ``urls``: the number
    answered 200 with a whole stream, and the wall time."""
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    gate = asyncio.Semaphore(in_flight)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(n: int) -> bool:
            headers = {"authorization": f"Bearer {_key(n % CLIENTS)}", "x-sim-tokens": str(tokens)}
            async with gate:
                try:
                    response = await client.post(
                        urls[n % len(urls)] + "/v1/chat/completions", json=_body(n), headers=headers
                    )
                except httpx.HTTPError:  # counted as not admitted (the run says how many)
                    return False
            return response.status_code == 200 and b"[DONE]" in response.content

        started = time.perf_counter()
        done = await asyncio.gather(*(one(n) for n in range(count)))
        return sum(done), time.perf_counter() - started


def _measure(upstream: str, redis: str, burst: int, streams: int) -> dict[str, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as file:
        file.write(_config(upstream, redis))
        file.flush()
        with ExitStack() as stack:
            gateways = [
                stack.enter_context(gateway_process(["--config", file.name])) for _ in range(3)
            ]
            urls = [g.url for g in gateways]
            asyncio.run(_fire(urls, 200, 100, 1))  # warm: connections, scripts
            admitted, took = asyncio.run(_fire(urls, burst, 200, 1))
            resumed, took_streams = asyncio.run(_fire(urls, streams, 100, 8))
    return {
        "admitted": admitted,
        "admissions_per_s": admitted / took,
        "streams": resumed,
        "streams_per_s": resumed / took_streams,
    }


def _single(upstream: str, burst: int, streams: int) -> dict[str, float]:
    single = RedisServer().start()
    try:
        return _measure(upstream, f'redis_url = "{single.url}"', burst, streams)
    finally:
        single.stop()


def _cluster(upstream: str, burst: int, streams: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        cluster = ClusterSet(Path(directory))
        try:
            cluster.start()
            settings = (
                f'redis_url = "{cluster.url}"\nredis_mode = "cluster"\n'
                f"redis_nodes = {json.dumps(cluster.nodes)}"
            )
            return _measure(upstream, settings, burst, streams)
        finally:
            cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--burst", type=int, default=2000)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument(
        "--cluster-first", action="store_true", help="measure the cluster first (order effects)"
    )
    args = parser.parse_args()
    sim_port = free_port()
    simulator = subprocess.Popen(
        [sys.executable, "-m", "gateway", "simulate", "--port", str(sim_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    upstream = f"http://127.0.0.1:{sim_port}/v1"
    results: dict[str, dict[str, float]] = {}
    try:
        for deployment in ("cluster", "single") if args.cluster_first else ("single", "cluster"):
            if deployment == "single":
                results["one Redis"] = _single(upstream, args.burst, args.streams)
            else:
                results["3-master cluster"] = _cluster(upstream, args.burst, args.streams)
    finally:
        simulator.terminate()
        simulator.wait(10)
    print(f"3 gateways, a burst of {args.burst} limited requests, {args.streams} resumable streams")
    print(f"{'':18} {'admissions/s':>13} {'admitted':>9} {'streams/s':>10} {'streams':>8}")
    for name, r in results.items():
        print(
            f"{name:18} {r['admissions_per_s']:13.0f} {r['admitted']:9.0f} "
            f"{r['streams_per_s']:10.0f} {r['streams']:8.0f}"
        )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
