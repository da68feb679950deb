"""Microbenchmark: what client limits add to a request, on the memory and the Redis backend.

Run it as a script (it is not a pytest test)::

    .venv/bin/python tests/perf/bench_limits.py [--requests N]

1. The memory backend: ``Limiter.reserve`` then ``Limiter.settle`` for a typical Chat
   request of a client with four limits (requests and tokens a minute, tokens a day,
   concurrent streams), N times on one event loop, in process CPU time: µs a request,
   the request's input estimate included. Goal: at most 10 µs.
2. Redis on loopback: a real ``redis-server`` on a free port (stopped by its PID), the
   same reserve and settle, each one Lua script sent by the Redis link's thread: p50 and
   p99 of the reservation, which is what a limited request waits before its upstream,
   one request at a time, and within bursts of 200 concurrent requests (what each of
   them waits, its share of the burst's pipelined round trips included), with the count
   of backend errors (goal: none, at the default limits_timeout of 50 ms).
3. End to end: the time to first byte of sequential streams through a real gateway in
   front of the simulator, for an anonymous request and for a limited client on Redis
   (interleaved, one of each per round): the added p50 is what Redis costs a request.
   Goal: at most 0.3 ms.

The machine's other load disturbs the numbers: run it on a quiet machine, twice.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tests.conftest  # noqa: E402, F401  # first: it chooses the guard's build before any import of it
from gateway.limits import Limiter  # noqa: E402
from gateway.limits.memory import MemoryBackend  # noqa: E402
from gateway.policy.quota import Cost, Source, estimate_input  # noqa: E402
from gateway.protocols import spec_for  # noqa: E402
from gateway.settings import ClientConfig, ClientLimits  # noqa: E402

KEY = "sk-bench-client"
LIMITS = ClientLimits(
    requests_per_minute=10**9,
    tokens_per_minute=10**12,
    tokens_per_day=10**13,
    max_concurrent_streams=10**6,
)
CLIENT = ClientConfig(name="bench", key_sha256=[hashlib.sha256(KEY.encode()).hexdigest()])
REQUEST = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant." * 4},
        {"role": "user", "content": "Summarise the following text in three lines. " * 20},
    ],
    "max_tokens": 256,
    "stream": True,
}
COST = Cost(300, 120, Source.REPORTED)


async def _cycle(limiter: Limiter, n: int) -> list[float]:
    times = []
    for index in range(n):
        started = time.perf_counter()
        reservation = await limiter.reserve(
            "bench",
            "chat",
            "gpt-4o-mini",
            estimate_input(REQUEST, 1500),  # made while the body is parsed, in the gateway
            spec_for("chat").requested_output(REQUEST, 1024),
            True,
            f"r{index}",
            3600.0,
        )
        reserved = time.perf_counter()
        await limiter.settle(reservation, COST)
        times.append(reserved - started)
    return times


def memory(n: int) -> float:
    limiter = Limiter([CLIENT.model_copy(update={"limits": LIMITS})], MemoryBackend())

    async def run() -> float:
        await _cycle(limiter, 1000)  # warm up
        started = time.process_time()
        await _cycle(limiter, n)
        return (time.process_time() - started) / n * 1e6

    return asyncio.run(run())


def _percentiles(times: list[float]) -> tuple[float, float]:
    times = sorted(times)
    return times[len(times) // 2] * 1e3, times[int(len(times) * 0.99)] * 1e3


def redis_round_trips(url: str, n: int) -> tuple[float, float]:
    from gateway.limits.redis_backend import RedisBackend

    async def run() -> list[float]:
        backend = RedisBackend(url, timeout=0.05)
        limiter = Limiter([CLIENT.model_copy(update={"limits": LIMITS})], backend)
        await limiter.start()
        await _cycle(limiter, 200)
        times = await _cycle(limiter, n)
        await limiter.close()
        return times

    return _percentiles(asyncio.run(run()))


def redis_bursts(url: str, bursts: int, size: int = 200) -> tuple[float, float, int]:
    """Bursts of ``size`` concurrent reservations (then their settlements): p50 and p99 of
    the time each reservation waited, and the backend errors (default timeout, 50 ms)."""
    from gateway.limits.redis_backend import RedisBackend

    errors: list[str] = []

    async def one(limiter: Limiter, index: int, into: list[float]) -> None:
        started = time.perf_counter()
        reservation = await limiter.reserve(
            "bench",
            "chat",
            "gpt-4o-mini",
            estimate_input(REQUEST, 1500),
            spec_for("chat").requested_output(REQUEST, 1024),
            True,
            f"b{index}",
            3600.0,
        )
        into.append(time.perf_counter() - started)
        await limiter.settle(reservation, COST)

    async def run() -> list[float]:
        backend = RedisBackend(url, timeout=0.05)
        limiter = Limiter(
            [CLIENT.model_copy(update={"limits": LIMITS})], backend, on_error=errors.append
        )
        await limiter.start()
        times: list[float] = []
        for burst in range(bursts + 2):
            into: list[float] = [] if burst < 2 else times  # two to warm up
            await asyncio.gather(*(one(limiter, burst * size + i, into) for i in range(size)))
        await limiter.close()
        return times

    p50, p99 = _percentiles(asyncio.run(run()))
    return p50, p99, len(errors)


def end_to_end(url: str, n: int) -> tuple[float, float]:
    """Gateway and simulator in processes of their own (threads of this one would share
    its GIL with the client, and a thread waiting on Redis may wait for the GIL too)."""
    import subprocess
    import tempfile

    from tests import web
    from tests.conftest import free_port, gateway_process

    sim_port = free_port()
    simulator = subprocess.Popen(
        [sys.executable, "-m", "gateway", "simulate", "--port", str(sim_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    upstream = f"http://127.0.0.1:{sim_port}/v1"
    config = f"""
