"""``python -m gateway.simulator --host 127.0.0.1 --port 9000 [--tps N] [--tokens N]
[--fault NAME [--status N]]``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from gateway.simulator._server import serve


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.simulator",
        description="A fake OpenAI/Anthropic-compatible provider with scripted faults.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument(
        "--tps", type=float, default=0.0, help="content deltas per second (0: no pacing)"
    )
    parser.add_argument("--tokens", type=int, default=20, help="content deltas per answer")
    parser.add_argument(
        "--fault", default="none", help="the fault of every request that names none"
    )
    parser.add_argument(
        "--status", type=int, default=500, help="the status of fault 'status' (default 500)"
    )
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--no-access-log", action="store_true")
    args = parser.parse_args(argv)
    serve(
        args.host,
        args.port,
        default_tps=args.tps,
        default_tokens=args.tokens,
        log_level=args.log_level,
        access_log=not args.no_access_log,
        default_fault=args.fault,
        default_status=args.status,
    )


if __name__ == "__main__":
    main()
