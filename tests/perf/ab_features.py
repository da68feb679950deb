"""What resume, the cache and limits add to a stream's CPU: one build, off and on, at once.

``ab_gateway.py`` with this tree as both A and B, in two configurations: every
feature off as shipped (A), and the same gateway with resume and the cache on
(the memory stream store) and the bench's key a named client with a token limit
(the memory limits backend) (B). Both run on one CPU at the same time, so the
machine's other load disturbs both alike; the ratio B/A of their process CPU a
request is what the three stages cost together. Every request has a target of
its own (``--unique``), so the cache misses every time and records every stream
(a hit would cost less than the upstream's answer, and prove nothing)::

    .venv/bin/python tests/perf/ab_features.py --events 150 --rounds 5

``--events 150`` streams scenario 1's events unpaced; other options go to
``ab_gateway.py`` (``--seconds``, ``--conns``, ``--profile``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import ab_gateway  # noqa: E402

#: A limit the bench never reaches: the limiter reserves and settles every request.
LIMITS = {"tokens_per_day": 10**13, "requests_per_minute": 10**9}


def _routes() -> str:
    route = {"name": "default", "prefix": "/v1", "upstream": "{upstream}"}
    return json.dumps([route | {"resume": True, "cache": True}])


def main(argv: list[str] | None = None) -> int:
    args = ["--base", str(HERE.parents[1]), "--unique"]
    clients = ab_gateway.named_client(LIMITS)
    for pair in (f"GATEWAY_ROUTES={_routes()}", f"GATEWAY_CLIENTS={clients}"):
        args += ["--b-env", pair]
    return ab_gateway.main(args + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
