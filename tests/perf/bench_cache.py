"""Microbenchmark: a response-cache hit beside a miss, through a real gateway.

Run it as a script (it is not a pytest test)::

    .venv/bin/python tests/perf/bench_cache.py [--requests N] [--tokens T]

A gateway (uvicorn, uvloop, httptools, in this process's thread) caches a route in
front of the simulator (another thread), which answers as fast as it can. Rounds
interleave three sequential requests of a Chat stream of T content deltas:

- **off**: the same route without ``cache`` (another prefix): the path that does
  not cache;
- **miss**: a body never seen (a new ``user`` each round): the lookup, the claim,
  the upstream answer recorded into the memory store, the entry finished;
- **hit**: the one body every round: the lookup and the replay from the store.

It prints p50 and p90 of the time to the last byte (ms) of each, and the whole
process's CPU time per request of each kind (ms), measured over separate passes.
The machine's other load disturbs the numbers: run it on a quiet machine, twice.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

import tests.conftest  # noqa: E402, F401  # first: it chooses the guard's build before any import of it
from gateway.app import create_app  # noqa: E402
from gateway.server.edge import uvicorn_options  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from gateway.simulator import create_simulator_app  # noqa: E402
from tests.conftest import running  # noqa: E402


def body(user: str) -> dict[str, object]:
    return {
        "model": "sim-1",
        "messages": [{"role": "user", "content": "Summarise this. " * 20}],
        "user": user,
        "stream": True,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=50)
    args = parser.parse_args()
    with running(create_simulator_app(default_tokens=args.tokens)) as sim:
        routes = [
            {"name": "cached", "prefix": "/c", "upstream": f"{sim.url}/v1", "cache": True},
            {"name": "plain", "prefix": "/p", "upstream": f"{sim.url}/v1"},
        ]
        settings = Settings(routes=routes, access_log=False)
        with (
            running(create_app(settings), **uvicorn_options()) as gw,
            httpx.Client(timeout=30) as client,
        ):

            def timed(path: str, payload: dict[str, object]) -> float:
                start = time.perf_counter()
                response = client.post(f"{gw.url}{path}/chat/completions", json=payload)
                assert response.status_code == 200, response.text
                return (time.perf_counter() - start) * 1000

            client.post(f"{gw.url}/c/chat/completions", json=body("hit"))  # the entry
            times: dict[str, list[float]] = {"off": [], "miss": [], "hit": []}
            for n in range(args.requests):
                times["off"].append(timed("/p", body(f"off-{n}")))
                times["miss"].append(timed("/c", body(f"miss-{n}")))
                times["hit"].append(timed("/c", body("hit")))
            cpu: dict[str, float] = {}
            for kind, path in (("off", "/p"), ("miss", "/c"), ("hit", "/c")):
                start = time.process_time()
                for n in range(args.requests):
                    timed(path, body("hit" if kind == "hit" else f"{kind}-cpu-{n}"))
                cpu[kind] = (time.process_time() - start) * 1000 / args.requests
    print(f"{args.requests} requests each, Chat streams of {args.tokens} deltas")
    print("kind   p50 ms  p90 ms  CPU ms/request (gateway + simulator + client)")
    for kind, values in times.items():
        values.sort()
        p50 = statistics.median(values)
        p90 = values[int(len(values) * 0.9)]
        print(f"{kind:5}  {p50:6.2f}  {p90:6.2f}  {cpu[kind]:6.2f}")


if __name__ == "__main__":
    main()
