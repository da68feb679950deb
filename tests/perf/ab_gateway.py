"""Same-core A/B: two builds of the gateway at once on one CPU, CPU per request of each.

On a machine that other work loads, absolute numbers drift by tens of
percent from one minute to the next; two versions measured at the same
time on the same core see the same disturbance, so their ratio holds
(noise about +-2 %). Run it as a script::

    git archive <base-commit> | tar -x -C /tmp/gw-base     # version A, any source tree
    .venv/bin/python tests/perf/ab_gateway.py --base /tmp/gw-base --mode stream
    .venv/bin/python tests/perf/ab_gateway.py --base /tmp/gw-base --mode json --rounds 5

Version B is this tree (``--base .`` with ``--a-env`` and ``--b-env``: this tree
in two configurations, e.g. money budgets off and on); version A may also be one
of the yardstick relays (``--base minimal-raw`` or ``--base minimal``), to see which of the same
library calls cost the gateway more than a naive relay. Each round starts both
fresh (a gateway as shipped, ``python -m gateway serve``: guard, metrics,
access log to a file), pinned to
the same CPU (``--cpu``, default 1; the harness and the upstream have CPU 0),
warms both up, then drives both at once, ``--conns`` keep-alive connections
each, for ``--seconds``: 5-event short streams (``stream``, scenario 4's
load) or plain JSON requests of about 1 KiB each way (``json``, scenario 8's).
It prints each round's CPU per request of A and B and the ratio B/A, then
the median ratio; ``--profile FILE`` samples both with py-spy in the last
round and prints their top functions in microseconds of CPU a request. Every request
is verified as in ``bench_gateway.py``; a failure fails the run (exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import statistics
import sys
import tempfile
from pathlib import Path

import bench_gateway as bg
import litellm_peer


def _query(mode: str, events: int = 5) -> tuple[str, int]:
    """The upstream query and what a client checks (events, or -body bytes)."""
    if mode == "json":
        query = f"mode=json&size={bg.JSON_BYTES}"
        return query, -len(bg._json_body_of(query))
    return f"mode=burst&n={events}", events


async def _round(
    upstream: bg.Upstream,
    trees: dict[str, Path | str],
    opts: argparse.Namespace,
    workdir: Path,
    profile: Path | None = None,
) -> dict[str, dict[str, float]]:
    query, expected = _query(opts.mode, opts.events)
    proxies: dict[str, bg.GatewayProxy] = {}
    try:
        for label, tree in trees.items():
            proxy: bg.GatewayProxy
            if isinstance(tree, str):  # a yardstick relay (FloorProxy's), not a tree
                proxy = bg.FloorProxy(upstream.port, workdir, [], {}, tree)
            else:
                url = f"http://127.0.0.1:{upstream.port}/v1"
                pairs = opts.b_env if label == "B" else opts.a_env
                env = {k: v.replace("{upstream}", url) for k, v in pairs}
                proxy = bg.GatewayProxy(upstream.port, workdir, [], env, label)
                proxy.tree = tree
            proxy.cpus = {opts.cpu}
            proxy.start()
            proxies[label] = proxy
        for label, proxy in proxies.items():
            await proxy.wait_ready()
            gateway = not isinstance(trees[label], str)  # a floor has no annotation
            await bg.warm_up(proxy.port, gateway)
            warm = bg.Tally(gateway=gateway, keep_latency=False)
            await bg.drive_keepalive(proxy.port, warm, 8, 1.0, query, expected, opts.unique)
            if warm.failed:
                raise RuntimeError(f"{proxy.name}: warm-up failed: {dict(warm.failures)}")
        tallies = {
            label: bg.Tally(gateway=not isinstance(trees[label], str), keep_latency=False)
            for label in proxies
        }
        gc.collect()
        gc.disable()
        cpu0 = {label: proxy.cpu_seconds() for label, proxy in proxies.items()}
        spies = []
        if profile is not None:
            spies = [
                bg.start_py_spy(
                    proxy.main_pid(),
                    _profile_path(profile, label),
                    "raw",
                    opts.rate,
                    int(opts.seconds),
                    [],
                )
                for label, proxy in proxies.items()
            ]
        try:
            await asyncio.gather(
                *(
                    bg.drive_keepalive(
                        proxy.port,
                        tallies[label],
                        opts.conns,
                        opts.seconds,
                        query,
                        expected,
                        opts.unique,
                    )
                    for label, proxy in proxies.items()
                )
            )
        finally:
            gc.enable()
            for spy in spies:
                bg.stop_py_spy(spy)
        await asyncio.sleep(0.3)  # the access log's flush, the metrics
        out: dict[str, dict[str, float]] = {}
        for label, proxy in proxies.items():
            tally = tallies[label]
            cpu = proxy.cpu_seconds() - cpu0[label]
            out[label] = {
                "ok": tally.ok,
                "failed": tally.failed,
                "cpu_us_per_request": cpu / tally.ok * 1e6 if tally.ok else float("nan"),
            }
            if tally.failed:
                out[label]["failures"] = dict(tally.failures)  # type: ignore[assignment]
        return out
    finally:
        for proxy in proxies.values():
            proxy.stop()


async def main_async(opts: argparse.Namespace, base: Path | str) -> int:
    trees: dict[str, Path | str] = {"A": base, "B": bg.ROOT}
    upstream = bg.Upstream(asyncio.get_running_loop())
    await upstream.start()
    ratios: list[float] = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="ab-gateway-") as tmp:
        for n in range(opts.rounds):
            # Alternate which one starts first: nothing of the order may favour one.
            order = dict(reversed(trees.items())) if n % 2 else trees
            last = n == opts.rounds - 1
            profile = Path(opts.profile) if opts.profile and last else None
            result = await _round(upstream, order, opts, Path(tmp), profile)
            a, b = result["A"], result["B"]
            ratio = b["cpu_us_per_request"] / a["cpu_us_per_request"]
            ratios.append(ratio)
            failed = failed or bool(a["failed"] or b["failed"])
            print(
                f"round {n + 1}: A {a['cpu_us_per_request']:.0f} us/req ({a['ok']:.0f} ok, "
                f"{a['failed']:.0f} failed)  B {b['cpu_us_per_request']:.0f} us/req "
                f"({b['ok']:.0f} ok, {b['failed']:.0f} failed)  B/A x{ratio:.3f}",
                flush=True,
            )
            for label in ("A", "B"):
                if result[label].get("failures"):
                    print(f"  {label} failures: {result[label]['failures']}")
            if profile is not None:
                for label in ("A", "B"):
                    cpu_us = result[label]["cpu_us_per_request"]
                    print(render_profile(_profile_path(profile, label), label, cpu_us, opts.top))
    print(
        f"{opts.mode}: CPU per request B/A median x{statistics.median(ratios):.3f} "
        f"[{min(ratios):.3f}-{max(ratios):.3f}] over {len(ratios)} rounds"
    )
    return 1 if failed else 0


def named_client(limits: dict[str, object]) -> str:
    """``GATEWAY_CLIENTS`` making the bench's key one named client, ``bench``, with
    ``limits`` (for a configuration given with ``--a-env`` / ``--b-env``)."""
    digest = hashlib.sha256(litellm_peer.MASTER_KEY.encode()).hexdigest()
    return json.dumps([{"name": "bench", "key_sha256": [digest], "limits": limits}])


def _profile_path(profile: Path, label: str) -> Path:
    return profile.with_name(f"{profile.stem}-{label}{profile.suffix}")


def render_profile(raw: Path, label: str, cpu_us: float, top: int) -> str:
    """A py-spy profile as microseconds of CPU a request: each function's share of the
    samples (self, then inclusive) times that version's CPU per request in the round."""
    summary = bg.summarize_profile(raw, top)
    lines = [f"{label}'s profile: {summary['samples']} samples, {cpu_us:.0f} us of CPU a request"]
    lines.append(f"  top {top} by self time (us a request, % of samples):")
    lines += [f"    {p * cpu_us / 100:7.1f}  {p:5.1f}%  {k}" for k, p in summary["self"]]
    lines.append(f"  top {top} by inclusive time:")
    lines += [f"    {p * cpu_us / 100:7.1f}  {p:5.1f}%  {k}" for k, p in summary["inclusive"][:top]]
    lines.append("  self time by component:")
    lines += [
        f"    {p * cpu_us / 100:7.1f}  {p:5.1f}%  {k}" for k, p in summary["self_by_component"]
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base",
        required=True,
        help="source tree of version A, or a yardstick relay: minimal, minimal-raw",
    )
    parser.add_argument("--mode", choices=("stream", "json"), default="stream")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=5, help="events per stream (stream mode)")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--conns", type=int, default=32, help="connections per version")
    parser.add_argument(
        "--unique",
        action="store_true",
        help="every request a target of its own (a cache that is on misses every time)",
    )
    parser.add_argument(
        "--profile",
        default="",
        metavar="FILE",
        help="py-spy A and B in the last round (raw stacks in FILE-A, FILE-B)",
    )
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=25, help="functions in the profile's lists")
    parser.add_argument("--cpu", type=int, default=bg.PROXY_CPU, help="the CPU both run on")
    parser.add_argument(
        "--b-env",
        action="append",
        default=[],
        type=lambda text: tuple(text.split("=", 1)),
        metavar="NAME=value",
        help="environment of version B only, {upstream} standing for the upstream's URL "
        "(e.g. GATEWAY_ROUTES with resume on)",
    )
    parser.add_argument(
        "--a-env",
        action="append",
        default=[],
        type=lambda text: tuple(text.split("=", 1)),
        metavar="NAME=value",
        help="environment of version A only (with --base . : one tree, two configurations)",
    )
    opts = parser.parse_args(argv)
    base: Path | str = opts.base
    if opts.base not in bg.FloorProxy.SCRIPTS:
        base = Path(opts.base).resolve()
        if not (base / "gateway" / "__init__.py").exists():
            print(f"{base} is not a source tree of the gateway", file=sys.stderr)
            return 2
    bg._pin(bg.HARNESS_CPU)()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(main_async(opts, base))


if __name__ == "__main__":
    sys.exit(main())
