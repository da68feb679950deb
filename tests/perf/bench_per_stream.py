"""What the gateway's own work costs per short stream, piece by piece (microbenchmarks).

Scenario 4 of bench_gateway.py streams a role chunk, three tokens, a finish
chunk and ``[DONE]``. This script times, in-process and without I/O, the pieces of the
gateway's per-stream work that a bare ASGI relay does not do, so that the
"Can the targets be met?" reasoning in docs/performance.md rests on numbers:

    .venv/bin/python tests/perf/bench_per_stream.py

Each figure is the median of seven rounds, in microseconds per stream; the
process pins itself to one CPU (the last) to keep the rounds comparable.
"""

from __future__ import annotations

import asyncio
import io
import os
import statistics
import time
from collections.abc import Callable

import httpx
import uvloop
from bench_gateway import _FINISH, _ROLE, _TOKEN

from gateway.guard import ChatContract, SSEDecoder, StreamGuard
from gateway.observe import AccessLog, Metrics, RequestRecord
from gateway.proxy.upstream import Upstream

ROUNDS = 7
N = 10_000


def block(event: tuple[bytes, bytes]) -> bytes:
    """One of bench_gateway's events (the same bytes its upstream sends), stamped."""
    pre, post = event
    return pre + b"%d" % time.monotonic_ns() + post


# Scenario 4's stream (``mode=burst&n=5``): the role chunk, three tokens, the finish
# chunk and [DONE], six blocks, the very bytes bench_gateway's upstream sends.
EVENTS = [block(_ROLE), *(block(_TOKEN) for _ in range(3)), block(_FINISH), b"data: [DONE]\n\n"]
BODY = b"".join(EVENTS)


def median_us(fn: Callable[[], object], n: int = N) -> float:
    rounds = []
    for _ in range(ROUNDS):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(rounds)


def guard_one_chunk() -> None:
    guard = StreamGuard(ChatContract(), SSEDecoder())
    guard.feed(BODY)
    guard.annotation("req-1")


def guard_per_event() -> None:
    guard = StreamGuard(ChatContract(), SSEDecoder())
    for event in EVENTS:
        guard.feed(event)
    guard.annotation("req-1")


UPSTREAM = Upstream(httpx.AsyncHTTPTransport(), 5.0)
REQUEST_HEADERS = [
    (b"content-type", b"application/json"),
    (b"x-request-id", b"0123456789abcdef"),
    (b"accept-encoding", b"identity"),
    (b"x-forwarded-for", b"127.0.0.1"),
    (b"x-forwarded-proto", b"http"),
]
RESPONSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"transfer-encoding", b"chunked"),
    (b"x-request-id", b"up-1"),
]
URL = "http://127.0.0.1:8000/v1/chat/completions?mode=burst&n=5"


def httpx_objects() -> None:
    request = UPSTREAM.request("POST", URL, REQUEST_HEADERS, b'{"model":"m","stream":true}')
    httpx.Response(200, headers=RESPONSE_HEADERS, stream=httpx.ByteStream(b""), request=request)


METRICS = Metrics()
ACCESS_LOG = AccessLog(stream=io.StringIO())
FINISHED = StreamGuard(ChatContract())
FINISHED.feed(BODY)


def metrics_and_log() -> None:
    record = RequestRecord(
        request_id="0123456789abcdef",
        route="default",
        method="POST",
        path="/v1/chat/completions",
        started=time.monotonic(),
    )
    record.model = record.model_label = "m"
    record.stream = True
    record.status = 200
    record.time_to_first_byte = record.time_to_first_token = 0.001
    record.chunk_gaps.extend([0.0001] * 5)
    record.verdict = FINISHED.verdict
    record.duration = 0.002
    METRICS.stream_started("default")
    METRICS.stream_ended("default")
    METRICS.observe(record)
    ACCESS_LOG.write(record)
    ACCESS_LOG._lines.clear()  # never flushed: the write() to the file is not timed


async def loop_costs() -> dict[str, float]:
    loop = asyncio.get_running_loop()
    never = asyncio.Event()

    async def watch() -> None:
        await never.wait()

    async def timed(body: Callable[[], object]) -> float:
        rounds = []
        for _ in range(ROUNDS):
            t = time.perf_counter()
            for _ in range(N):
                await body()  # type: ignore[misc]
            rounds.append((time.perf_counter() - t) / N * 1e6)
        return statistics.median(rounds)

    async def with_watcher() -> None:
        task = loop.create_task(watch())
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.sleep(0)

    async def two_turns() -> None:
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    async def one_timeout() -> None:
        async with asyncio.timeout(5):  # noqa: ASYNC100 (its enter and exit are what is timed)
            pass

    watcher = await timed(with_watcher) - await timed(two_turns)
    return {"watcher": watcher, "timeout": await timed(one_timeout)}


def main() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[-1]})
    loop = uvloop.run(loop_costs())
    rows = [
        ("the guard: the 6 blocks in one chunk, and the annotation", median_us(guard_one_chunk)),
        ("the guard: the 6 blocks one chunk each, and the annotation", median_us(guard_per_event)),
        ("httpx Request (URL cached) and Response objects", median_us(httpx_objects)),
        (
            "metrics (gauge, counters, 5 histograms) and the access-log line",
            median_us(metrics_and_log),
        ),
        ("the disconnect watcher task (create, start, cancel)", loop["watcher"]),
        ("one asyncio.timeout (the relay enters three a stream)", loop["timeout"]),
    ]
    for label, us in rows:
        print(f"{us:7.1f} us  {label}")


if __name__ == "__main__":
    main()
