"""WebSocket benchmark: Responses over WebSocket through the gateway, a naive relay, direct.

Run it as a script (it is not a pytest test)::

    .venv/bin/python tests/perf/bench_websocket.py --repeat 3    # 50 streams x 150 events
    .venv/bin/python tests/perf/bench_websocket.py --quick       # 20 streams, ~15 s
    .venv/bin/python tests/perf/bench_websocket.py --streams 200

The same paced token streams as bench_gateway.py's scenarios 1 and 2 (150 events
at 50 events/s per stream, all streams at once), over the Responses API's
WebSocket mode: each stream is one connection and one ``response.create``. The
default is 50 streams: the ``websockets`` load generator is Python, and on one
core of a shared 2-core machine 200 streams (10,000 events/s) saturate it even
with no proxy in the way (``direct`` p99 over a second), which measures the
harness, not the proxy.

* **upstream** and **load generator**: this process, one uvloop event loop,
  pinned to CPU 0. The upstream is a ``websockets`` server that answers
  ``response.create`` with ``response.created``, an output item, N
  ``response.output_text.delta`` events stamped with ``time.monotonic_ns()`` in a
  ``"ts"`` field, the item's done event and ``response.completed`` with usage,
  paced per stream. The load generator is ``websockets`` clients; an event's
  latency is its receive time minus its stamp. A stream that does not end with
  ``response.completed`` after all its events is a failure.
* **targets**, each its own process pinned to CPU 1, started fresh and warmed
  up: ``direct`` (no proxy), ``naive`` (``ws_naive_relay.py``: Starlette +
  uvicorn's websockets-sansio + the ``websockets`` client, relaying text as it
  comes, nothing else) and ``gateway`` (``python -m gateway serve`` as shipped:
  guard, metrics, access log to a file).

Reported per target: streams that failed, CPU per event of the proxy process
(user + system time over the run, from ``/proc``, divided by the events
relayed), and event latency percentiles, with what the proxy adds over
``direct`` at the same percentile. On a shared, loaded machine these numbers
move from run to run: compare the targets of one run, and repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import uvloop
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

ROOT = Path(__file__).resolve().parents[2]
HARNESS_CPU = 0
PROXY_CPU = 1
TICKS = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ----------------------------------------------------------------------------- upstream


def _event(kind: str, seq: int, **fields: object) -> str:
    return json.dumps({"type": kind, "sequence_number": seq, **fields}, separators=(",", ":"))


async def _answer(ws: ServerConnection, events: int, rate: float) -> None:
    rid = f"resp_{id(ws)}"
    seq = 0
    await ws.send(_event("response.created", seq, response={"id": rid, "model": "bench"}))
    item = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    seq += 1
    await ws.send(_event("response.output_item.added", seq, output_index=0, item=item))
    start = time.monotonic()
    for i in range(events):
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        seq += 1
        await ws.send(
            _event(
                "response.output_text.delta",
                seq,
                item_id="msg_1",
                output_index=0,
                content_index=0,
                delta=" token",
                ts=time.monotonic_ns(),
            )
        )
    seq += 1
    await ws.send(_event("response.output_item.done", seq, output_index=0, item=item))
    usage = {"input_tokens": 5, "output_tokens": events, "total_tokens": events + 5}
    response = {"id": rid, "model": "bench", "status": "completed", "output": [], "usage": usage}
    seq += 1
    await ws.send(_event("response.completed", seq, response=response))


async def _upstream(ws: ServerConnection) -> None:
    with contextlib.suppress(Exception):
        async for message in ws:
            body = json.loads(message)
            await _answer(ws, int(body.get("n", 150)), float(body.get("rate", 50)))


# ------------------------------------------------------------------------- load generator


@dataclass
class Result:
    latencies: list[int] = field(default_factory=list)  # ns
    events: int = 0
    failed: int = 0


async def _stream(url: str, events: int, rate: float, result: Result) -> None:
    try:
        async with connect(url, max_size=None, compression=None, proxy=None) as ws:
            await ws.send(
                json.dumps(
                    {
                        "type": "response.create",
                        "model": "bench",
                        "input": "hi",
                        "n": events,
                        "rate": rate,
                    }
                )
            )
            seen = 0
            async for message in ws:
                now = time.monotonic_ns()
                obj = json.loads(message)
                kind = obj["type"]
                if kind == "response.output_text.delta":
                    result.latencies.append(now - obj["ts"])
                    seen += 1
                elif kind == "response.completed":
                    break
                elif kind == "error":
                    raise RuntimeError(obj)
            if seen != events:
                raise RuntimeError(f"{seen} of {events} events")
            result.events += seen
    except Exception:
        result.failed += 1


async def _run(url: str, streams: int, events: int, rate: float) -> Result:
    result = Result()
    await asyncio.gather(*(_stream(url, events, rate, result) for _ in range(streams)))
    return result


# ------------------------------------------------------------------------------ targets


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def _start(target: str, upstream_port: int, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["PYTHONPATH"] = str(ROOT)
    if target == "gateway":
        args = [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--port",
            str(port),
            "--upstream",
            f"http://127.0.0.1:{upstream_port}/v1",
        ]
        env["GATEWAY_LIMITS__MAX_CONCURRENT_STREAMS"] = "100000"
    else:
        args = [
            sys.executable,
            str(ROOT / "tests/perf/ws_naive_relay.py"),
            "--upstream-port",
            str(upstream_port),
            "--port",
            str(port),
        ]
    out = log.open("wb")
    proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    with contextlib.suppress(OSError):
        os.sched_setaffinity(proc.pid, {PROXY_CPU})
    return proc, port


async def _wait_ready(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            async with connect(f"ws://127.0.0.1:{port}/v1/responses", proxy=None):
                return
        except Exception:
            await asyncio.sleep(0.2)
    raise RuntimeError("target did not start")


async def _measure(
    target: str, args: argparse.Namespace, upstream_port: int, tmp: Path
) -> tuple[Result, float | None]:
    if target == "direct":
        url = f"ws://127.0.0.1:{upstream_port}/v1/responses"
        await _run(url, 5, 5, 1000)
        return await _run(url, args.streams, args.events, args.rate), None
    proc, port = _start(target, upstream_port, tmp / f"{target}.log")
    try:
        await _wait_ready(port)
        url = f"ws://127.0.0.1:{port}/v1/responses"
        await _run(url, 5, 5, 1000)  # warm up
        before = _cpu_seconds(proc.pid)
        result = await _run(url, args.streams, args.events, args.rate)
        cpu = _cpu_seconds(proc.pid) - before
        return result, cpu
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=15)
        if proc.poll() is None:
            proc.kill()


def _pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6 if ordered else float("nan")


async def _main(args: argparse.Namespace) -> None:
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {HARNESS_CPU})
    upstream_port = _free_port()
    targets = args.targets.split(",")
    rows: dict[str, list[tuple[Result, float | None]]] = {t: [] for t in targets}
    async with serve(_upstream, "127.0.0.1", upstream_port, compression=None, max_size=None):
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.repeat):
                for target in targets:
                    rows[target].append(await _measure(target, args, upstream_port, Path(tmp)))
    print(
        f"{args.streams} streams x {args.events} events at {args.rate}/s over WebSocket, "
        f"{args.repeat} run(s), medians; load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'target':<9} {'failed':>6} {'CPU us/event':>12} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'+p50 ms':>8} {'+p99 ms':>8}"
    )
    base: tuple[float, float] | None = None
    for target in targets:
        runs = rows[target]
        failed = max(r.failed for r, _ in runs)
        cpus = [cpu / max(r.events, 1) * 1e6 for r, cpu in runs if cpu is not None]
        p50 = statistics.median(_pct(r.latencies, 0.50) for r, _ in runs)
        p99 = statistics.median(_pct(r.latencies, 0.99) for r, _ in runs)
        if target == "direct":
            base = (p50, p99)
        cpu_text = f"{statistics.median(cpus):12.1f}" if cpus else f"{'-':>12}"
        added = (
            f"{p50 - base[0]:8.2f} {p99 - base[1]:8.2f}"
            if base and target != "direct"
            else f"{'-':>8} {'-':>8}"
        )
        print(f"{target:<9} {failed:>6} {cpu_text} {p50:8.2f} {p99:8.2f} {added}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--events", type=int, default=150)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--targets", default="direct,naive,gateway")
    parser.add_argument("--quick", action="store_true", help="20 streams")
    args = parser.parse_args()
    if args.quick:
        args.streams = 20
    uvloop.run(_main(args))


if __name__ == "__main__":
    main()
