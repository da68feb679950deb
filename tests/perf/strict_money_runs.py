"""Issue 42's strict money budget, five runs: 200 concurrent streams over two gateway
processes on one real ``redis-server`` against a $0.01 strict budget (then 200 of a team
mate against the team's $0.02), each run with fresh budgets; spend never above either.

The suite runs one (``tests/integration/test_spend_redis.py``: five take about 110 s on
the loaded development machine, near the suite's per-test timeout); this runs that
test with five, and prints each run's spend::

    .venv/bin/python tests/perf/strict_money_runs.py [--runs 5]

It exits with the test's status.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST = (
    "tests/integration/test_spend_redis.py::"
    "test_two_gateways_on_one_redis_never_spend_past_a_strict_money_budget"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    opts = parser.parse_args(argv)
    env = {**os.environ, "SPEND_STRICT_RUNS": str(opts.runs)}
    command = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:randomly", TEST]
    command += [f"--timeout={60 + 60 * opts.runs}"]
    return subprocess.run(command, cwd=ROOT, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
