"""``python -m gateway.simulator --host 127.0.0.1 --port 9000 [--tps N] [--tokens N]
[--fault NAME [--status N]]``; ``gateway simulate`` takes the same flags (``add_arguments``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from gateway.simulator._server import serve


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that say where the simulator listens and how it answers by default."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument(
        "--tps", type=float, default=0.0, help="content deltas per second (0: no pacing)"
    )
    parser.add_argument("--tokens", type=int, default=20, help="content deltas per answer")
    parser.add_argument(
        "--fault",
        default="none",
        metavar="NAME",
        help="the fault of every request that names none (a provider that always fails)",
    )
    parser.add_argument(
        "--status", type=int, default=500, help="the status of fault 'status' (default 500)"
    )


def run(args: argparse.Namespace, *, log_level: str = "info", access_log: bool = True) -> None:
    """Serve until interrupted, as the flags of ``add_arguments`` say."""
    serve(
        args.host,
        args.port,
        default_tps=args.tps,
        default_tokens=args.tokens,
        log_level=log_level,
        access_log=access_log,
        default_fault=args.fault,
        default_status=args.status,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.simulator",
        description="A fake OpenAI/Anthropic-compatible provider with scripted faults.",
    )
    add_arguments(parser)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--no-access-log", action="store_true")
    args = parser.parse_args(argv)
    run(args, log_level=args.log_level, access_log=not args.no_access_log)


if __name__ == "__main__":
    main()
