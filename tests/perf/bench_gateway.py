"""End-to-end benchmark: the gateway against nginx and a direct connection, in one run.

Run it as a script (it is not a pytest test)::

    .venv/bin/python tests/perf/bench_gateway.py                  # full run, ~2 minutes
    .venv/bin/python tests/perf/bench_gateway.py --quick          # scaled down, ~1 minute
    .venv/bin/python tests/perf/bench_gateway.py --scenarios 1,4 \\
        --targets nginx,gateway-aiohttp,gateway-httpx             # compare upstream transports
    .venv/bin/python tests/perf/bench_gateway.py \\
        --targets direct,nginx,splice,push,minimal-raw,minimal,gateway  # with the floors
    .venv/bin/python tests/perf/bench_gateway.py --profile        # scenario 1 under py-spy
    .venv/bin/python tests/perf/bench_gateway.py --scenarios 1,4,5,6 --repeat 3 \\
        --targets direct,nginx,minimal-raw,minimal,gateway        # medians of 3, issue 17
    .venv/bin/python tests/perf/bench_gateway.py --capacity \\
        --targets nginx,minimal-raw,minimal,gateway,litellm       # streams per core

What runs, all on 127.0.0.1:

* **upstream** and **load generator**: this process, one uvloop event loop,
  pinned to CPU 0. The upstream is raw asyncio Protocols (no framework): it
  emits OpenAI ``chat.completion.chunk`` events, each its own HTTP chunk,
  stamped with ``time.monotonic_ns()`` (``CLOCK_MONOTONIC``, one clock for
  every process on the machine) in a ``"ts"`` field, ends with a
  ``finish_reason`` chunk and ``data: [DONE]``. Paced streams are driven by
  one 1 ms timer wheel for all streams (no sleep per stream); when a stream is
  late, everything due goes out in one write. The load generator is raw
  Protocols with a minimal HTTP/1.1 response parser (chunked decoding); it
  computes each event's latency as receive time minus stamp, and verifies the
  end of every stream: ``data: [DONE]`` last (direct, nginx), or ``data:
  [DONE]`` then exactly one ``: gateway outcome=complete ...`` line (gateway).
  A stream without its proper end, with a missing event or a non-200 status
  is a failure.
* **targets**: ``direct`` (the load generator talks to the upstream), ``nginx``
  (1 worker, ``proxy_buffering off``, HTTP/1.1 keep-alive to the upstream, an
  access log, from a temp dir), ``gateway`` (``python -m gateway serve`` as
  shipped: guard, metrics, access log to a file; ``--gateway-args`` adds
  flags and ``NAME=value`` environment), ``gateway-aiohttp`` /
  ``gateway-httpx`` (the same with ``GATEWAY_UPSTREAM_TRANSPORT`` set),
  ``gateway-pool`` (the same upstream twice, as a route's pool of two: every
  request's first attempt holds its head until the first event, the cost of
  failover on the happy path; compare its scenario 6 with ``gateway``),
  and the floors, yardsticks for what the gateway's stack costs here with
  nothing of the gateway in it: ``minimal`` (``minimal_relay.py``: Starlette
  + aiohttp, no guard, metrics or log: issue 7's reference row),
  ``minimal-raw`` (the same as a bare ASGI callable), ``push``
  (``push_relay.py``: the real guard in raw Protocol callbacks, below ASGI and
  httpx, no metrics, log or deadlines: the best case for a guarded Python
  relay) and ``splice`` (``splice_relay.py``: a uvloop TCP splice that parses
  nothing). ``push`` is verified like the gateway (it appends the same
  annotation line). ``litellm`` is LiteLLM's proxy with its documented
  production settings, installed on demand into its own virtualenv
  (``litellm_peer.py``); it drops the query string, so the stream is named in
  the request's model, and it is verified like nginx. Each proxy runs pinned
  to CPU 1 (``--proxy-cpus``; a gateway with ``--workers N`` > 1 runs on every
  CPU, labelled "harness shares a core"), is started fresh for each scenario
  and warmed up with a few short streams before measuring.

Scenarios: (1) 1,000 concurrent streams x 150 events at 50 events/s; (2) 200
of the same; (3) one unpaced 50 MB stream of 16 KiB events (MB/s); (4) 32
keep-alive connections issuing 5-event unpaced streams back to back for 10 s
(streams/s); (5) 5,000 idle open streams (headers and one event, then held:
proxy RSS per stream, all must be held); (6) 300 sequential requests on one
keep-alive connection (time to first byte = request written to first body
byte received); (8) 32 keep-alive connections issuing plain (non-streamed) JSON
requests of about 1 KiB each way back to back for 10 s (requests/s, CPU per
request: the cost of one short call); (7) the capacity search, ``--capacity``: the largest N of
scenario 1's streams a target carries with +p99 <= 50 ms over direct at the
same N, no stream's first byte more than 1 s after its scheduled start, and no
failure (exponential growth, then bisection to 5 %; a fresh process per trial;
rules and "harness-bound" in ``capacity.py``). In the paced scenarios a stream
whose first byte comes more than 1 s after its scheduled start is counted as a
late start.

Proxy CPU is psutil's user+system time of the proxy's processes (nginx:
master and worker) over the measured load, divided by the events delivered.

Results: one table per scenario, PASS/FAIL against issue 17's targets
(``verdicts.py``: the gateway against ``minimal`` and ``minimal-raw`` of the
same run), issue 7's gateway / nginx ratios as information, and the same as
JSON in ``tests/perf/results/latest.json``. ``--repeat K`` runs everything K
times and reports medians and [min-max] ranges, judging on the medians
(failures: on the worst run). Exit status: 0 all checks pass, 1 some check
failed, 2 the harness could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import functools
import gc
import itertools
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qsl

import capacity
import litellm_peer
import psutil
import verdicts
from litellm_peer import MODEL_PREFIX

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "tests" / "perf" / "results"
HARNESS_CPU = 0
PROXY_CPU = 1
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"

now_ns = time.monotonic_ns  # CLOCK_MONOTONIC on Linux: comparable across processes
LATE_START_S = capacity.LATE_START_S  # a stream's first byte later than this after its schedule

# The targets (issue 17's checks, issue 7's ratios as information) are in verdicts.py,
# the capacity search's rules in capacity.py.
FOREIGN_CPU_WARN_PCT = 10.0  # other load on the machine above this disturbs the results

# ---------------------------------------------------------------------------------------------
# The upstream: paced chat.completion.chunk events over raw asyncio Protocols
# ---------------------------------------------------------------------------------------------

_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\n"
    b"x-request-id: upstream-bench\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
_DONE_CHUNK = b"e\r\ndata: [DONE]\n\n\r\n"  # 14 bytes of data
_LAST_CHUNK = b"0\r\n\r\n"
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def _event(delta: bytes, finish: bytes = b"null") -> tuple[bytes, bytes]:
    """An event as (bytes before the stamp, bytes after it)."""
    pre = (
        b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"bench-model","system_fingerprint":"fp_bench","choices":[{"index":0,"delta":'
        + delta
        + b',"logprobs":null,"finish_reason":'
        + finish
        + b'}],"ts":'
    )
    return pre, b"}\n\n"


_ROLE = _event(b'{"role":"assistant","content":""}')
_TOKEN = _event(b'{"content":" token"}')
_FINISH = _event(b"{}", b'"stop"')


JSON_BYTES = 1024  # scenario 8: about this many body bytes each way


@functools.lru_cache(maxsize=8)
def _json_answer(size: int) -> bytes:
    """A plain (non-streamed) chat completion of ``size`` body bytes, head and all."""
    shell = (
        b'{"id":"chatcmpl-bench","object":"chat.completion","model":"bench-model",'
        b'"choices":[{"index":0,"message":{"role":"assistant","content":""},'
        b'"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1,'
        b'"total_tokens":10}}'
    )
    pad = b"x" * max(size - len(shell), 0)
    body = shell.replace(b'"content":""', b'"content":"' + pad + b'"')
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        b"x-request-id: upstream-bench\r\ncontent-length: %d\r\n\r\n" % len(body)
    ) + body


def _json_body_of(query: str) -> bytes:
    """The body the upstream answers a ``mode=json`` query with."""
    answer = _json_answer(int(dict(parse_qsl(query)).get("size", JSON_BYTES)))
    return answer[answer.index(b"\r\n\r\n") + 4 :]


def json_request_body(size: int = JSON_BYTES) -> bytes:
    """A plain (non-streamed) chat request of about ``size`` bytes."""
    shell = b'{"model":"bench-model","messages":[{"role":"user","content":""}]}'
    pad = b"y" * max(size - len(shell), 0)
    return shell.replace(b'"content":""', b'"content":"' + pad + b'"')


def _big_token(size: int) -> tuple[bytes, bytes]:
    return _event(b'{"content":"' + b"x" * max(size - 230, 1) + b'"}')


def _chunk(event: tuple[bytes, bytes], stamp: int) -> bytes:
    """One event as one HTTP/1.1 chunk, stamped."""
    pre, post = event
    digits = b"%d" % stamp
    return b"%x\r\n%b%b%b\r\n" % (len(pre) + len(digits) + len(post), pre, digits, post)


_MODEL_QUERY = re.compile(rb'"model"\s*:\s*"' + re.escape(MODEL_PREFIX.encode()) + rb'([^"]*)"')
_TICK_NS = 1_000_000  # timer wheel slot: 1 ms (libuv timers have 1 ms resolution)
_TICKING: Any = object()  # Upstream.ticking while the tick runs


class Upstream:
    """The fake provider's state: the timer wheel of paced streams and the held streams.

    A request chooses its stream with query parameters:

    * ``mode=paced&n=N&rate=R``: N stamped events, R per second (role, tokens, finish);
    * ``mode=burst&n=N``: N events, headers and all in one write;
    * ``mode=bulk&n=N&size=S``: N events of about S bytes, as fast as the reader takes them;
    * ``mode=hold``: headers, role and one token event, then held until ``release_held()``,
      which sends the finish event (3 stamped events in all).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.wheel: dict[int, list[UpstreamConn]] = {}
        self.next_slot = 0
        self.ticking: asyncio.TimerHandle | None = None
        self.held: set[UpstreamConn] = set()
        self.requests = 0
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await self.loop.create_server(
            lambda: UpstreamConn(self), "127.0.0.1", 0, backlog=4096
        )
        self.port = self.server.sockets[0].getsockname()[1]

    def schedule(self, conn: UpstreamConn, due_ns: int) -> None:
        slot = max(due_ns // _TICK_NS, self.next_slot)
        bucket = self.wheel.get(slot)
        if bucket is None:
            self.wheel[slot] = [conn]
        else:
            bucket.append(conn)
        if self.ticking is None:
            self.next_slot = min(slot, now_ns() // _TICK_NS)
            self._arm(slot)

    def _arm(self, slot: int) -> None:
        delay = (slot * _TICK_NS - now_ns()) / 1e9
        self.ticking = self.loop.call_later(max(delay, 0.0), self._tick)

    def _tick(self) -> None:
        self.ticking = _TICKING  # schedule() must not arm a second timer from inside the tick
        now = now_ns()
        current = now // _TICK_NS
        wheel = self.wheel
        due = [wheel.pop(slot) for slot in range(self.next_slot, current + 1) if slot in wheel]
        self.next_slot = current + 1  # what emit() schedules again lands in a later slot
        for bucket in due:
            for conn in bucket:
                conn.emit(now)
        if wheel:
            self._arm(current + 1)  # one tick per ms while any paced stream is open
        else:
            self.ticking = None

    def release_held(self) -> int:
        held, self.held = self.held, set()
        stamp = now_ns()
        for conn in held:
            conn.finish_hold(stamp)
        return len(held)


class UpstreamConn(asyncio.Protocol):
    """One upstream connection (HTTP/1.1 keep-alive, one request at a time)."""

    def __init__(self, upstream: Upstream) -> None:
        self.up = upstream
        self.tr: asyncio.Transport | None = None
        self.buf = b""
        self.busy = False
        self.closed = False
        self.paused = False
        self.n = 0
        self.k = 0
        self.start = 0
        self.period = 0
        self.big: tuple[bytes, bytes] = _TOKEN

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.up.held.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buf = self.buf + data if self.buf else data
        if not self.busy:
            self._next_request()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.busy and self.period == 0 and self.n and not self.closed:
            self._pump()

    def _next_request(self) -> None:
        assert self.tr is not None
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > 65536:
                self.tr.write(_BAD_REQUEST)
                self.tr.close()
            return
        lines = buf[:end].decode("latin-1").split("\r\n")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        if len(buf) < end + 4 + length:
            return
        body = buf[end + 4 : end + 4 + length]
        self.buf = buf[end + 4 + length :]
        try:
            target = lines[0].split(" ")[1]
        except IndexError:
            self.tr.write(_BAD_REQUEST)
            self.tr.close()
            return
        query = target.partition("?")[2]
        if not query:  # a proxy that drops the query (litellm) gets it in the model's name
            named = _MODEL_QUERY.search(body)
            query = named.group(1).decode() if named else ""
        params = dict(parse_qsl(query))
        self.up.requests += 1
        self.busy = True
        self._respond(params)

    def _done(self, last: bytes) -> None:
        assert self.tr is not None
        self.tr.write(last + _DONE_CHUNK + _LAST_CHUNK)
        self.busy = False
        self.n = 0
        self.period = 0
        if self.buf:
            self._next_request()

    def _respond(self, params: dict[str, str]) -> None:
        assert self.tr is not None
        mode = params.get("mode", "burst")
        n = max(int(params.get("n", 5)), 2)
        stamp = now_ns()
        if mode == "paced":
            self.n, self.k, self.start = n, 1, stamp
            self.period = int(1e9 / float(params.get("rate", 50)))
            self.tr.write(_HEAD + _chunk(_ROLE, stamp))
            self.up.schedule(self, stamp + self.period)
        elif mode == "hold":
            self.tr.write(_HEAD + _chunk(_ROLE, stamp) + _chunk(_TOKEN, stamp))
            self.up.held.add(self)
        elif mode == "json":
            self.tr.write(_json_answer(int(params.get("size", JSON_BYTES))))
            self.busy = False
            if self.buf:
                self._next_request()
        elif mode == "bulk":
            self.n, self.k, self.period = n, 1, 0
            self.big = _big_token(int(params.get("size", 16384)))
            self.tr.write(_HEAD + _chunk(_ROLE, stamp))
            self._pump()
        else:
            body = [_HEAD, _chunk(_ROLE, stamp)]
            body.extend(_chunk(_TOKEN, stamp) for _ in range(n - 2))
            self.tr.write(b"".join(body))
            self._done(_chunk(_FINISH, stamp))

    def emit(self, now: int) -> None:
        """Timer wheel: write every event of this paced stream that is due by ``now``."""
        if self.closed or not self.busy:
            return
        assert self.tr is not None
        last = self.n - 1
        due = min((now - self.start) // self.period, last)
        if due < self.k:  # woken early (slot rounding): come back at the due time
            self.up.schedule(self, self.start + self.k * self.period)
            return
        parts: list[bytes] = []
        while self.k <= due:
            if self.k == last:
                self._done(b"".join(parts) + _chunk(_FINISH, now))
                return
            parts.append(_chunk(_TOKEN, now))
            self.k += 1
        self.tr.write(parts[0] if len(parts) == 1 else b"".join(parts))
        self.up.schedule(self, self.start + self.k * self.period)

    def _pump(self) -> None:
        """Bulk: write stamped big events while the transport takes them."""
        assert self.tr is not None
        last = self.n - 1
        while not self.paused and not self.closed:
            if self.k >= last:
                self._done(_chunk(_FINISH, now_ns()))
                return
            batch = min(8, last - self.k)
            stamp = now_ns()
            self.tr.write(b"".join([_chunk(self.big, stamp) for _ in range(batch)]))
            self.k += batch

    def finish_hold(self, stamp: int) -> None:
        if not self.closed:
            self._done(_chunk(_FINISH, stamp))


# ---------------------------------------------------------------------------------------------
# The load generator: raw Protocols, a minimal HTTP/1.1 response parser, per-event latency
# ---------------------------------------------------------------------------------------------

_TS = re.compile(rb'"ts":(\d+)')
_DONE_BLOCK = b"data: [DONE]\n\n"
#: The gateway's trailer of a whole stream (a cache or resume may add ``name=value``s).
_GATEWAY_TRAILER = re.compile(
    rb": gateway outcome=complete reason=\S+(?: [a-z_]+=\S+)* request_id=[^\s]+\n\Z"
)
_BODY = b'{"model":"bench-model","stream":true,"messages":[{"role":"user","content":"Hi."}]}'


def request_bytes(query: str, model_route: bool = False) -> bytes:
    """The request for the upstream stream ``query``: in the URL's query string, or (a
    target that drops the query: litellm) in the model's name, ``bench?<query>``.
    ``mode=json``: a plain (non-streamed) request of about ``JSON_BYTES``."""
    body, path = _BODY, f"/v1/chat/completions?{query}"
    if query.startswith("mode=json"):
        body = json_request_body()
    if model_route:
        path = "/v1/chat/completions"
        model = json.dumps(litellm_peer.model_for(query)).encode()
        body = _BODY.replace(b'"bench-model"', model)
    return (
        f"POST {path} HTTP/1.1\r\n"
        "Host: 127.0.0.1\r\n"
        "Content-Type: application/json\r\n"
        "Accept: text/event-stream\r\n"
        f"Authorization: Bearer {litellm_peer.MASTER_KEY}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@dataclass
class Tally:
    """What one target delivered in one scenario."""

    gateway: bool
    keep_latency: bool = True
    model_route: bool = False  # the stream is named in the model, not the query (litellm)
    latencies: list[int] = field(default_factory=list)  # ns, receive - stamp
    ttfb: list[int] = field(default_factory=list)  # ns, request written -> first body byte
    events: int = 0
    body_bytes: int = 0
    ok: int = 0
    started: int = 0
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    failure_samples: dict[str, str] = field(default_factory=dict)  # reason: end of the body
    first_send: int = 0
    last_end: int = 0
    late_starts: int = 0  # paced streams whose first byte came > 1 s after their schedule
    start_lag_max: int = 0  # ns, the largest first byte - schedule of those streams
    aborted: str = ""  # why a capacity trial was stopped early

    @property
    def failed(self) -> int:
        return sum(self.failures.values())


class ClientConn(asyncio.Protocol):
    """One client connection; ``request()`` sends one request and resolves when it ends."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.tr: asyncio.Transport | None = None
        self.fut: asyncio.Future[bool] | None = None
        self.closed = False
        self.reusable = True
        self.expected = 0
        self._reset()

    def _reset(self) -> None:
        self.head_done = False
        self.hbuf = b""
        self.status = 0
        self.chunked = False
        self.length = -1
        self.cstate = 2  # 0: chunk data, 1: CRLF after data, 2: size line, 3: trailer
        self.remaining = 0
        self.rbuf = b""
        self.pending = b""
        self.last_done = False
        self.last_complete = b""
        self.events = 0
        self.nbytes = 0
        self.sent = 0
        self.first = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        if self.fut is not None and not self.fut.done():
            self.finish(False, "closed")

    def request(self, data: bytes, expected: int) -> asyncio.Future[bool]:
        assert self.tr is not None
        self._reset()
        self.expected = expected
        self.fut = asyncio.get_running_loop().create_future()
        self.sent = now_ns()
        tally = self.tally
        tally.started += 1
        if not tally.first_send:
            tally.first_send = self.sent
        self.tr.write(data)
        return self.fut

    def finish(self, ok: bool, reason: str = "") -> None:
        tally = self.tally
        tally.events += self.events
        tally.body_bytes += self.nbytes
        tally.last_end = now_ns()
        if ok:
            tally.ok += 1
        else:
            tally.failures[reason] += 1
            if reason not in tally.failure_samples and self.head_done:
                tail = (self.last_complete + self.pending)[-160:]
                tally.failure_samples[reason] = tail.decode("utf-8", "replace")
            self.reusable = False
        fut, self.fut = self.fut, None
        if fut is not None and not fut.done():
            fut.set_result(ok)

    def data_received(self, data: bytes) -> None:
        now = now_ns()
        if self.fut is None:
            self.reusable = False  # bytes outside of any response
            return
        if not self.head_done:
            if self.hbuf:
                data = self.hbuf + data
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self.hbuf = data
                return
            self.hbuf = b""
            self._head(data[:end])
            data = data[end + 4 :]
            if not self.chunked and self.length == 0:
                self._complete()
                return
            if not data:
                return
        if self.chunked:
            self._dechunk(data, now)
        else:
            self.nbytes += len(data)
            if self.length >= 0 and self.nbytes >= self.length:
                self._complete()

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        self.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value:
                self.chunked = True
            elif name == b"content-length":
                self.length = int(value)
            elif name == b"connection" and value == b"close":
                self.reusable = False
        self.head_done = True

    def _dechunk(self, data: bytes, now: int) -> None:
        if self.rbuf:
            data = self.rbuf + data
            self.rbuf = b""
        pos = 0
        size = len(data)
        out: list[bytes] = []
        while pos < size:
            state = self.cstate
            if state == 0:
                take = min(self.remaining, size - pos)
                out.append(data[pos : pos + take] if take < size or pos else data)
                pos += take
                self.remaining -= take
                if not self.remaining:
                    self.cstate = 1
            elif state == 1:
                if size - pos < 2:
                    break
                if data[pos : pos + 2] != b"\r\n":
                    self._protocol_error("bad_chunk")
                    return
                pos += 2
                self.cstate = 2
            elif state == 2:
                end = data.find(b"\r\n", pos)
                if end < 0:
                    break
                try:
                    length = int(data[pos:end].split(b";", 1)[0], 16)
                except ValueError:
                    self._protocol_error("bad_chunk")
                    return
                pos = end + 2
                if length:
                    self.remaining = length
                    self.cstate = 0
                else:
                    self.cstate = 3
            else:
                end = data.find(b"\r\n", pos)
                if end < 0:
                    break
                if end == pos:  # blank line: end of the trailer section, response complete
                    if out:
                        self._body(out[0] if len(out) == 1 else b"".join(out), now)
                    self._complete()
                    return
                pos = end + 2
        if pos < size:
            self.rbuf = data[pos:]
        if out:
            self._body(out[0] if len(out) == 1 else b"".join(out), now)

    def _body(self, piece: bytes, now: int) -> None:
        if not self.first:
            self.first = now
            self.tally.ttfb.append(now - self.sent)
        self.nbytes += len(piece)
        buf = self.pending + piece if self.pending else piece
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self.pending = buf
            return
        cut += 2
        complete = buf if cut == len(buf) else buf[:cut]
        self.pending = buf[cut:]
        stamps = _TS.findall(complete)
        if stamps:
            self.events += len(stamps)
            if self.tally.keep_latency:
                self.tally.latencies.extend([now - int(s) for s in stamps])
        self.last_done = complete.endswith(_DONE_BLOCK)
        self.last_complete = complete  # a reference, for a failure's sample

    def _protocol_error(self, reason: str) -> None:
        self.finish(False, reason)
        if self.tr is not None:
            self.tr.abort()

    def _complete(self) -> None:
        if self.status != 200:
            self.finish(False, f"status_{self.status}")
        elif self.expected < 0:  # a plain answer of -expected body bytes (scenario 8)
            if self.nbytes == -self.expected:
                self.finish(True)
            else:
                self.finish(False, "wrong_length")
        elif not self.chunked:
            self.finish(False, "not_chunked")
        elif not self.last_done:
            self.finish(False, "no_done")
        elif self.events != self.expected:
            self.finish(False, "missing_events" if self.events < self.expected else "extra_events")
        elif self.tally.gateway and not _GATEWAY_TRAILER.match(self.pending):
            self.finish(False, "no_gateway_trailer")
        elif not self.tally.gateway and self.pending:
            self.finish(False, "bytes_after_done")
        else:
            self.finish(True)


async def _connect(port: int, tally: Tally) -> ClientConn | None:
    loop = asyncio.get_running_loop()
    try:
        _, conn = await loop.create_connection(lambda: ClientConn(tally), "127.0.0.1", port)
    except OSError:
        tally.failures["connect"] += 1
        return None
    return conn


def _abort_all(conns: Iterable[ClientConn], reason: str) -> None:
    for conn in conns:
        if conn.fut is not None and not conn.fut.done():
            conn.finish(False, reason)
        if conn.tr is not None and not conn.closed:
            conn.tr.abort()


async def drive_streams(
    port: int,
    tally: Tally,
    streams: int,
    query: str,
    expected: int,
    ramp: float,
    limit_s: float,
    stop_when_late: bool = False,
) -> None:
    """``streams`` connections, one stream each, started evenly over ``ramp`` seconds.

    A stream whose first body byte comes more than ``LATE_START_S`` after its scheduled
    start (or not at all by then) is a late start. ``stop_when_late`` (the capacity
    search) stops the run at the first late start or failure: the trial has failed.
    """
    request = request_bytes(query, tally.model_route)
    conns: list[ClientConn] = []
    by_index: list[ClientConn | None] = [None] * streams
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    t0_ns = now_ns()
    late_ns = int(LATE_START_S * 1e9)

    def scheduled(i: int) -> int:
        return t0_ns + int(ramp * 1e9 * i / streams)

    async def one(i: int) -> None:
        await asyncio.sleep(max(t0 + ramp * i / streams - loop.time(), 0))
        conn = await _connect(port, tally)
        if conn is None:
            return
        by_index[i] = conn
        conns.append(conn)
        await conn.request(request, expected)
        if conn.tr is not None:
            conn.tr.close()

    tasks = [loop.create_task(one(i)) for i in range(streams)]

    async def watch() -> None:
        """Stop at the first late start or failure (streams come due in index order)."""
        i = 0
        while i < streams:
            now = now_ns()
            while i < streams and scheduled(i) + late_ns < now:
                conn = by_index[i]
                first = conn.first if conn is not None else 0
                if not first or first - scheduled(i) > late_ns:
                    tally.aborted = (
                        f"stream {i} had no first byte {LATE_START_S:g} s after its start"
                    )
                    break
                i += 1
            if not tally.aborted and tally.failed:
                tally.aborted = f"a failure: {dict(tally.failures)}"
            if tally.aborted:
                for task in tasks:
                    task.cancel()
                _abort_all(conns, "stopped")
                return
            await asyncio.sleep(0.05)

    watchdog = loop.create_task(watch()) if stop_when_late else None
    _, pending = await asyncio.wait(tasks, timeout=limit_s)
    if watchdog is not None:
        watchdog.cancel()
    _abort_all(conns, "timeout")
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=5)
    end = now_ns()
    for i, conn in enumerate(by_index):
        first = conn.first if conn is not None else 0
        lag = (first or end) - scheduled(i)
        if conn is not None and lag > late_ns:  # no conn: a failure (connect, not started)
            tally.late_starts += 1
            tally.start_lag_max = max(tally.start_lag_max, lag)
    tally.failures["not_started"] += max(streams - tally.started - tally.failures["connect"], 0)
    if not tally.failures["not_started"]:
        del tally.failures["not_started"]


#: ``drive_keepalive``'s ``&u=N``, one count for the whole run.
_UNIQUE_TARGETS = itertools.count()


async def drive_keepalive(
    port: int,
    tally: Tally,
    conns: int,
    duration: float,
    query: str,
    expected: int,
    unique: bool = False,
) -> float:
    """``conns`` keep-alive connections issuing streams back to back for ``duration`` s.

    ``unique``: each request's target gets its own ``&u=N`` (the upstream ignores it),
    so that no two requests share a cache key: a cache that is on misses every time (the
    count runs on across calls: a warm-up's targets are never asked again)."""
    request = request_bytes(query, tally.model_route)
    serial = _UNIQUE_TARGETS
    loop = asyncio.get_running_loop()
    end = loop.time() + duration
    live: list[ClientConn] = []

    async def worker() -> None:
        conn: ClientConn | None = None
        while loop.time() < end:
            if conn is None or not conn.reusable:
                if conn is not None and conn.tr is not None:
                    conn.tr.close()
                conn = await _connect(port, tally)
                if conn is None:
                    await asyncio.sleep(0.01)
                    continue
                live.append(conn)
            payload = request
            if unique:
                payload = request_bytes(f"{query}&u={next(serial)}", tally.model_route)
            await conn.request(payload, expected)
        if conn is not None and conn.tr is not None:
            conn.tr.close()

    started = loop.time()
    tasks = [loop.create_task(worker()) for _ in range(conns)]
    _, pending = await asyncio.wait(tasks, timeout=duration + 30)
    elapsed = loop.time() - started
    _abort_all(live, "timeout")
    for task in pending:
        task.cancel()
    return elapsed


async def drive_sequential(
    port: int, tally: Tally, requests: int, query: str, expected: int
) -> None:
    await drive_keepalive_count(port, tally, requests, query, expected, limit_s=60 + requests / 10)


async def drive_keepalive_count(
    port: int, tally: Tally, requests: int, query: str, expected: int, limit_s: float
) -> None:
    request = request_bytes(query, tally.model_route)
    live: list[ClientConn] = []

    async def worker() -> None:
        conn: ClientConn | None = None
        for _ in range(requests):
            if conn is None or not conn.reusable:
                if conn is not None and conn.tr is not None:
                    conn.tr.close()
                conn = await _connect(port, tally)
                if conn is None:
                    continue
                live.append(conn)
            await conn.request(request, expected)
        if conn is not None and conn.tr is not None:
            conn.tr.close()

    try:
        await asyncio.wait_for(worker(), limit_s)
    except TimeoutError:
        _abort_all(live, "timeout")


async def drive_hold(
    port: int,
    tally: Tally,
    upstream: Upstream,
    streams: int,
    ramp: float,
    measure: Callable[[], dict[str, float]],
) -> dict[str, Any]:
    """Open ``streams`` held streams, measure with all of them open, then release and verify."""
    request = request_bytes("mode=hold", tally.model_route)
    loop = asyncio.get_running_loop()
    conns: list[ClientConn] = []
    futures: list[asyncio.Future[bool]] = []
    batch = 250
    t0 = loop.time()
    for start in range(0, streams, batch):
        await asyncio.sleep(max(t0 + ramp * start / streams - loop.time(), 0))
        count = min(batch, streams - start)
        made = await asyncio.gather(*[_connect(port, tally) for _ in range(count)])
        for conn in made:
            if conn is not None:
                conns.append(conn)
                futures.append(conn.request(request, 3))
    deadline = loop.time() + 60
    while loop.time() < deadline:
        if all(c.first or c.fut is None for c in conns):
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)  # let allocations settle
    held = sum(1 for c in conns if c.first and c.fut is not None and not c.closed)
    sample = measure()
    released = upstream.release_held()
    if futures:
        _, pending = await asyncio.wait(futures, timeout=60)
        if pending:
            _abort_all(conns, "timeout")
    for conn in conns:
        if conn.tr is not None and not conn.closed:
            conn.tr.close()
    return {"held": held, "released_upstream": released, **sample}


# ---------------------------------------------------------------------------------------------
# The proxies under test
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _pin(cpus: int | set[int]) -> Callable[[], None]:
    cpu_set = {cpus} if isinstance(cpus, int) else set(cpus)

    def pin() -> None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpu_set)

    return pin


class Proxy:
    """A proxy process (tree) under test; ``None`` for the direct target."""

    name = "proxy"

    ready_s = 30.0  # how long it may take to start

    def __init__(self, upstream_port: int, workdir: Path) -> None:
        self.upstream_port = upstream_port
        self.workdir = workdir
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.cpus: set[int] = {PROXY_CPU}  # its CPU affinity (make_proxy may widen it)

    def processes(self) -> list[psutil.Process]:
        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_seconds(self) -> float:
        total = 0.0
        for proc in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def rss(self) -> int:
        total = 0
        for proc in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                total += proc.memory_info().rss
        return total

    def main_pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        raise NotImplementedError

    async def wait_ready(self, limit_s: float | None = None) -> None:
        limit_s = limit_s or self.ready_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while loop.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.logs()}")
            if await self._ready():
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {limit_s}s: {self.logs()}")

    async def _ready(self) -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            return False
        writer.close()
        return True

    def logs(self) -> str:
        return ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


class NginxProxy(Proxy):
    name = "nginx"

    def start(self) -> None:
        d = self.workdir / "nginx"
        d.mkdir(exist_ok=True)
        conf = d / "nginx.conf"
        conf.write_text(
            f"""
worker_processes 1;
worker_rlimit_nofile 20000;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{
    worker_connections 16384;
    use epoll;
}}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy_temp;
    fastcgi_temp_path {d}/fastcgi_temp;
    uwsgi_temp_path {d}/uwsgi_temp;
    scgi_temp_path {d}/scgi_temp;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    upstream bench_upstream {{
        server 127.0.0.1:{self.upstream_port};
        keepalive 1024;
        keepalive_requests 1000000;
        keepalive_timeout 60s;
    }}
    server {{
        listen 127.0.0.1:{self.port} backlog=4096;
        location / {{
            proxy_pass http://bench_upstream;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 300s;
            proxy_send_timeout 300s;
        }}
    }}
}}
"""
        )
        self.proc = subprocess.Popen(
            [NGINX, "-p", str(d), "-c", str(conf), "-e", str(d / "error.log")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(d / "stderr.log", "wb"),  # noqa: SIM115
            preexec_fn=_pin(self.cpus),
            start_new_session=True,
        )

    def logs(self) -> str:
        path = self.workdir / "nginx" / "error.log"
        return path.read_text()[-2000:] if path.exists() else ""

    def stop(self) -> None:
        proc = self.proc
        super().stop()  # SIGTERM to the master: fast shutdown of master and worker
        if proc is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(proc.pid).children():
                    child.kill()


class GatewayProxy(Proxy):
    name = "gateway"

    def __init__(
        self, upstream_port: int, workdir: Path, args: list[str], env: dict[str, str], label: str
    ) -> None:
        super().__init__(upstream_port, workdir)
        self.args = args
        self.env = env
        self.name = label
        #: The source tree it runs from (``ab_gateway.py`` runs another one beside it).
        self.tree = ROOT

    def start(self) -> None:
        d = self.workdir / self.name
        d.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        env.update(self.env)
        cmd = self.command()
        self.access_log = d / "access.log"
        self.proc = subprocess.Popen(
            cmd,
            cwd=self.tree,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=open(self.access_log, "wb"),  # noqa: SIM115
            stderr=open(d / "stderr.log", "wb"),  # noqa: SIM115
            preexec_fn=_pin(self.cpus),
            start_new_session=True,
        )

    @staticmethod
    def python() -> str:
        if PROXY_PYTHON:
            return PROXY_PYTHON
        venv = ROOT / ".venv" / "bin" / "python"
        return str(venv) if venv.exists() else sys.executable

    def command(self) -> list[str]:
        # A pool comes from GATEWAY_ROUTES (make_proxy), not from --upstream.
        upstream = (
            []
            if "GATEWAY_ROUTES" in self.env
            else ["--upstream", f"http://127.0.0.1:{self.upstream_port}/v1"]
        )
        return [
            self.python(),
            "-m",
            "gateway",
            "serve",
            *upstream,
            "--port",
            str(self.port),
            *self.args,
        ]

    async def _ready(self) -> bool:
        return await http_ready(self.port, "/readyz", 2)

    def logs(self) -> str:
        path = self.workdir / self.name / "stderr.log"
        return path.read_text()[-2000:] if path.exists() else ""


class FloorProxy(GatewayProxy):
    """A yardstick relay script beside this one: ``minimal_relay.py`` (``minimal``,
    ``minimal-raw``), ``splice_relay.py`` (``splice``) or ``push_relay.py`` (``push``)."""

    SCRIPTS: ClassVar[dict[str, tuple[str, list[str]]]] = {
        "minimal": ("minimal_relay.py", []),
        "minimal-raw": ("minimal_relay.py", ["--raw"]),
        "splice": ("splice_relay.py", []),
        "push": ("push_relay.py", []),
    }

    def command(self) -> list[str]:
        script, extra = self.SCRIPTS[self.name]
        return [
            self.python(),
            str(Path(__file__).with_name(script)),
            "--upstream-port",
            str(self.upstream_port),
            "--port",
            str(self.port),
            *extra,
        ]

    async def _ready(self) -> bool:
        if self.name == "splice":  # it speaks no HTTP of its own: ready once it accepts
            return await Proxy._ready(self)
        return await super()._ready()


class LiteLLMProxy(Proxy):
    """LiteLLM's proxy with its documented production settings (see litellm_peer.py)."""

    name = "litellm"
    ready_s = 180.0  # it imports for 10-20 s here

    def __init__(self, upstream_port: int, workdir: Path, queries: list[str], extra: list[str]):
        super().__init__(upstream_port, workdir)
        self.queries = queries
        self.extra = extra

    def start(self) -> None:
        executable = litellm_peer.ensure_venv()
        d = self.workdir / "litellm"
        (d / "home").mkdir(parents=True, exist_ok=True)
        config = d / "config.yaml"
        config.write_text(litellm_peer.config_yaml(self.upstream_port, self.queries))
        self.proc = subprocess.Popen(
            litellm_peer.command(executable, config, self.port, self.extra),
            cwd=d,
            env=litellm_peer.environment(d / "home"),
            stdin=subprocess.DEVNULL,
            stdout=open(d / "stdout.log", "wb"),  # noqa: SIM115
            stderr=open(d / "stderr.log", "wb"),  # noqa: SIM115
            preexec_fn=_pin(self.cpus),
            start_new_session=True,
        )

    async def _ready(self) -> bool:
        return await http_ready(self.port, "/health/liveliness", 5)

    def logs(self) -> str:
        d = self.workdir / "litellm"
        text = ""
        for name in ("stderr.log", "stdout.log"):
            path = d / name
            if path.exists():
                text += path.read_text(errors="replace")[-1500:]
        return text


def guarded(target: str) -> bool:
    """Whether the target appends the gateway's annotation (verified as the gateway's)."""
    return target.startswith("gateway") or target == "push"


# ---------------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------------


@dataclass
class Scale:
    s1_streams: int = 1000
    s2_streams: int = 200
    events: int = 150
    rate: float = 50.0
    ramp: float = 1.0
    s3_bytes: int = 50 * 1024 * 1024
    s3_event: int = 16 * 1024
    s4_conns: int = 32
    s4_seconds: float = 10.0
    s4_events: int = 5
    s5_streams: int = 5000
    s5_ramp: float = 5.0
    s6_requests: int = 300
    s8_conns: int = 32
    s8_seconds: float = 10.0
    cap_start: int = capacity.STREAMS_START  # scenario 7: the first N tried
    cap_max: int = capacity.STREAMS_CAP  # and the largest


QUICK = Scale(
    s1_streams=200,
    s2_streams=50,
    events=50,
    ramp=0.5,
    s3_bytes=10 * 1024 * 1024,
    s4_seconds=3.0,
    s5_streams=1000,
    s5_ramp=1.0,
    s6_requests=100,
    s8_seconds=3.0,
    cap_start=50,
    cap_max=800,
)

SCENARIO_TITLES = {
    1: "{s1_streams} concurrent streams x {events} events at {rate:g} events/s",
    2: "{s2_streams} concurrent streams x {events} events at {rate:g} events/s",
    3: "1 stream, {s3_mib:g} MiB unpaced in {s3_kib:g} KiB events",
    4: "{s4_conns} keep-alive connections, {s4_events}-event streams back to back, "
    "{s4_seconds:g} s",
    5: "{s5_streams} idle open streams (headers + 1 event, held)",
    6: "{s6_requests} sequential requests on one keep-alive connection (TTFB)",
    8: "{s8_conns} keep-alive connections, plain JSON requests (~1 KiB each way) back to back, "
    "{s8_seconds:g} s",
    7: "capacity: most concurrent streams x {events} events at {rate:g} events/s, started "
    "over {ramp:g} s, with +p99 <= 50 ms over direct, no start > 1 s late, no failures",
}


def _title(sid: int, scale: Scale) -> str:
    values = dict(scale.__dict__)
    values["s3_mib"] = scale.s3_bytes / 2**20
    values["s3_kib"] = scale.s3_event / 1024
    return SCENARIO_TITLES[sid].format(**values)


def _pct(values: list[int], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100.0 * len(ordered) + 0.5) - 1))
    return ordered[index] / 1e6  # ns -> ms


WARM_UP_QUERIES = ("mode=burst&n=5", "mode=paced&n=5&rate=100")


def scenario_query(sid: int, scale: Scale) -> str:
    """The upstream stream a scenario asks for (the query string, or litellm's model name)."""
    if sid in (1, 2, 7):
        return f"mode=paced&n={scale.events}&rate={scale.rate:g}"
    if sid == 3:
        return f"mode=bulk&n={_s3_events(scale)}&size={scale.s3_event}"
    if sid == 4:
        return f"mode=burst&n={scale.s4_events}"
    if sid == 5:
        return "mode=hold"
    if sid == 8:
        return f"mode=json&size={JSON_BYTES}"
    return "mode=burst&n=5"


def all_queries(scale: Scale) -> list[str]:
    return [*WARM_UP_QUERIES, *(scenario_query(sid, scale) for sid in SCENARIO_TITLES)]


def _s3_events(scale: Scale) -> int:
    return max(scale.s3_bytes // scale.s3_event, 2)


async def _plateau_cpu(start_s: float, end_s: float) -> float | None:
    """The harness's CPU % from ``start_s`` to ``end_s`` after now: for paced streams, the
    stretch in which every stream has started and none has ended (all N open)."""
    if end_s - start_s < 0.2:
        return None
    await asyncio.sleep(start_s)
    own0, wall0 = time.process_time(), time.monotonic()
    await asyncio.sleep(end_s - start_s)
    wall = time.monotonic() - wall0
    return 100.0 * (time.process_time() - own0) / wall if wall else None


async def run_scenario(
    sid: int,
    scale: Scale,
    port: int,
    tally: Tally,
    upstream: Upstream,
    proxy: Proxy | None,
    streams: int = 0,
) -> dict[str, Any]:
    """Drive one scenario against one target; returns the raw measurements.

    Scenario 7 is one trial of the capacity search: ``streams`` paced streams, stopped at
    the first late start or failure."""
    extra: dict[str, Any] = {}
    cpu0 = proxy.cpu_seconds() if proxy else 0.0
    own0 = time.process_time()
    sys0 = _busy_cpu_seconds()
    t0 = time.monotonic()
    query = scenario_query(sid, scale)
    plateau: asyncio.Task[float | None] | None = None
    if sid in (1, 2, 7):
        if sid != 7:
            streams = scale.s1_streams if sid == 1 else scale.s2_streams
        timeout = scale.ramp + scale.events / scale.rate + (30 if sid == 7 else 90)
        plateau = asyncio.ensure_future(_plateau_cpu(scale.ramp, scale.events / scale.rate))
        await drive_streams(
            port, tally, streams, query, scale.events, scale.ramp, timeout, stop_when_late=sid == 7
        )
    elif sid == 3:
        await drive_streams(port, tally, 1, query, _s3_events(scale), 0.0, 120)
    elif sid == 4:
        elapsed = await drive_keepalive(
            port, tally, scale.s4_conns, scale.s4_seconds, query, scale.s4_events
        )
        extra["elapsed_s"] = elapsed
    elif sid == 5:
        before = proxy.rss() if proxy else 0

        def measure() -> dict[str, float]:
            return {"rss_before": before, "rss_open": proxy.rss() if proxy else 0}

        extra.update(
            await drive_hold(port, tally, upstream, scale.s5_streams, scale.s5_ramp, measure)
        )
    elif sid == 6:
        await drive_sequential(port, tally, scale.s6_requests, query, 5)
    elif sid == 8:
        elapsed = await drive_keepalive(
            port, tally, scale.s8_conns, scale.s8_seconds, query, -len(_json_body_of(query))
        )
        extra["elapsed_s"] = elapsed
    wall = time.monotonic() - t0
    own = time.process_time() - own0
    extra["harness_cpu_pct"] = 100.0 * own / wall if wall else None
    if plateau is not None:
        extra["harness_plateau_cpu_pct"] = plateau.result() if plateau.done() else None
        plateau.cancel()
    # CPU that neither the harness nor the proxy used: other processes on the machine
    foreign = _busy_cpu_seconds() - sys0 - own - ((proxy.cpu_seconds() - cpu0) if proxy else 0.0)
    extra["foreign_cpu_pct"] = max(100.0 * foreign / wall, 0.0) if wall else None
    await asyncio.sleep(0.2)  # let the proxy finish its bookkeeping (access log, metrics)
    cpu = (proxy.cpu_seconds() - cpu0) if proxy else None
    extra["wall_s"] = wall
    extra["cpu_s"] = cpu
    return extra


def _busy_cpu_seconds() -> float:
    """System-wide busy CPU time (all cores), to notice other load on the machine."""
    t = psutil.cpu_times()
    # irq/softirq time is left out: what this kernel (tick accounting) books there is the
    # softirq work that interrupted no process, mostly our own loopback TCP
    return float(t.user + t.nice + t.system)


async def http_ready(port: int, path: str, seconds: float) -> bool:
    """Whether ``GET path`` on 127.0.0.1:``port`` answers 200 within ``seconds``."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        line = await asyncio.wait_for(reader.readline(), seconds)
        return b" 200 " in line
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()


def wait_for_quiet(limit_s: float) -> None:
    """Wait (at most ``limit_s``) until other processes use under 15% of a CPU for 4 s."""
    deadline = time.monotonic() + limit_s
    quiet = 0
    while time.monotonic() < deadline:
        before = _busy_cpu_seconds()
        time.sleep(2.0)
        load = (_busy_cpu_seconds() - before) / 2.0
        quiet = quiet + 1 if load < 0.15 else 0
        if quiet >= 2:
            return
        print(f"waiting for a quiet machine: other processes use {100 * load:.0f}% of a CPU")
    print("warning: the machine did not get quiet; results may be disturbed", file=sys.stderr)


def summarize(sid: int, scale: Scale, tally: Tally, extra: dict[str, Any]) -> dict[str, Any]:
    span = (tally.last_end - tally.first_send) / 1e9 if tally.last_end > tally.first_send else 0
    if sid in (4, 8) and extra.get("elapsed_s"):
        span = extra["elapsed_s"]
    out: dict[str, Any] = {
        "streams": tally.started,
        "ok": tally.ok,
        "failures": tally.failed,
        "failure_reasons": dict(tally.failures),
        "failure_samples": tally.failure_samples,
        "events": tally.events,
        "seconds": round(span, 3),
        "events_per_s": tally.events / span if span else None,
        "streams_per_s": tally.ok / span if span else None,
        "mb_per_s": tally.body_bytes / span / 1e6 if span else None,
        "latency_p50_ms": _pct(tally.latencies, 50),
        "latency_p99_ms": _pct(tally.latencies, 99),
        "ttfb_p50_ms": _pct(tally.ttfb, 50),
        "ttfb_p99_ms": _pct(tally.ttfb, 99),
        "ttfb_over_500ms": sum(1 for t in tally.ttfb if t > 500_000_000),
        "ttfb_max_ms": max(tally.ttfb) / 1e6 if tally.ttfb else None,
        "proxy_cpu_s": extra.get("cpu_s"),
        "harness_cpu_pct": extra.get("harness_cpu_pct"),
        "foreign_cpu_pct": extra.get("foreign_cpu_pct"),
        "wall_s": extra.get("wall_s"),
        "cpu_us_per_event": (extra["cpu_s"] / tally.events * 1e6)
        if extra.get("cpu_s") is not None and tally.events
        else None,
        "cpu_us_per_request": (extra["cpu_s"] / tally.ok * 1e6)
        if extra.get("cpu_s") is not None and tally.ok
        else None,
    }
    if sid in (1, 2, 7):
        out["late_starts"] = tally.late_starts
        out["start_lag_max_ms"] = tally.start_lag_max / 1e6 if tally.late_starts else None
        out["harness_plateau_cpu_pct"] = extra.get("harness_plateau_cpu_pct")
    if tally.aborted:
        out["aborted"] = tally.aborted
    if sid == 5:
        out["held"] = extra.get("held", 0)
        out["held_failures"] = scale.s5_streams - extra.get("held", 0)
        if extra.get("rss_open"):
            out["rss_before_mib"] = extra["rss_before"] / 2**20
            out["rss_open_mib"] = extra["rss_open"] / 2**20
            out["rss_per_stream_kib"] = (
                (extra["rss_open"] - extra["rss_before"]) / scale.s5_streams / 1024
            )
    return out


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ".1f") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return format(value, spec)


def _row(cells: list[str], cols: list[tuple[str, int, str]]) -> str:
    """One line of a results table: each cell aligned in its column's width."""
    return "  ".join(
        f"{cell:{align}{width}}" for cell, (_, width, align) in zip(cells, cols, strict=True)
    )


def render_table(sid: int, title: str, results: dict[str, dict[str, Any]]) -> str:
    cols = [
        ("target", 16, "<"),
        ("ok/streams", 11, ">"),
        ("events/s", 9, ">"),
        ("streams/s", 9, ">"),
        ("MB/s", 7, ">"),
        ("lat p50", 8, ">"),
        ("lat p99", 8, ">"),
        ("+p50", 7, ">"),
        ("+p99", 7, ">"),
        ("TTFB p50", 8, ">"),
        ("TTFB p99", 8, ">"),
        ("CPU us/ev", 9, ">"),
        ("CPU us/req", 10, ">"),
        ("KiB/strm", 8, ">"),
        ("fail", 5, ">"),
    ]
    lines = [f"Scenario {sid}: {title}  (latencies and TTFB in ms)"]
    lines.append(_row([name for name, _, _ in cols], cols))
    for target, r in results.items():
        added50 = r.get("added_p50_ms")
        added99 = r.get("added_p99_ms")
        cells = [
            target,
            f"{r['ok']}/{r['streams']}",
            _fmt(r["events_per_s"], ".0f"),
            _fmt(r["streams_per_s"], ".0f"),
            _fmt(r["mb_per_s"], ".1f"),
            _fmt(r["latency_p50_ms"], ".2f"),
            _fmt(r["latency_p99_ms"], ".2f"),
            _fmt(added50, "+.2f"),
            _fmt(added99, "+.2f"),
            _fmt(r["ttfb_p50_ms"], ".2f"),
            _fmt(r["ttfb_p99_ms"], ".2f"),
            _fmt(r["cpu_us_per_event"], ".1f"),
            _fmt(r.get("cpu_us_per_request"), ".0f"),
            _fmt(r.get("rss_per_stream_kib"), ".1f"),
            str(r["failures"]),
        ]
        lines.append(_row(cells, cols))
        if r.get("label"):
            lines.append(f"    {r['label']}")
        if r["failure_reasons"]:
            lines.append(f"    {target} failures: {r['failure_reasons']}")
            for reason, sample in r.get("failure_samples", {}).items():
                lines.append(f"      {reason}: the body ended with {sample!r}")
        if r.get("late_starts"):
            lines.append(
                f"    {target}: {r['late_starts']} late starts (first byte > {LATE_START_S:g} s"
                f" after the stream's scheduled start; max {r['start_lag_max_ms']:.0f} ms)"
            )
        if (r.get("foreign_cpu_pct") or 0) > FOREIGN_CPU_WARN_PCT:
            lines.append(
                f"    warning: other processes used {r['foreign_cpu_pct']:.0f}% of a CPU "
                f"during {target}'s run: its numbers are disturbed"
            )
    return "\n".join(lines)


def render_ratios(sid: int, results: dict[str, dict[str, Any]], gw: str) -> str:
    g, n = results.get(gw), results.get("nginx")
    if not g or not n:
        return ""
    parts = []
    for key, label, spec in (
        ("events_per_s", "events/s", ".2f"),
        ("streams_per_s", "streams/s", ".2f"),
        ("mb_per_s", "MB/s", ".2f"),
        ("cpu_us_per_event", "CPU/event", ".2f"),
        ("ttfb_p50_ms", "TTFB p50", ".2f"),
    ):
        ratio = verdicts.ratio(g.get(key), n.get(key))
        if ratio is not None:
            parts.append(f"{label} {ratio:{spec}}x")
    if g.get("rss_per_stream_kib") is not None and n.get("rss_per_stream_kib"):
        rss = verdicts.ratio(g["rss_per_stream_kib"], n["rss_per_stream_kib"]) or 0.0
        parts.append(f"RSS/stream {rss:.1f}x")
    return f"  {gw} / nginx: " + ", ".join(parts) if parts else ""


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def render_checks(gw: str, checks: list[dict[str, Any]], info: bool = False) -> str:
    """Issue 17's checks as PASS/FAIL lines; issue 7's (``info``) as information lines."""
    lines = []
    for c in checks:
        if info:
            if c["value"] is None:
                continue
            lines.append(
                f"  (issue 7, info) {gw}: {c['check']} = {_shown(c['value'])}"
                f"  (was: {c['op']} {c['limit']}, {c['result']})"
            )
            continue
        spread = ""
        if "min" in c and c.get("median") is not None:
            spread = f" [{c['min']:.3g}-{c['max']:.3g}] over {len(c['values'])} runs"
            if c.get("judged_on") == "max":
                spread += ", the worst"
        lines.append(
            f"  [{c['result']}] {gw}: {c['check']} = {_shown(c['value'])}{spread}"
            f"  (target {c['op']} {c['limit']})"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Profiling (py-spy)
# ---------------------------------------------------------------------------------------------


def _py_spy() -> str | None:
    for local in (ROOT / ".venv" / "bin" / "py-spy", Path(sys.executable).parent / "py-spy"):
        if local.exists():
            return str(local)
    return shutil.which("py-spy")


def start_py_spy(
    pid: int, out: Path, fmt: str, rate: int, seconds: int, extra: list[str]
) -> subprocess.Popen[bytes]:
    exe = _py_spy()
    if exe is None:
        raise RuntimeError("py-spy not found: .venv/bin/pip install -e '.[perf]'")
    return subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--duration",
            str(seconds),
            "--format",
            fmt,
            "--output",
            str(out),
            *(extra or ["--nonblocking"]),  # --native needs to pause the process
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(out.with_suffix(out.suffix + ".log"), "wb"),
        preexec_fn=_pin(HARNESS_CPU),
        start_new_session=True,
    )


def stop_py_spy(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _frame_key(frame: str) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame
    path = m.group("file")
    for marker in ("site-packages/", "lib/python3", "/work/main/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    if path.startswith("/") and "/gateway/" in path:  # any source tree's (ab_gateway.py)
        path = "gateway/" + path.rsplit("/gateway/", 1)[1]
    return f"{m.group('func')} ({path})"


def summarize_profile(raw: Path, top: int = 15) -> dict[str, Any]:
    """Self and inclusive sample shares per function from py-spy's collapsed stacks."""
    self_counts: collections.Counter[str] = collections.Counter()
    incl_counts: collections.Counter[str] = collections.Counter()
    file_counts: collections.Counter[str] = collections.Counter()
    group_counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_frame_key(f) for f in stack.split(";") if "(" in f]
        if not frames:
            continue
        self_counts[frames[-1]] += count
        for key in set(frames):
            incl_counts[key] += count
        leaf = frames[-1]
        file_counts[leaf[leaf.rfind("(") + 1 : -1]] += count
        group_counts[_component(leaf)] += count
    pct = (lambda c: round(100.0 * c / total, 2)) if total else (lambda c: 0.0)
    return {
        "samples": total,
        "self": [(k, pct(v)) for k, v in self_counts.most_common(top)],
        "inclusive": [(k, pct(v)) for k, v in incl_counts.most_common(top * 2)],
        "self_by_file": [(k, pct(v)) for k, v in file_counts.most_common(top)],
        "self_by_component": [(k, pct(v)) for k, v in group_counts.most_common()],
    }


_COMPONENTS = (
    ("gateway/guard/", "gateway.guard (SSE decoder, contract)"),
    ("gateway/proxy/relay.py", "gateway.proxy.relay"),
    ("gateway/observe/", "gateway.observe (metrics, access log)"),
    ("gateway/", "gateway (other)"),
    ("uvicorn/", "uvicorn (server side HTTP)"),
    ("starlette/", "starlette (routing, middleware)"),
    ("httpx_aiohttp/", "httpx-aiohttp (transport adapter)"),
    ("httpx/", "httpx (client API)"),
    ("httpcore/", "httpcore/h11 (httpx transport)"),
    ("h11/", "httpcore/h11 (httpx transport)"),
    ("aiohttp/", "aiohttp (upstream HTTP client)"),
    ("multidict/", "aiohttp (upstream HTTP client)"),
    ("yarl/", "aiohttp (upstream HTTP client)"),
    ("prometheus_client/", "gateway.observe (metrics, access log)"),
    ("asyncio/runners.py", "event loop, native code and syscalls (uvloop)"),
    ("uvloop/", "event loop, native code and syscalls (uvloop)"),
    ("asyncio/", "asyncio (tasks, timeouts)"),
    ("json/", "json"),
)


def _component(frame: str) -> str:
    path = frame[frame.rfind("(") + 1 : -1]
    for prefix, name in _COMPONENTS:
        if path.startswith(prefix) or f"/{prefix}" in path:
            return name
    return "other: " + path.split("/", 1)[0]


def render_profile(summary: dict[str, Any]) -> str:
    lines = [f"py-spy: {summary['samples']} samples of the gateway (non-idle)"]
    lines.append("  top functions by self time (% of samples):")
    lines += [f"    {p:6.2f}%  {k}" for k, p in summary["self"]]
    lines.append("  top functions by inclusive time (% of samples):")
    lines += [f"    {p:6.2f}%  {k}" for k, p in summary["inclusive"]]
    lines.append("  self time by file:")
    lines += [f"    {p:6.2f}%  {k}" for k, p in summary["self_by_file"]]
    lines.append("  self time by component:")
    lines += [f"    {p:6.2f}%  {k}" for k, p in summary["self_by_component"]]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

#: The interpreter the gateway and the Python floors run on ("" = .venv's); see --python.
PROXY_PYTHON = ""

TARGETS = (
    "direct",
    "nginx",
    "splice",
    "push",
    "minimal",
    "minimal-raw",
    "gateway",
    "gateway-aiohttp",
    "gateway-httpx",
    "gateway-pool",
    "gateway-features",
    "litellm",
)


def _split_gateway_args(text: str) -> tuple[list[str], dict[str, str]]:
    args: list[str] = []
    env: dict[str, str] = {}
    for token in shlex.split(text):
        if re.match(r"^[A-Z_][A-Z0-9_]*=", token):
            name, _, value = token.partition("=")
            env[name] = value
        else:
            args.append(token)
    return args, env


def gateway_workers(opts: argparse.Namespace) -> int:
    """How many worker processes ``--gateway-args`` asks the gateway for."""
    args, env = _split_gateway_args(opts.gateway_args)
    value = env.get("GATEWAY_WORKERS", "1")
    for i, arg in enumerate(args):
        if arg == "--workers" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--workers="):
            value = arg.partition("=")[2]
    try:
        return max(int(value), 1)
    except ValueError:
        return 1


def proxy_cpus(target: str, opts: argparse.Namespace) -> set[int]:
    """The CPUs a target's processes may run on: CPU 1, unless ``--proxy-cpus`` says
    otherwise or the gateway runs several workers (then every CPU: it shares the harness's)."""
    if opts.proxy_cpus:
        if opts.proxy_cpus == "all":
            return set(range(os.cpu_count() or 1))
        return {int(c) for c in opts.proxy_cpus.split(",") if c.strip()}
    if target.startswith("gateway") and gateway_workers(opts) > 1:
        return set(range(os.cpu_count() or 1))
    return {PROXY_CPU}


def target_label(target: str, opts: argparse.Namespace) -> str:
    """The target's name with what sets its numbers apart (workers, a core shared)."""
    notes = []
    if target.startswith("gateway") and gateway_workers(opts) > 1:
        notes.append(f"{gateway_workers(opts)} workers")
    if target != "direct" and HARNESS_CPU in proxy_cpus(target, opts):
        notes.append("harness shares a core")
    return f"{target} ({', '.join(notes)})" if notes else target


def make_proxy(
    target: str,
    upstream_port: int,
    workdir: Path,
    opts: argparse.Namespace,
    queries: list[str] | None = None,
) -> Proxy | None:
    proxy = _make_proxy(target, upstream_port, workdir, opts, queries or [])
    if proxy is not None:
        proxy.cpus = proxy_cpus(target, opts)
    return proxy


def _make_proxy(
    target: str, upstream_port: int, workdir: Path, opts: argparse.Namespace, queries: list[str]
) -> Proxy | None:
    if target == "direct":
        return None
    if target == "nginx":
        return NginxProxy(upstream_port, workdir)
    if target == "litellm":
        return LiteLLMProxy(upstream_port, workdir, queries, shlex.split(opts.litellm_args))
    if target in FloorProxy.SCRIPTS:
        return FloorProxy(upstream_port, workdir, [], {}, target)
    args, env = _split_gateway_args(opts.gateway_args)
    if target == "gateway-pool":
        url = f"http://127.0.0.1:{upstream_port}/v1"
        pool = [{"name": name, "url": url} for name in ("a", "b")]
        route = {"name": "default", "prefix": "/v1", "upstreams": pool}
        env["GATEWAY_ROUTES"] = json.dumps([route])
        return GatewayProxy(upstream_port, workdir, args, env, target)
    if target == "gateway-features":
        # Resume and the cache on (the memory store): what the features cost a stream
        # that uses them (each request leads: the bench's streams are never cached).
        url = f"http://127.0.0.1:{upstream_port}/v1"
        route = {"name": "default", "prefix": "/v1", "upstream": url, "resume": True}
        route |= {"cache": True, "cache_max_entry_bytes": 1024}
        env["GATEWAY_ROUTES"] = json.dumps([route])
        return GatewayProxy(upstream_port, workdir, args, env, target)
    if target.startswith("gateway-"):
        env["GATEWAY_UPSTREAM_TRANSPORT"] = target.split("-", 1)[1]
    return GatewayProxy(upstream_port, workdir, args, env, target)


async def warm_up(port: int, gateway: bool, model_route: bool = False) -> None:
    tally = Tally(gateway=gateway, keep_latency=False, model_route=model_route)
    await drive_keepalive_count(port, tally, 20, WARM_UP_QUERIES[0], 5, limit_s=30)
    tally2 = Tally(gateway=gateway, keep_latency=False, model_route=model_route)
    await drive_streams(port, tally2, 20, WARM_UP_QUERIES[1], 5, 0.1, 30)
    if tally.failed or tally2.failed:
        raise RuntimeError(f"warm-up failed: {dict(tally.failures)} {dict(tally2.failures)}")


def _machine() -> dict[str, Any]:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    nginx_version = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        nginx_version = subprocess.run(
            [NGINX, "-v"], capture_output=True, text=True, timeout=5
        ).stderr.strip()
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git": rev,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_model": platform.processor() or _cpu_model(),
        "nginx": nginx_version,
        "proxy_python": _proxy_python(),
    }


def _proxy_python() -> str:
    """The proxies' interpreter: its path, version, and what shapes its speed."""
    python = GatewayProxy.python()
    probe = (
        "import sys, sysconfig; print(sys.version.split()[0], sys.base_prefix, "
        "'libpython shared' if sysconfig.get_config_var('Py_ENABLE_SHARED') else 'static', "
        "sysconfig.get_config_var('OPT'))"
    )
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=10)
        return f"{python}: {out.stdout.strip()}"
    return python


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return ""


def _write_json(path: Path, report: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return path


async def run_target(
    sid: int,
    target: str,
    scale: Scale,
    upstream: Upstream,
    workdir: Path,
    opts: argparse.Namespace,
    streams: int = 0,
) -> dict[str, Any]:
    """One scenario (or one capacity trial of ``streams``) against a fresh, warmed-up target."""
    proxy = make_proxy(target, upstream.port, workdir, opts, all_queries(scale))
    model_route = target == "litellm"
    port = upstream.port
    try:
        if proxy is not None:
            proxy.start()
            await proxy.wait_ready()
            port = proxy.port
        await warm_up(port, guarded(target), model_route)
        gc.collect()
        gc.disable()
        spies: list[subprocess.Popen[bytes]] = []
        if opts.profile and sid != 7 and proxy is not None and target.startswith("gateway"):
            spies = await _start_profile(proxy, scale, opts)
        tally = Tally(gateway=guarded(target), model_route=model_route)
        try:
            extra = await run_scenario(sid, scale, port, tally, upstream, proxy, streams)
        finally:
            gc.enable()
            for spy in spies:
                stop_py_spy(spy)
    finally:
        if proxy is not None:
            proxy.stop()
    summary = summarize(sid, scale, tally, extra)
    label = target_label(target, opts)
    if label != target:
        summary["label"] = label
    return summary


async def _start_profile(
    proxy: Proxy, scale: Scale, opts: argparse.Namespace
) -> list[subprocess.Popen[bytes]]:
    for stale in ("profile.txt", "profile.svg"):
        (RESULTS / stale).unlink(missing_ok=True)
    seconds = int(scale.ramp + scale.events / scale.rate + 120)
    spy_args = ["--native"] if opts.native else []
    spies = [
        start_py_spy(proxy.main_pid(), RESULTS / name, fmt, opts.rate, seconds, spy_args)
        for name, fmt in (("profile.txt", "raw"), ("profile.svg", "flamegraph"))
    ]
    await asyncio.sleep(1.0)  # py-spy attaches
    return spies


def _progress(target: str, summary: dict[str, Any], prefix: str = "") -> None:
    late = summary.get("late_starts")
    print(
        f"   {prefix}{target:16} ok {summary['ok']}/{summary['streams']}"
        f"  events/s {_fmt(summary['events_per_s'], '.0f')}"
        f"  p99 {_fmt(summary['latency_p99_ms'], '.2f')} ms"
        f"  CPU us/ev {_fmt(summary['cpu_us_per_event'], '.1f')}"
        f"  harness CPU {_fmt(summary['harness_cpu_pct'], '.0f')}%"
        + (
            f" (all open: {_fmt(summary.get('harness_plateau_cpu_pct'), '.0f')}%)"
            if summary.get("harness_plateau_cpu_pct") is not None
            else ""
        )
        + f"  other processes {_fmt(summary['foreign_cpu_pct'], '.0f')}%"
        + (f"  late starts {late}" if late else "")
        + f"  failures {summary['failures']} {summary['failure_reasons'] or ''}",
        flush=True,
    )


# ---------------------------------------------------------------------------------------------
# Scenario 7: the capacity search (streams per core); the rules are in capacity.py
# ---------------------------------------------------------------------------------------------

_TRIAL_KEYS = (
    "n",
    "passed",
    "verdict_reasons",
    "ok",
    "streams",
    "failures",
    "failure_reasons",
    "failure_samples",
    "aborted",
    "late_starts",
    "start_lag_max_ms",
    "latency_p50_ms",
    "latency_p99_ms",
    "added_p99_ms",
    "ttfb_p50_ms",
    "ttfb_p99_ms",
    "events_per_s",
    "cpu_us_per_event",
    "harness_cpu_pct",
    "harness_plateau_cpu_pct",
    "foreign_cpu_pct",
    "wall_s",
)


async def capacity_trial(
    target: str,
    n: int,
    scale: Scale,
    upstream: Upstream,
    workdir: Path,
    opts: argparse.Namespace,
    baselines: dict[int, dict[str, Any]],
) -> dict[str, Any]:
    """One trial at N, judged; ``direct``'s trials are kept in ``baselines`` (one per N)."""
    baseline = None
    if target != "direct":
        baseline = baselines.get(n)
        if baseline is None:
            baseline = await capacity_trial("direct", n, scale, upstream, workdir, opts, baselines)
    summary = await run_target(7, target, scale, upstream, workdir, opts, streams=n)
    reasons = capacity.judge(summary, baseline)
    summary.update(n=n, passed=not reasons, verdict_reasons=reasons)
    if baseline is not None and summary.get("latency_p99_ms") is not None:
        base = baseline.get("latency_p99_ms")
        summary["added_p99_ms"] = None if base is None else summary["latency_p99_ms"] - base
    trial = {key: summary.get(key) for key in _TRIAL_KEYS}
    if target == "direct":
        baselines[n] = trial
    verdict = "pass" if not reasons else "FAIL: " + "; ".join(reasons)
    _progress(target, summary, prefix=f"N={n:<5} ")
    print(f"          {target} at N={n}: {verdict}", flush=True)
    return trial


async def capacity_search(
    target: str,
    scale: Scale,
    upstream: Upstream,
    workdir: Path,
    opts: argparse.Namespace,
    baselines: dict[int, dict[str, Any]],
    harness: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The largest N the target carries (capacity.py: growth, bisection, harness bound);
    ``harness`` is direct's own search result."""
    cap = opts.capacity_max or scale.cap_max
    harness_cap = False  # no point in trying more than the harness carries
    if harness and harness.get("hi") is not None and 0 < harness["capacity"] < cap:
        cap, harness_cap = harness["capacity"], True
    search = capacity.Search(
        start=opts.capacity_start or scale.cap_start, cap=cap, max_trials=opts.capacity_trials
    )
    deadline = time.monotonic() + opts.capacity_minutes * 60
    trials: list[dict[str, Any]] = []
    out_of_time = False
    while (n := search.next_n()) is not None:
        if time.monotonic() > deadline:
            out_of_time = True
            break
        if target == "direct" and n in baselines:
            trial = baselines[n]
        else:
            trial = await capacity_trial(target, n, scale, upstream, workdir, opts, baselines)
        trials.append(trial)
        search.record(n, bool(trial["passed"]))
    by_n = {t["n"]: t for t in trials}
    failing = by_n.get(search.hi) if search.hi is not None else None
    why_harness = []
    notes = []
    if target != "direct":
        harness_hi = harness.get("hi") if harness else None
        why_harness = capacity.harness_bound(search.hi, failing, harness_hi)
        direct_there = baselines.get(search.hi) if search.hi is not None else None
        if direct_there and not direct_there["passed"] and not why_harness:
            notes.append(
                f"direct's own trial at N={search.hi} failed too, below direct's limit:"
                " a disturbed run?"
            )
    if search.hi is None and search.lo >= search.cap and harness_cap:
        why_harness.append(f"it carries direct's own limit, N={search.cap}")
    if why_harness:
        bound = "harness"
    elif search.hi is None and search.lo >= search.cap:
        bound = "cap"
    elif not search.resolved or out_of_time:
        bound = "budget"
    else:
        bound = "target"
    at_n = by_n.get(search.lo, {})
    result: dict[str, Any] = {
        "capacity": search.lo,
        "hi": search.hi,
        "bound": bound,
        "harness_bound_because": why_harness,
        "notes": notes,
        "resolution": capacity.resolution(search.lo),
        "trials_run": len(trials),
        "out_of_time": out_of_time,
        "at_capacity": {
            key: at_n.get(key)
            for key in (
                "added_p99_ms",
                "latency_p99_ms",
                "cpu_us_per_event",
                "events_per_s",
                "harness_plateau_cpu_pct",
                "foreign_cpu_pct",
            )
        },
        "failed_at_hi": failing.get("verdict_reasons") if failing else None,
        "trials": trials,
    }
    result["display"] = capacity.describe(result)
    label = target_label(target, opts)
    if label != target:
        result["label"] = label
    print(f"   => {label}: {result['display']} streams", flush=True)
    return result


def render_capacity(title: str, results: dict[str, dict[str, Any]]) -> str:
    cols = [
        ("target", 16, "<"),
        ("streams", 24, "<"),
        ("pass N", 7, ">"),
        ("fail N", 7, ">"),
        ("trials", 6, ">"),
        ("+p99@N", 7, ">"),
        ("CPU us/ev@N", 11, ">"),
        ("events/s@N", 10, ">"),
        ("harness@N", 9, ">"),
    ]
    lines = [f"Scenario 7: {title}"]
    lines.append(_row([name for name, _, _ in cols], cols))
    for target, r in results.items():
        at = r["at_capacity"]
        cells = [
            target,
            r["display"],
            str(r["capacity"]),
            _fmt(r["hi"], "d"),
            str(r["trials_run"]),
            _fmt(at.get("added_p99_ms"), "+.1f"),
            _fmt(at.get("cpu_us_per_event"), ".1f"),
            _fmt(at.get("events_per_s"), ".0f"),
            _fmt(at.get("harness_plateau_cpu_pct"), ".0f") + "%",
        ]
        lines.append(_row(cells, cols))
        if r.get("label"):
            lines.append(f"    {r['label']}")
        if target == "direct":
            lines.append("    (direct: what the harness itself drives; +p99 over zero)")
        if r["failed_at_hi"]:
            lines.append(f"    failed at N={r['hi']}: {'; '.join(r['failed_at_hi'])}")
        if r["harness_bound_because"]:
            lines.append(f"    harness-bound: {'; '.join(r['harness_bound_because'])}")
        for note in r.get("notes", []):
            lines.append(f"    note: {note}")
        if r["bound"] == "budget":
            lines.append("    stopped by the trial or time budget before the resolution")
    lines.append(
        "  (+p99 over direct at the same N; harness@N: the harness core's CPU while all"
        " streams were open)"
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Repeated runs: medians and [min-max] (verdicts.py computes them)
# ---------------------------------------------------------------------------------------------

SUMMARY_COLUMNS: dict[int, list[tuple[str, str, str]]] = {
    1: [
        ("events/s", "events_per_s", ".0f"),
        ("+p99 ms", "added_p99_ms", ".1f"),
        ("CPU us/ev", "cpu_us_per_event", ".1f"),
        ("late", "late_starts", ".0f"),
        ("fail", "failures", ".0f"),
    ],
    3: [("MB/s", "mb_per_s", ".0f"), ("CPU us/ev", "cpu_us_per_event", ".1f")],
    4: [
        ("streams/s", "streams_per_s", ".0f"),
        ("CPU us/ev", "cpu_us_per_event", ".1f"),
        ("CPU us/req", "cpu_us_per_request", ".0f"),
        ("fail", "failures", ".0f"),
    ],
    5: [("KiB/stream", "rss_per_stream_kib", ".1f"), ("fail", "failures", ".0f")],
    6: [
        ("TTFB p50 ms", "ttfb_p50_ms", ".3f"),
        ("CPU us/ev", "cpu_us_per_event", ".1f"),
        ("fail", "failures", ".0f"),
    ],
    7: [("streams", "capacity", ".0f")],
    8: [
        ("requests/s", "streams_per_s", ".0f"),
        ("CPU us/req", "cpu_us_per_request", ".0f"),
        ("fail", "failures", ".0f"),
    ],
}
SUMMARY_COLUMNS[2] = SUMMARY_COLUMNS[1]


def _cell(stats: dict[str, Any] | None, spec: str) -> str:
    if not stats:
        return "-"
    low, high = format(stats["min"], spec), format(stats["max"], spec)
    median = format(stats["median"], spec)
    return median if low == high else f"{median} [{low}-{high}]"


def render_summary(sid: int, summary: dict[str, Any]) -> str:
    cols = SUMMARY_COLUMNS[sid]
    width = 26
    lines = [
        f"Scenario {sid}: {summary['title']}  (median [min-max] of {summary['runs']} runs)",
        f"{'target':16}  " + "  ".join(f"{name:>{width}}" for name, _, _ in cols),
    ]
    for target, metrics in summary["targets"].items():
        cells = [_cell(metrics.get(key), spec) for _, key, spec in cols]
        line = f"{target:16}  " + "  ".join(f"{cell:>{width}}" for cell in cells)
        harness_bound = sum(1 for b in metrics.get("bounds", []) if b == "harness")
        if harness_bound:
            line += f"  (harness-bound in {harness_bound} of {len(metrics['bounds'])} runs)"
        lines.append(line)
        if metrics.get("label"):
            lines.append(f"    {metrics['label']}")
    for gw, checks in summary["checks"].items():
        if checks:
            lines.append(render_checks(gw, checks))
    for gw, checks in summary["relay_checks"].items():
        for c in checks:
            if c.get("median") is None:
                continue
            lines.append(
                f"  (issue 7, info) {gw}: {c['check']} = {_shown(c['median'])}"
                f" [{_shown(c.get('min'))}-{_shown(c.get('max'))}]  (was: {c['op']} {c['limit']})"
            )
    for gw, infos in summary.get("info", {}).items():
        for c in infos:
            lines.append(
                f"  (info) {gw}: {c['check']} = {_shown(c['median'])}"
                f" [{_shown(c.get('min'))}-{_shown(c.get('max'))}]"
            )
    return "\n".join(lines)


def _with_added(results: dict[str, dict[str, Any]]) -> None:
    """Each target's latency percentiles over direct's in the same scenario and run."""
    for target, r in results.items():
        if target == "direct" or "latency_p50_ms" not in r:
            continue
        r["added_p50_ms"] = verdicts.added(results, target, "latency_p50_ms")
        r["added_p99_ms"] = verdicts.added(results, target, "latency_p99_ms")


async def run_once(
    scale: Scale, upstream: Upstream, workdir: Path, opts: argparse.Namespace, heading: str
) -> tuple[dict[str, Any], list[str]]:
    """Every selected scenario once, each target fresh; the run's JSON and printed blocks."""
    run: dict[str, Any] = {"scenarios": {}}
    printed: list[str] = []
    for sid in opts.scenarios:
        title = _title(sid, scale)
        print(f"\n== {heading}scenario {sid}: {title}", flush=True)
        results: dict[str, dict[str, Any]] = {}
        if sid == 7:
            baselines: dict[int, dict[str, Any]] = {}
            for target in ["direct", *(t for t in opts.targets if t != "direct")]:
                print(f"-- capacity of {target_label(target, opts)}", flush=True)
                results[target] = await capacity_search(
                    target, scale, upstream, workdir, opts, baselines, results.get("direct")
                )
        else:
            for target in opts.targets:
                results[target] = await run_target(sid, target, scale, upstream, workdir, opts)
                _progress(target, results[target])
            _with_added(results)
        scenario: dict[str, Any] = {
            "title": title,
            "targets": results,
            "checks": {},
            "relay_checks": {},
            "info": {},
        }
        block = [render_capacity(title, results) if sid == 7 else render_table(sid, title, results)]
        for gw in [t for t in opts.targets if guarded(t)]:
            if sid == 7:
                info = verdicts.capacity_ratios(results, gw)
                scenario["info"][gw] = info
                block += [f"  (info) {gw}: {c['check']} = {_shown(c['value'])}" for c in info]
                continue
            ratios = render_ratios(sid, results, gw)
            if ratios:
                block.append(ratios + "  (info)")
            checks = verdicts.checks(sid, results, gw)
            scenario["checks"][gw] = checks
            if checks:
                block.append(render_checks(gw, checks))
            old = verdicts.relay_checks(sid, results, gw)
            scenario["relay_checks"][gw] = old
            if old:
                block.append(render_checks(gw, old, info=True))
        run["scenarios"][str(sid)] = scenario
        printed.append("\n".join(block))
        print("\n" + printed[-1], flush=True)
    return run, printed


async def main_async(opts: argparse.Namespace) -> int:
    scale = QUICK if opts.quick else Scale()
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None
    loop.add_signal_handler(signal.SIGTERM, main_task.cancel)  # clean up the proxies
    upstream = Upstream(loop)
    await upstream.start()
    workdir = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    report: dict[str, Any] = {
        "machine": _machine(),
        "args": {
            "scenarios": opts.scenarios,
            "targets": opts.targets,
            "quick": opts.quick,
            "repeat": opts.repeat,
            "gateway_args": opts.gateway_args,
            "litellm_args": opts.litellm_args,
            "proxy_cpus": opts.proxy_cpus,
            "capacity": {
                "start": opts.capacity_start or scale.cap_start,
                "max": opts.capacity_max or scale.cap_max,
                "trials": opts.capacity_trials,
                "minutes_per_target": opts.capacity_minutes,
            },
            "profile": opts.profile,
        },
        "scale": scale.__dict__,
        "scenarios": {},
        "runs": [],
    }
    if "litellm" in opts.targets:
        report["machine"]["litellm"] = litellm_peer.VERSION
    print(f"proxies run on {report['machine']['proxy_python']}", flush=True)
    printed: list[str] = []
    RESULTS.mkdir(parents=True, exist_ok=True)
    try:
        if "litellm" in opts.targets:
            litellm_peer.ensure_venv()  # install once, before anything is measured
        for index in range(opts.repeat):
            heading = f"run {index + 1}/{opts.repeat}: " if opts.repeat > 1 else ""
            run, blocks = await run_once(scale, upstream, workdir, opts, heading)
            report["runs"].append(run)
            if index == 0:
                report["scenarios"] = run["scenarios"]
                printed = blocks
        if opts.profile and (RESULTS / "profile.txt").exists():
            profile = summarize_profile(RESULTS / "profile.txt")
            report["profile"] = profile
            printed.append(render_profile(profile))
            print("\n" + printed[-1])
            print(f"\nflame graph: {RESULTS / 'profile.svg'}")
    finally:
        if upstream.server is not None:
            upstream.server.close()
        shutil.rmtree(workdir, ignore_errors=True)
    summary = verdicts.summarize_runs(report["runs"])
    report["summary"] = summary
    if opts.repeat > 1:
        printed = [render_summary(int(sid), s) for sid, s in summary.items()]
        failed = any(verdicts.failed(s["checks"]) for s in summary.values())
    else:
        failed = any(verdicts.failed(s["checks"]) for s in report["scenarios"].values())
    out = _write_json(Path(opts.json), report)
    print("\n" + "=" * 100)
    print("\n\n".join(printed))
    print(f"\nresults: {out}")
    return 1 if failed else 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scenarios",
        default="1,2,3,4,5,6",
        help="comma-separated, 1-7 (7: the capacity search, also --capacity)",
    )
    parser.add_argument(
        "--targets", default="direct,nginx,gateway", help=f"comma-separated of {', '.join(TARGETS)}"
    )
    parser.add_argument("--quick", action="store_true", help="scaled down, to iterate quickly")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="K",
        help="run the scenarios K times (fresh targets each time): medians, [min-max], "
        "verdicts on the medians",
    )
    parser.add_argument(
        "--capacity",
        action="store_true",
        help="add scenario 7, the capacity search (streams per core); alone if no --scenarios",
    )
    parser.add_argument(
        "--capacity-start",
        type=int,
        default=0,
        metavar="N",
        help=f"first N of the capacity search (default {capacity.STREAMS_START}, quick 50)",
    )
    parser.add_argument(
        "--capacity-max",
        type=int,
        default=0,
        metavar="N",
        help=f"largest N it tries (default {capacity.STREAMS_CAP}, quick 800)",
    )
    parser.add_argument(
        "--capacity-trials",
        type=int,
        default=capacity.MAX_TRIALS,
        metavar="K",
        help="at most K trials per target (direct's baselines at other N not counted)",
    )
    parser.add_argument(
        "--capacity-minutes",
        type=float,
        default=20.0,
        metavar="M",
        help="stop a target's search after M minutes (its answer is then unresolved)",
    )
    parser.add_argument(
        "--gateway-args",
        default="",
        help='extra gateway flags and NAME=value env, e.g. "GATEWAY_UPSTREAM_TRANSPORT=httpx"; '
        '"--workers N" (N > 1) also lets the gateway run on every CPU',
    )
    parser.add_argument(
        "--litellm-args", default="", help="extra flags for the litellm target's proxy command"
    )
    parser.add_argument(
        "--proxy-cpus",
        default="",
        metavar="LIST",
        help='CPUs the proxies run on, e.g. "1" (the default, the harness has 0) or "all"',
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run scenario 1 against the gateway under py-spy (results/profile.{txt,svg})",
    )
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument(
        "--native", action="store_true", help="--profile: also sample native frames (C code)"
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to SECONDS for other processes to leave the CPUs alone",
    )
    parser.add_argument("--json", default=str(RESULTS / "latest.json"), help="JSON output path")
    parser.add_argument(
        "--python",
        default="",
        help="interpreter for the gateway and the Python floors (default: .venv's), e.g. "
        "an optimized build's venv: make bench VENV=.venv-debian PYTHON=/usr/bin/python3.11",
    )
    opts = parser.parse_args(argv)
    global PROXY_PYTHON
    PROXY_PYTHON = opts.python
    if opts.profile:
        if opts.scenarios == parser.get_default("scenarios"):
            opts.scenarios = "1"
        if opts.targets == parser.get_default("targets"):
            opts.targets = "gateway"
        if opts.json == parser.get_default("json"):
            opts.json = str(RESULTS / "profile.json")
    if opts.capacity:
        if opts.scenarios == parser.get_default("scenarios"):
            opts.scenarios = "7"
        elif "7" not in opts.scenarios.split(","):
            opts.scenarios += ",7"
    if opts.repeat < 1:
        parser.error("--repeat must be at least 1")
    opts.scenarios = [int(s) for s in opts.scenarios.split(",") if s.strip()]
    opts.targets = [t.strip() for t in opts.targets.split(",") if t.strip()]
    for sid in opts.scenarios:
        if sid not in SCENARIO_TITLES:
            parser.error(f"unknown scenario {sid}")
    for target in opts.targets:
        if target not in TARGETS:
            parser.error(f"unknown target {target}")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = _parse(argv)
    if not Path(NGINX).exists() and "nginx" in opts.targets:
        print(f"nginx not found at {NGINX}", file=sys.stderr)
        return 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else hard
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {HARNESS_CPU})
    else:
        print("warning: fewer than 2 CPUs, nothing is pinned", file=sys.stderr)
    runner: Callable[[Coroutine[Any, Any, int]], int] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    if opts.wait_quiet > 0:
        wait_for_quiet(opts.wait_quiet)
    try:
        return int(runner(main_async(opts)))
    except RuntimeError as exc:
        print(f"bench_gateway: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("bench_gateway: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
