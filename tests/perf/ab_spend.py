"""What money budgets add to a request's CPU: one build, money budgets off and on, at once.

``ab_gateway.py`` with this tree as both A and B, in two configurations: a named
client with a token limit (A: money budgets off; its requests are still priced),
and the same client with a day's and a month's money budget too (B). Both run on
one CPU at the same time, so the machine's other load disturbs both alike; the
ratio B/A of their process CPU a request is what money budgets add. With
``--backend redis`` both share a real ``redis-server`` on a free loopback port
(started here, stopped by its PID), as replicas do::

    .venv/bin/python tests/perf/ab_spend.py --backend memory [--rounds 3]
    .venv/bin/python tests/perf/ab_spend.py --backend redis [--rounds 3]

Other options go to ``ab_gateway.py`` (``--mode json``, ``--seconds``, ``--profile``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import ab_gateway  # noqa: E402

TOKENS = {"tokens_per_day": 10**13}
MONEY = {**TOKENS, "usd_per_day": "1000000", "usd_per_month": "10000000"}
#: The bench's model is a made-up one: an override prices it.
PRICES = [{"model": "*", "input": "1", "output": "2"}]


@contextlib.contextmanager
def _redis() -> Iterator[str]:
    """A throwaway redis-server on a free loopback port: its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if time.monotonic() > deadline:
                raise SystemExit("redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("memory", "redis"), default="memory")
    opts, rest = parser.parse_known_args(argv)
    common = [f"GATEWAY_PRICES={json.dumps(PRICES)}"]
    with contextlib.ExitStack() as stack:
        if opts.backend == "redis":
            url = stack.enter_context(_redis())
            common += ["GATEWAY_LIMITS_BACKEND=redis", f"GATEWAY_REDIS_URL={url}"]
        args = ["--base", str(HERE.parents[1])]
        for label, limits in (("a", TOKENS), ("b", MONEY)):
            for pair in (f"GATEWAY_CLIENTS={ab_gateway.named_client(limits)}", *common):
                args += [f"--{label}-env", pair]
        return ab_gateway.main(args + rest)


if __name__ == "__main__":
    sys.exit(main())
