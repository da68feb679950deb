"""What logging before sending costs a resumable stream: each event's delay to its client.

Run as a script (starts its own ``redis-server`` and simulator; loopback only)::

    PYTHONPATH=. .venv/bin/python tests/perf/resume_latency.py --streams 20

Three gateways at once, their streams interleaved, in front of one simulator (60 tokens at 50 a
second): a route without resume, ``resume = true`` on the memory store, and on
the Redis store. For every event a client receives it takes the time since the
request was sent, and prints per gateway the median and p99 of the delay over the
same event in the route without resume (time to first byte apart), so the cost is
the store's wait, not the upstream's pace.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from typing import Any

import httpx

from tests.client_events import Splitter
from tests.conftest import running
from tests.integration.helpers import gateway_for
from tests.integration.redis_server import redis_server

BODY = {"model": "sim-model", "messages": [], "stream": True}
HEADERS = {"x-sim-tokens": "60", "x-sim-tps": "50", "x-sim-seed": "1"}


async def _arrivals(url: str) -> tuple[float, list[float]]:
    splitter = Splitter(False)
    times: list[float] = []
    async with httpx.AsyncClient(timeout=60) as client:
        started = time.perf_counter()
        async with client.stream(
            "POST", url + "/v1/chat/completions", json=BODY, headers=HEADERS
        ) as answer:
            first = time.perf_counter() - started
            async for chunk in answer.aiter_raw():
                now = time.perf_counter() - started
                times += [now] * len(splitter.feed(chunk))
    return first, times


def _measure(url: str, streams: int) -> list[tuple[float, list[float]]]:
    async def main() -> list[tuple[float, list[float]]]:
        return [await _arrivals(url) for _ in range(streams)]

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--streams", type=int, default=20)
    args = parser.parse_args()
    from gateway.simulator import create_simulator_app

    with running(create_simulator_app()) as sim, redis_server() as redis:
        route: dict[str, Any] = {"name": "v1", "prefix": "/v1", "upstream": sim.url + "/v1"}
        setups: dict[str, dict[str, Any]] = {
            "off": {"routes": [route]},
            "memory": {"routes": [{**route, "resume": True}]},
            "redis": {
                "routes": [{**route, "resume": True}],
                "stream_store": "redis",
                "redis_url": redis.url,
            },
        }
        with contextlib.ExitStack() as stack:
            urls = {
                name: stack.enter_context(gateway_for("", **settings)).url
                for name, settings in setups.items()
            }
            for url in urls.values():
                _measure(url, 2)  # warm up
            results: dict[str, list[tuple[float, list[float]]]] = {n: [] for n in urls}
            for _ in range(args.streams):  # interleaved: the machine's noise hits all alike
                for name, url in urls.items():
                    results[name] += _measure(url, 1)
    base = results["off"]
    for name, runs in results.items():
        first = [f * 1000 for f, _ in runs]
        delays = [
            (t - b) * 1000
            for (_, times), (_, base_times) in zip(runs, base, strict=True)
            for t, b in zip(times, base_times, strict=False)
        ]
        delays.sort()
        print(
            f"{name:7} first byte median {statistics.median(first):6.1f} ms; "
            f"event delay over 'off': median {statistics.median(delays):5.1f} ms, "
            f"p99 {delays[int(len(delays) * 0.99)]:5.1f} ms ({len(delays)} events)"
        )


if __name__ == "__main__":
    main()
