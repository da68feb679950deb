"""The command line: ``gateway serve``, ``gateway simulate``, ``gateway check-config``.

Imports of the app (and so of prometheus_client) are deferred until the
multiprocess metrics directory is prepared, because prometheus-client picks
its storage when it is first imported.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError

from gateway import __version__
from gateway.settings import Settings, describe_errors, export_for_workers, load_settings

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"gateway {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", help="TOML config file (also GATEWAY_CONFIG)")
        p.add_argument("--upstream", dest="upstream_url", help="upstream base URL for /v1")
        p.add_argument("--host", help="listen address (default 127.0.0.1)")
        p.add_argument("--port", type=int, help="listen port (default 8080)")
        p.add_argument("--workers", type=int, help="worker processes (default 1)")
        p.add_argument("--connect-timeout", type=float, help="seconds")
        p.add_argument("--first-byte-timeout", type=float, help="seconds")
        p.add_argument("--idle-timeout", type=float, help="seconds")
        p.add_argument("--total-timeout", type=float, help="seconds")
        p.add_argument("--drain-timeout", type=float, help="seconds in-flight streams get")
        p.add_argument("--metrics-dir", help="prometheus multiprocess directory")

    serve = sub.add_parser("serve", help="run the gateway")
    common(serve)
    check = sub.add_parser("check-config", help="print the effective configuration, redacted")
    common(check)
    sim = sub.add_parser("simulate", help="run the built-in fake provider")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=9000)
    sim.add_argument("--tps", type=float, default=0.0, help="deltas per second (0: no pacing)")
    sim.add_argument("--tokens", type=int, default=20, help="content deltas per answer")
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    timeouts = {
        key: value
        for key, value in (
            ("connect", args.connect_timeout),
            ("first_byte", args.first_byte_timeout),
            ("idle", args.idle_timeout),
            ("total", args.total_timeout),
        )
        if value is not None
    }
    overrides: dict[str, Any] = {
        "config": args.config,
        "upstream_url": args.upstream_url,
        "host": args.host,
        "port": args.port,
        "workers": args.workers,
        "drain_timeout": args.drain_timeout,
        "metrics_dir": args.metrics_dir,
    }
    if timeouts:
        # pydantic-settings deep-merges sources: a flag overrides one key only.
        overrides["timeouts"] = timeouts
    return overrides


def _load(args: argparse.Namespace) -> Settings:
    try:
        overrides = _overrides(args)
        return load_settings(**overrides)
    except ValidationError as exc:
        _die(describe_errors(exc, args.config))
    except (FileNotFoundError, ValueError) as exc:
        _die(f"invalid configuration: {exc}")


def _die(message: str) -> NoReturn:
    print(f"gateway: {message}", file=sys.stderr)
    raise SystemExit(2)


def _redact_url(url: str | None) -> str | None:
    """A URL with any user-info and query values masked (keys may hide in either)."""
    if not url:
        return url
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "<redacted>@" + netloc.rsplit("@", 1)[1]
    query = "&".join(
        f"{pair.split('=', 1)[0]}=<redacted>" if "=" in pair else pair
        for pair in parts.query.split("&")
        if pair
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redacted(settings: Settings) -> dict[str, Any]:
    data = settings.model_dump(mode="json", exclude={"credentials"})
    data["upstream_url"] = _redact_url(data.get("upstream_url"))
    for route in data.get("routes", []):
        route["upstream"] = _redact_url(route.get("upstream"))
    data["client_key_sha256"] = [f"<sha256 {h[:8]}…>" for h in settings.client_key_sha256]
    for route in data.get("routes", []):
        if route.get("credential_env"):
            route["credential"] = "<redacted>"
    data["effective_routes"] = [
        {
            "name": r.name,
            "prefix": r.prefix,
            "upstream": _redact_url(r.upstream),
            "credential": "<redacted>" if settings.credentials.get(r.name) else None,
        }
        for r in settings.effective_routes()
    ]
    return data


def _prepare_metrics_dir(settings: Settings) -> None:
    if settings.workers == 1 and settings.metrics_dir is None:
        return
    path = settings.metrics_dir or Path(tempfile.mkdtemp(prefix="gateway-metrics-"))
    path.mkdir(parents=True, exist_ok=True)
    # Empty it of a previous instance's metric files, and of nothing else: a
    # mistyped directory must not lose anybody's data.
    for stale in path.glob("*.db"):
        stale.unlink()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)


def serve(settings: Settings) -> None:
    import uvicorn

    _prepare_metrics_dir(settings)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    # httpx logs every request at INFO: the access log already has one line per request
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if (
        settings.host not in ("127.0.0.1", "::1", "localhost")
        and settings.credentials
        and not settings.client_key_sha256
    ):
        logging.getLogger("gateway").warning(
            "listening on %s with upstream credentials and no client keys: anyone who can "
            "reach this port spends those credentials (set client_key_sha256)",
            settings.host,
        )
    from gateway.edge import uvicorn_options

    common: dict[str, Any] = {
        **uvicorn_options(),
        "host": settings.host,
        "port": settings.port,
        "loop": "uvloop" if sys.platform != "win32" else "asyncio",
        "access_log": settings.uvicorn_access_log,
        "server_header": False,
        "log_level": settings.log_level,
        # The drain (lifecycle.py) runs before uvicorn's own shutdown starts, and
        # streams stopped by it flush their trailer within 5 s: uvicorn needs little.
        "timeout_graceful_shutdown": 5,
        "backlog": 4096,
    }
    if settings.workers > 1:
        export_for_workers(settings)
        uvicorn.run(
            "gateway.app:create_worker_app", factory=True, workers=settings.workers, **common
        )
        return
    from gateway.app import create_app

    uvicorn.run(create_app(settings), **common)


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "simulate":
        from gateway.simulator import serve as simulate

        simulate(args.host, args.port, default_tps=args.tps, default_tokens=args.tokens)
        return
    settings = _load(args)
    if args.command == "check-config":
        print(json.dumps(redacted(settings), indent=2, sort_keys=True))
        return
    serve(settings)


if __name__ == "__main__":
    main()
