"""The issue's literal outage, as a script (it is not a pytest test: it takes ~2 minutes).

A primary tier that is down for 60 s (503, no Retry-After) and then healthy, a
fallback tier that is always healthy, and 20 requests 4 s apart through a real
gateway. Prints who served each request and how long it took, then checks that
all were served, that the fallback served during the outage, that traffic was
back on the primary within 30 s of its recovery, and that no request took
over 30 s. Everything runs on 127.0.0.1 and stops by itself::

    PYTHONPATH=$PWD .venv/bin/python tests/perf/outage_tiers.py
    PYTHONPATH=$PWD .venv/bin/python tests/perf/outage_tiers.py --outage 20 --gap 2

The test suite runs the same shape scaled down (tests/integration/test_rescue_tiers.py).
"""

from __future__ import annotations

import argparse
import sys
import time

from gateway.simulator import create_simulator_app
from tests import web
from tests.conftest import running
from tests.integration.helpers import gateway_for


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--outage", type=float, default=60.0, help="seconds the primary is down")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--gap", type=float, default=4.0, help="seconds between requests")
    args = parser.parse_args()
    chat = {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    primary_app = create_simulator_app(
        default_fault="status", default_status=503, fault_seconds=args.outage, retry_after=None
    )
    with running(primary_app) as primary, running(create_simulator_app()) as fallback:
        routes = [
            {
                "name": "chat",
                "prefix": "/v1",
                "max_attempts": 3,
                "eject_after": 3,
                "eject_base_seconds": 10.0,
                "eject_max_seconds": 20.0,
                "timeouts": {"total": 30.0},
                "upstreams": [
                    {"name": "primary", "url": primary.url + "/v1"},
                    {"name": "fallback", "url": fallback.url + "/v1", "priority": 1},
                ],
            }
        ]
        with gateway_for("", routes=routes) as gw:
            first = time.monotonic()
            rows: list[tuple[float, int, str, float]] = []
            for i in range(args.requests):
                due = first + i * args.gap
                time.sleep(max(due - time.monotonic(), 0.0))
                sent = time.monotonic()
                response = web.post(gw.url + "/v1/chat/completions", json=chat, timeout=60)
                took = time.monotonic() - sent
                served = response.headers.get("x-gateway-upstream", "-")
                rows.append((sent - first, response.status_code, served, took))
                print(f"{sent - first:6.1f} s  {response.status_code}  {served:8}  {took:5.2f} s")
    failures = []
    if any(status != 200 for _, status, _, _ in rows):
        failures.append("a request was not served")
    if any(took > 30 for *_, took in rows):
        failures.append("a request took over 30 s")
    during = [u for t, _, u, _ in rows if 1 < t < args.outage - 1]
    if not during or set(during) != {"fallback"}:
        failures.append("the fallback did not serve the outage alone")
    back = [t for t, _, u, _ in rows if t >= args.outage and u == "primary"]
    if not back or back[0] > args.outage + 30:
        failures.append("traffic was not back on the primary within 30 s of its recovery")
    print("ok" if not failures else "FAILED: " + "; ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
