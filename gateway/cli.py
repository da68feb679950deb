"""The command line: ``gateway serve``, ``simulate``, ``check-config``, ``probe``, ``replay``,
``keys`` (``gateway.keys.cli``).

Imports of the app (and so of prometheus_client) are deferred until the
multiprocess metrics directory is prepared, because prometheus-client picks
its storage when it is first imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import os
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError

from gateway import __version__, guard_build
from gateway.keys.cli import add_commands as add_key_commands
from gateway.keys.cli import run as run_keys
from gateway.logsetup import configure_logging, uvicorn_log_config
from gateway.redaction import redact_url, redacted
from gateway.settings import (
    Settings,
    describe_errors,
    export_for_workers,
    load_settings,
    setting_sources,
)

__all__ = ["main"]

log = logging.getLogger("gateway")


def _default(key: str) -> Any:
    """The default of a dotted settings key (``timeouts.idle``), read from the model."""
    model: Any = Settings
    *sections, leaf = key.split(".")
    for section in sections:
        model = model.model_fields[section].annotation
    return model.model_fields[leaf].default


def _seconds(key: str, meaning: str) -> dict[str, Any]:
    """A flag in seconds: its meaning, its default and the setting it sets."""
    return {
        "type": float,
        "metavar": "SECONDS",
        "help": f"{meaning} (default {_default(key):g}; the setting {key})",
    }


#: The flags of ``serve`` and ``check-config``: (settings key, flag, argparse options).
#: A dotted key sets one key of a section (pydantic-settings deep-merges sources).
_SETTING_FLAGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("config", "--config", {"metavar": "FILE", "help": "TOML config file (also GATEWAY_CONFIG)"}),
    (
        "upstream_url",
        "--upstream",
        {"metavar": "URL", "help": "upstream base URL, served under /v1"},
    ),
    (
        "simulator",
        "--simulator",
        {
            "action": "store_true",
            "default": None,
            "help": "front the built-in fake provider instead of an upstream (to try it out)",
        },
    ),
    ("host", "--host", {"metavar": "ADDRESS", "help": "listen address (default 127.0.0.1)"}),
    ("port", "--port", {"type": int, "help": "listen port (default 8080)"}),
    ("workers", "--workers", {"type": int, "metavar": "N", "help": "worker processes (default 1)"}),
    (
        "timeouts.connect",
        "--connect-timeout",
        _seconds("timeouts.connect", "longest wait for the TCP/TLS connection to an upstream"),
    ),
    (
        "timeouts.first_byte",
        "--first-byte-timeout",
        _seconds(
            "timeouts.first_byte",
            "longest wait from sending a request upstream to the first byte of its answer",
        ),
    ),
    (
        "timeouts.idle",
        "--idle-timeout",
        _seconds(
            "timeouts.idle",
            "longest silence between two chunks of a running answer (heartbeats count)",
        ),
    ),
    (
        "timeouts.total",
        "--total-timeout",
        _seconds("timeouts.total", "longest a whole request may take, first to last byte"),
    ),
    (
        "drain_timeout",
        "--drain-timeout",
        _seconds(
            "drain_timeout",
            "how long in-flight streams may go on after SIGTERM or Ctrl-C, before they are "
            "ended with gateway_shutdown",
        ),
    ),
    (
        "metrics_dir",
        "--metrics-dir",
        {
            "metavar": "DIR",
            "help": "prometheus multiprocess directory (default: a new temporary one when "
            "--workers is above 1)",
        },
    ),
)

#: The settings flags ``probe`` takes (where the routes are, and their deadlines).
_PROBE_SETTINGS = frozenset(
    {
        "config",
        "upstream_url",
        "simulator",
        "timeouts.connect",
        "timeouts.first_byte",
        "timeouts.idle",
        "timeouts.total",
    }
)

_DESCRIPTION = (
    "An LLM streaming gateway: a reverse proxy that checks every streamed answer "
    "ended properly, tells the client, and records it."
)


def _simulate_epilog() -> str:
    """The faults and knobs of the simulator, from its own tables."""
    from gateway.simulator._knobs import FAULTS, Knobs, knob_header

    names = [f.name for f in dataclasses.fields(Knobs) if f.name != "fault"]
    wrap = functools.partial(
        textwrap.fill, width=78, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False
    )
    return "\n".join(
        [
            f"faults (one per request: the header '{knob_header('fault')}: NAME', or the",
            'body field "sim": {"fault": "NAME"}; "none", the default, is a complete stream):',
            wrap(", ".join(FAULTS)),
            "",
            "other knobs, as headers:",
            wrap(", ".join(knob_header(name) for name in names)),
            'or as fields of the body\'s "sim" object:',
            wrap(", ".join(names)),
            "",
            "GET /_sim/faults lists the faults; docs/simulator.md describes each.",
        ]
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"gateway {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        for key, flag, options in _SETTING_FLAGS:
            p.add_argument(flag, dest=key, **options)

    serve = sub.add_parser(
        "serve",
        help="run the gateway",
        description="Run the gateway in front of the configured upstream(s), "
        "or in front of the built-in fake provider with --simulator.",
    )
    common(serve)
    check = sub.add_parser(
        "check-config",
        help="print the effective configuration, redacted",
        description="Load the configuration as serve would; print it with secrets "
        "redacted (exit 0), or say what is wrong (exit 2).",
    )
    common(check)
    probe = sub.add_parser(
        "probe",
        help="check the configured routes: the route acceptance matrix",
        description="Send fixed, short, harmless requests through an in-process gateway "
        "(the configured routes, on a free loopback port) and print what the gateway "
        "recorded of each: one row per route, model and check. Exit 0 when every check "
        "holds, 1 when one fails, 2 on a configuration error.",
    )
    for key, flag, options in _SETTING_FLAGS:
        if key in _PROBE_SETTINGS:
            probe.add_argument(flag, dest=key, **options)
    many: dict[str, Any] = {"action": "extend", "nargs": "+", "default": []}
    probe.add_argument(
        "--route", dest="probe_routes", metavar="NAME", help="only these routes", **many
    )
    probe.add_argument(
        "--model",
        dest="probe_models",
        metavar="M",
        help="the models to probe (required; sim-model with --simulator)",
        **many,
    )
    probe.add_argument(
        "--protocol",
        dest="probe_protocols",
        metavar="P",
        help="protocols for routes with protocol auto",
        **many,
    )
    probe.add_argument(
        "--check",
        dest="probe_checks",
        metavar="C",
        help="only these checks (default: all the protocol has; an unknown name is "
        "refused with the list of checks)",
        **many,
    )
    probe.add_argument("--json", metavar="FILE", help="write the matrix as JSON")
    probe.add_argument("--markdown", metavar="FILE", help="write the matrix as Markdown")
    probe.add_argument("--dry-run", action="store_true", help="print the requests, send nothing")
    probe.add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS", help="per check (default 60)"
    )
    probe.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="CHECK:x-sim-NAME=VALUE",
        help="testing aid: add a simulator knob header to one check's requests",
    )
    replay = sub.add_parser(
        "replay",
        help="feed capture files through the guard and print the verdicts",
        description="Feed each capture through the guard with its original chunk "
        "boundaries; print the replayed and the recorded verdict. Exit 0 when every "
        "file replays to its recorded verdict, 1 when one does not, 2 when a file is "
        "no capture.",
    )
    replay.add_argument("files", nargs="+", metavar="FILE")
    keys = sub.add_parser(
        "keys",
        help="issue, list, show, rotate and revoke client keys",
        description="Change the keys issued at run time, in the shared store "
        '(keys.store = "redis") the configuration names; every gateway on it agrees '
        "within a second. Prints JSON; a secret once.",
    )
    common(keys)
    add_key_commands(keys)
    from gateway.simulator.__main__ import add_arguments as add_simulator_arguments

    sim = sub.add_parser(
        "simulate",
        help="run the built-in fake provider",
        description="Run the built-in fake OpenAI/Anthropic-compatible provider,\n"
        "with scripted faults.",
        epilog=_simulate_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_simulator_arguments(sim)
    return parser


def _overrides(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings given as flags, and which flag gave each (for error messages)."""
    overrides: dict[str, Any] = {}
    flags: dict[str, str] = {}
    given = vars(args)
    for key, flag, _ in _SETTING_FLAGS:
        value = given.get(key)
        if value is None:
            continue
        *sections, leaf = key.split(".")
        target = overrides
        for section in sections:
            target = target.setdefault(section, {})
        target[leaf] = value
        flags[key] = flag
    return overrides, flags