access_log = false
limits_backend = "redis"
redis_url = "{url}"
[[routes]]
name = "open"
prefix = "/open/v1"
upstream = "{upstream}"
client_key_sha256 = []
[[routes]]
name = "chat"
prefix = "/v1"
upstream = "{upstream}"
[[clients]]
name = "bench"
key_sha256 = {json.dumps(CLIENT.key_sha256)}
[clients.limits]
""" + "".join(f"{k} = {v}\n" for k, v in LIMITS.model_dump().items() if v is not None)
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".toml") as file:
            file.write(config)
            file.flush()
            with (
                gateway_process(["--config", file.name]) as gw,
                web.client(timeout=30) as client,
            ):
                body = {**REQUEST, "model": "sim-model"}
                plain: list[float] = []
                keyed: list[float] = []
                for index in range(n + 50):
                    for path, headers, into in (
                        ("/open/v1/chat/completions", {}, plain),
                        ("/v1/chat/completions", {"authorization": f"Bearer {KEY}"}, keyed),
                    ):
                        started = time.perf_counter()
                        with client.stream("POST", gw.url + path, json=body, headers=headers) as r:
                            chunks = r.iter_raw()
                            next(chunks)
                            ttfb = time.perf_counter() - started
                            for _ in chunks:
                                pass
                        if index >= 50:
                            into.append(ttfb)
    finally:
        simulator.terminate()
        simulator.wait(10)
    return statistics.median(plain) * 1e3, statistics.median(keyed) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000, help="memory-backend cycles")
    parser.add_argument("--round-trips", type=int, default=2000, help="Redis cycles")
    parser.add_argument("--bursts", type=int, default=20, help="bursts of 200 reservations")
    parser.add_argument("--streams", type=int, default=300, help="end-to-end streams each")
    args = parser.parse_args()
    us = memory(args.requests)
    print(f"memory backend: reserve + settle = {us:.2f} us a request (CPU; goal <= 10)")
    from tests.integration.redis_server import RedisServer

    server = RedisServer().start()
    try:
        p50, p99 = redis_round_trips(server.url, args.round_trips)
        print(f"redis on loopback: reservation p50 = {p50:.3f} ms, p99 = {p99:.3f} ms")
        p50, p99, errors = redis_bursts(server.url, args.bursts)
        print(
            f"redis on loopback, bursts of 200: reservation p50 = {p50:.3f} ms, "
            f"p99 = {p99:.3f} ms, backend errors = {errors}"
        )
        plain, keyed = end_to_end(server.url, args.streams)
        print(
            f"end to end, TTFB p50: anonymous {plain:.3f} ms, limited on redis {keyed:.3f} ms, "
            f"added {keyed - plain:+.3f} ms (goal <= 0.3)"
        )
    finally:
        server.stop()
    return 0 if us <= 10 else 1


if __name__ == "__main__":
    sys.exit(main())
