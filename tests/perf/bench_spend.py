"""Microbenchmark: what pricing and money budgets add to a request.

Run it as a script (it is not a pytest test)::

    .venv/bin/python tests/perf/bench_spend.py [--requests N]

1. Pricing a settled request: ``Pricer.quote`` (a kept quote: a dict lookup) and
   ``price_cost`` (the table's own Decimal arithmetic on one usage), µs a request in
   process CPU time.
2. The memory backend: ``Limiter.reserve`` then ``Limiter.settle`` of the same request
   for a client with token limits only, and with money limits too (a day's and a
   month's, its team's month), µs a request in CPU time: the difference is what money
   budgets add.
3. A receipt kept in the memory ledger: µs a request.
4. Redis on loopback (a real ``redis-server`` on a free port, stopped by its PID): p50 of
   reserve + settle, token limits only and with money limits too, one request at a time.

The machine's other load disturbs the numbers: run it on a quiet machine, twice.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import time
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tests.conftest  # noqa: E402, F401  # first: it chooses the guard's build before any import of it
from gateway.guard.verdict import Usage  # noqa: E402
from gateway.limits import Limiter  # noqa: E402
from gateway.limits.backend import Backend  # noqa: E402
from gateway.limits.memory import MemoryBackend  # noqa: E402
from gateway.money.charge import price_cost  # noqa: E402
from gateway.money.prices import Pricer  # noqa: E402
from gateway.policy.quota import Cost, Source, estimate_input  # noqa: E402
from gateway.protocols import spec_for  # noqa: E402
from gateway.settings import ClientConfig, ClientLimits, TeamConfig  # noqa: E402
from gateway.spend.ledger import Entry, MemoryLedger, Row  # noqa: E402

KEY = "sk-bench-client"
TOKENS = ClientLimits(requests_per_minute=10**9, tokens_per_minute=10**12, tokens_per_day=10**13)
MONEY = TOKENS.model_copy(
    update={"usd_per_day": Decimal("1000000"), "usd_per_month": Decimal("10000000")}
)
TEAM = TeamConfig(name="bench-team", limits=ClientLimits(usd_per_month=Decimal("10000000")))
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
USAGE = Usage(input_tokens=300, output_tokens=120, cached_input_tokens=128, reasoning_tokens=0)
COST = Cost(300, 120, Source.REPORTED)
PRICER = Pricer()
BASIS = spec_for("chat").usage_basis


def pricing(n: int) -> float:
    PRICER.quote("gpt-4o-mini", "openai", route="chat", client="bench")
    started = time.process_time()
    for _ in range(n):
        quote = PRICER.quote("gpt-4o-mini", "openai", route="chat", client="bench")
        price_cost(COST, USAGE, True, False, BASIS, quote, "gpt-4o-mini")
    return (time.process_time() - started) / n * 1e6


async def _cycle(limiter: Limiter, n: int, money: bool) -> list[float]:
    quote = PRICER.quote("gpt-4o-mini", "openai", route="chat", client="bench")
    times = []
    for index in range(n):
        started = time.perf_counter()
        reservation = await limiter.reserve(
            "bench",
            "chat",
            "gpt-4o-mini",
            estimate_input(REQUEST, 1500),
            spec_for("chat").requested_output(REQUEST, 1024),
            True,
            f"r{index}",
            3600.0,
            quote=quote if money else None,
        )
        cost = COST
        if money:
            charge = price_cost(COST, USAGE, True, False, BASIS, quote, "gpt-4o-mini")
            cost = Cost(300, 120, Source.REPORTED, charge.nanos)
        await limiter.settle(reservation, cost)
        times.append(time.perf_counter() - started)
    return times


def _limiter(backend: Backend, money: bool) -> Limiter:
    client = CLIENT.model_copy(
        update={"limits": MONEY if money else TOKENS, "team": "bench-team" if money else None}
    )
    return Limiter([client], backend, teams=[TEAM])


def memory(n: int, money: bool) -> float:
    limiter = _limiter(MemoryBackend(), money)

    async def run() -> float:
        await _cycle(limiter, 1000, money)  # warm up
        started = time.process_time()
        await _cycle(limiter, n, money)
        return (time.process_time() - started) / n * 1e6

    return asyncio.run(run())


def receipts(n: int) -> float:
    ledger = MemoryLedger(3600.0, 100_000, 400)
    receipt = {"request_id": "x", "cost": {"nanos": 1234}, "usage": USAGE.as_dict()}
    row = Row(20000, "bench", "none", "gpt-4o-mini", "chat", "reported")

    async def run() -> float:
        started = time.process_time()
        for index in range(n):
            await ledger.keep(Entry(f"r{index}", "client:bench", receipt, row, 1234))
        return (time.process_time() - started) / n * 1e6

    return asyncio.run(run())


def redis(url: str, n: int, money: bool) -> float:
    from gateway.limits.redis_backend import RedisBackend

    async def run() -> list[float]:
        limiter = _limiter(RedisBackend(url, timeout=0.05), money)
        await limiter.start()
        await _cycle(limiter, 200, money)
        times = await _cycle(limiter, n, money)
        await limiter.close()
        return times

    times = sorted(asyncio.run(run()))
    return times[len(times) // 2] * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    args = parser.parse_args()
    n = args.requests
    print(f"pricing a settled request (quote + price): {pricing(n):.1f} µs")
    tokens, money = memory(n, False), memory(n, True)
    print(
        f"memory reserve + settle: tokens only {tokens:.1f} µs, with money "
        f"(and its pricing) {money:.1f} µs, added {money - tokens:.1f} µs"
    )
    print(f"a receipt kept in the memory ledger: {receipts(n):.1f} µs")
    from tests.integration.redis_server import redis_server

    with redis_server() as server:
        count = min(n, 2000)
        plain, priced = redis(server.url, count, False), redis(server.url, count, True)
        print(f"redis reserve + settle p50: tokens only {plain:.3f} ms, with money {priced:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