def _load(args: argparse.Namespace) -> Settings:
    overrides, flags = _overrides(args)
    try:
        return load_settings(**overrides)
    except ValidationError as exc:
        _die(describe_errors(exc, overrides.get("config"), flags))
    except (FileNotFoundError, ValueError) as exc:
        _die(f"invalid configuration: {exc}")


def _print_sources(args: argparse.Namespace) -> None:
    """``check-config``'s account, on stderr, of where each value came from."""
    overrides, flags = _overrides(args)
    sources = setting_sources(overrides.get("config"), flags)
    print("gateway: where each value came from (any other key: its default):", file=sys.stderr)
    for key, source in sources.items():
        print(f"  {key}: {source}", file=sys.stderr)


def _die(message: str) -> NoReturn:
    print(f"gateway: {message}", file=sys.stderr)
    raise SystemExit(2)


def _base(url: str) -> str:
    """An upstream's base URL as the start-up lines show it: its path kept (requests go
    below it), user-info and query values masked as in ``check-config``."""
    parts = urlsplit(redact_url(url) or "")
    return urlunsplit((parts.scheme, parts.netloc, parts.path, parts.query, ""))


def _warn_pathless(route: str, prefix: str, urls: list[str]) -> None:
    """A ``/v1`` route in front of a base URL with no path: every request gets a 404.

    The path below the prefix is appended to the base URL, so ``/v1/chat/completions``
    in front of ``http://host:11434`` goes to ``http://host:11434/chat/completions``.
    """
    if not prefix.rstrip("/").endswith("/v1"):
        return
    for url in urls:
        if urlsplit(url).path.strip("/") == "":
            log.warning(
                "route %s: %s fronts %s, a base URL with no path: %s/chat/completions goes to "
                "%s/chat/completions (OpenAI-compatible servers answer under /v1: did you mean "
                "%s/v1?)",
                route,
                prefix,
                _base(url),
                prefix.rstrip("/"),
                _base(url).rstrip("/"),
                _base(url).rstrip("/"),
            )


def _prepare_metrics_dir(settings: Settings) -> None:
    if settings.workers == 1 and settings.metrics_dir is None:
        return
    # Settings checked that the directory can be written; this can still fail
    # (a race, a full disk): an error message then, never a traceback.
    try:
        path = settings.metrics_dir or Path(tempfile.mkdtemp(prefix="gateway-metrics-"))
        path.mkdir(parents=True, exist_ok=True)
        # Empty it of a previous instance's metric files, and of nothing else: a
        # mistyped directory must not lose anybody's data.
        for stale in path.glob("*.db"):
            stale.unlink()
        for stale in path.glob("gateway-status-*.json"):  # the status page's shares
            stale.unlink()
    except OSError as exc:
        _die(f"metrics_dir {settings.metrics_dir or '(a new temporary directory)'}: {exc}")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)


def _log_start(settings: Settings) -> None:
    """What an operator should see at start: each route, and risky settings."""
    if guard_build() == "python":
        log.info(
            "guard: pure Python (it behaves the same at about twice the CPU per event; "
            "`make compiled-guard` compiles it where there is a C compiler)"
        )
    for route in settings.effective_routes():
        if route.upstreams:
            pool = ", ".join(f"{u.name} {_base(u.url)}" for u in route.upstreams)
            log.info(
                "route %s: %s -> %s (protocol %s, max_attempts %d, retry_on %s)",
                route.name,
                route.prefix,
                pool,
                route.protocol,
                route.max_attempts,
                ",".join(route.retry_on) or "nothing",
            )
            _warn_pathless(route.name, route.prefix, [u.url for u in route.upstreams])
            continue
        log.info(
            "route %s: %s -> %s (protocol %s)",
            route.name,
            route.prefix,
            _base(route.upstream or ""),
            route.protocol,
        )
        _warn_pathless(route.name, route.prefix, [route.upstream or ""])
    if not settings.annotate:
        log.warning(
            "annotate = false: a stream the upstream cut ends without an error event, so "
            "clients take a partial answer for a whole one (the verdict is only in the "
            "metrics and the access log)"
        )
    if (
        settings.host not in ("127.0.0.1", "::1", "localhost")
        and settings.credentials
        and not settings.client_key_sha256
    ):
        log.warning(
            "listening on %s with upstream credentials and no client keys: anyone who can "
            "reach this port spends those credentials (set client_key_sha256)",
            settings.host,
        )


def _check_redis(settings: Settings, *, wait_standalone: bool) -> str | None:
    """Ask the configured Redis once, bounded: the mode and the nodes found, or exit with
    the reason. A standalone server that does not answer yet is waited for (when
    ``wait_standalone``): the limits and the store say so and go on without it."""
    target = settings.redis_target()
    if target is None:
        return None
    import asyncio

    from gateway.redisconn.check import RedisUnusable, inspect

    try:
        return asyncio.run(inspect(target))
    except RedisUnusable as exc:
        if wait_standalone and target.mode == "standalone" and exc.unreachable:
            log.warning("%s: the gateway starts and waits for it", exc)
            return None
        _die(f"redis ({target.mode}): {exc}")


def serve(settings: Settings) -> None:
    import uvicorn

    _prepare_metrics_dir(settings)
    configure_logging(settings.log_level, settings.log_format)
    _log_start(settings)
    from gateway.server.memory import return_large_buffers

    return_large_buffers()
    found = _check_redis(settings, wait_standalone=True)
    if found is not None:
        log.info("%s", found)
    from gateway.server.edge import uvicorn_options

    common: dict[str, Any] = {
        **uvicorn_options(),
        "host": settings.host,
        "port": settings.port,
        "loop": "uvloop" if sys.platform != "win32" else "asyncio",
        "access_log": settings.uvicorn_access_log,
        "server_header": False,
        # The gateway decides whose X-Forwarded-* to believe (trusted_proxies, headers.py);
        # uvicorn's own rewriting would let a client on 127.0.0.1 replace its address.
        "proxy_headers": False,
        "log_level": settings.log_level,
        "log_config": uvicorn_log_config(settings.log_level, settings.log_format),
        # The drain (lifecycle.py) runs before uvicorn's own shutdown starts, and
        # streams stopped by it flush their trailer within 5 s: uvicorn needs little.
        "timeout_graceful_shutdown": 5,
        "backlog": 4096,
    }
    if settings.workers > 1:
        from gateway.server.supervisor import run_workers

        export_for_workers(settings)
        # uvicorn.run's own path for workers, with a supervisor that takes a killed
        # worker's live gauges out of the metrics (uvicorn's has no hook for it).
        signum = run_workers(
            uvicorn.Config(
                "gateway.app:create_worker_app", factory=True, workers=settings.workers, **common
            )
        )
        _exit_after(signum)
        return
    from gateway.app import create_app
    from gateway.server.signals import stopped_by

    uvicorn.run(create_app(settings), **common)
    _exit_after(stopped_by())


def _exit_after(signum: int | None) -> None:
    """Exit 130 once a Ctrl-C (SIGINT) stopped the server, as a shell expects; return (exit
    0) after SIGTERM or none."""
    from gateway.server.signals import exit_status

    status = exit_status(signum)
    if status:
        raise SystemExit(status)


def probe(args: argparse.Namespace, settings: Settings) -> int:
    """``gateway probe``: the exit status (0 all hold, 1 one failed; 2 exits earlier)."""
    from gateway.probe import ProbeConfigError, dry_run, make_plan, run_plan

    try:
        plan = make_plan(
            settings,
            routes=args.probe_routes,
            models=args.probe_models,
            protocols=args.probe_protocols,
            checks=args.probe_checks,
            inject=args.inject,
        )
    except ProbeConfigError as exc:
        _die(f"probe: {exc}")
    if args.timeout <= 0:
        _die("probe: --timeout must be positive")
    if args.dry_run:
        print(dry_run(plan))
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    matrix = _run_async(run_plan(settings, plan, check_seconds=args.timeout))
    print(matrix.table(), end="")
    try:
        if args.json:
            Path(args.json).write_text(matrix.dumps())
        if args.markdown:
            Path(args.markdown).write_text(matrix.markdown())
    except OSError as exc:
        _die(f"probe: cannot write the report: {exc}")
    return 0 if matrix.passed else 1


def _run_async(coroutine: Any) -> Any:
    """Run on uvloop where there is one, as ``serve`` does."""
    import asyncio

    factory = None
    if sys.platform != "win32":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coroutine)


def replay(files: list[str]) -> int:
    """``gateway replay``: one line per file; the exit status."""
    from gateway.capture import CaptureError, load
    from gateway.capture import replay as replay_capture

    worst = 0
    for name in files:
        try:
            capture = load(Path(name))
            result = replay_capture(capture)
        except CaptureError as exc:
            print(f"gateway: replay: {exc}", file=sys.stderr)
            worst = 2
            continue
        replayed = "/".join(result.replayed) if result.replayed else "no verdict"
        recorded = "/".join(result.recorded)
        print(
            f"{name}: {result.result}: replayed {replayed}, recorded {recorded} "
            f"({capture.protocol}, route {capture.route}, {result.chunks} chunks, "
            f"{result.bytes} bytes, ending {capture.ending}"
            + (", truncated" if capture.truncated else "")
            + ")"
        )
        if result.result != "same":
            worst = max(worst, 1)
    return worst


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "simulate":
        from gateway.simulator.__main__ import run as simulate

        try:
            simulate(args)
        except ValueError as exc:
            _die(str(exc))
        return
    if args.command == "replay":
        raise SystemExit(replay(args.files))
    settings = _load(args)
    if args.command == "check-config":
        print(json.dumps(redacted(settings), indent=2, sort_keys=True))
        _print_sources(args)
        found = _check_redis(settings, wait_standalone=False)
        if found is not None:
            print(f"gateway: {found}", file=sys.stderr)
        return
    if args.command == "probe":
        raise SystemExit(probe(args, settings))
    if args.command == "keys":
        configure_logging(settings.log_level, settings.log_format)
        raise SystemExit(run_keys(settings, args))
    serve(settings)


if __name__ == "__main__":
    main()
