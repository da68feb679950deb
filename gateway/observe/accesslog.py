"""The access log: one JSON object per request on stdout.

Fields are the facts of the request (docs/wire-contract.md, "Where the
verdict is recorded"); never prompt or
completion text, never credentials or client keys.

A line is the standard library's JSON (compact, ASCII); ``encode_line``
makes it with orjson, several times faster, whenever orjson's bytes are the
same, and with the standard library otherwise (a test holds the two to the
same output over generated records).

While the gateway serves, lines are written by a thread of their own: a
stdout whose reader stalls (a full pipe, a stuck log shipper) blocks that
thread, never the event loop. Up to ``QUEUE_LINES`` lines wait for it;
beyond that lines are dropped and counted
(``gateway_access_log_dropped_lines_total``), and requests go on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import orjson

from gateway.logsetup import LogGate, utc_timestamp
from gateway.observe.record import Attempt, RequestRecord
from gateway.observe.writer_thread import WriterThread

# json.dumps with options builds a new encoder per call; one encoder serves every line.
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode
_dumps = orjson.dumps

__all__ = ["QUEUE_LINES", "AccessLog", "charged_fields", "encode_line", "log_fields"]

log = logging.getLogger("gateway")

#: Lines waiting for the writer thread (about 10 MB at most); more are dropped and counted.
QUEUE_LINES = 16_384


def _plain(value: float | None) -> bool:
    """Whether orjson writes this float as the standard library does: both write the
    shortest repr, but apart in exponent form (below 1e-4, from 1e16) and non-finite."""
    return value is None or value == 0.0 or 1e-4 <= abs(value) < 1e16


#: Where a line's floats are (``_ms``'s); an attempt's is its ``duration_ms``. A test
#: fails when ``log_fields`` has a float anywhere else.
FLOAT_FIELDS = ("ttfb_ms", "ttft_ms", "duration_ms")


def encode_line(fields: dict[str, Any]) -> str:
    """``fields`` (``log_fields``'s) as the standard library's compact ASCII JSON.

    orjson writes the same bytes when they are ASCII without DEL (the standard
    library escapes everything outside space..tilde; orjson writes UTF-8 and
    leaves DEL as it is) and every float is plain (``_plain``); it refuses what
    it cannot write the same (an integer beyond 64 bits, a lone surrogate)."""
    if all(_plain(fields[key]) for key in FLOAT_FIELDS) and all(
        _plain(a["duration_ms"]) for a in fields["attempts"]
    ):
        try:
            raw = _dumps(fields)
        except TypeError:
            return _encode(fields)
        if raw.isascii() and b"\x7f" not in raw:
            return raw.decode("ascii")
    return _encode(fields)


#: Longest client- or upstream-supplied string written to the log, in characters.
MAX_STRING = 256
CUT_MARK = "...(cut)"


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 3)


def bounded(value: str | None, limit: int = MAX_STRING) -> str | None:
    """A string from outside, cut to ``limit`` characters and marked when cut."""
    if value is None or len(value) <= limit:
        return value
    return value[:limit] + CUT_MARK


def log_fields(record: RequestRecord) -> dict[str, Any]:
    verdict = record.verdict
    usage = record.usage
    fields = {
        "time": utc_timestamp(time.time()),
        "request_id": record.request_id,
        "route": record.route or None,  # "": refused at the edge, under no route
        "method": record.method or None,
        "path": bounded(record.path) or None,
        "client": record.client,
        "client_name": record.client_name,
        "status": record.status,
        "model": bounded(record.model),
        "upstream_model": bounded(record.upstream_model),
        "user_agent": bounded(record.user_agent),
        "stream": record.stream,
        "outcome": str(verdict.outcome) if verdict else None,
        "reason": str(verdict.reason) if verdict else None,
        "finish_reasons": {str(k): bounded(v) for k, v in verdict.raw_finish_reasons.items()}
        if verdict
        else None,
        "ttfb_ms": _ms(record.time_to_first_byte),
        "ttft_ms": _ms(record.time_to_first_token),
        "duration_ms": _ms(record.duration),
        "bytes_in": record.bytes_in,
        "bytes_out": record.bytes_out,
        "usage": usage.as_dict() if usage is not None else None,
        "charged": charged_fields(record),
        "spend": None
        if record.spend is None
        else {
            "nanos": record.spend.nanos,
            "evidence": record.spend.evidence.value,
            "table": record.spend.table or None,
        },
        "schema": schema_fields(record),
        "upstream_request_id": record.upstream_request_id,
        "upstream": record.upstream,
        "attempts": [_attempt(a) for a in record.attempts],
        "rejected": record.rejected,
        "error": record.error,
        "continued": record.continued > 0,
        "not_continued": record.not_continued,
        "detached": record.detached,
        "transport": record.transport,
    }
    if record.websocket is not None:
        fields["websocket"] = record.websocket
    if record.cache is not None:
        fields["cache"] = record.cache
    return fields


def charged_fields(record: RequestRecord) -> dict[str, Any] | None:
    """The tokens a named client was charged (its limits'), as the access log and the
    receipt say them."""
    charge = record.charge
    if charge is None:
        return None
    return {"input": charge.input, "output": charge.output, "source": charge.source.value}


def schema_fields(record: RequestRecord) -> dict[str, Any] | None:
    """The schema verdict: the one that speaks for the request, and each part's result
    (None: nothing was checked). The access log's and the receipt's."""
    verdict = record.schema_verdict
    if verdict is None:
        return None
    out: dict[str, Any] = {"verdict": str(verdict.result), "kind": str(verdict.kind)}
    if verdict.pointer or verdict.event >= 0:
        out["pointer"] = verdict.pointer
        out["event"] = verdict.event
    if verdict.detail:
        out["detail"] = verdict.detail
    if verdict.tool:
        out["tool"] = bounded(verdict.tool)
    out["parts"] = [f"{part.kind}:{part.result}" for part in record.schema]
    if record.schema_holds:
        out["holds"] = record.schema_holds
    return out


def _attempt(a: Attempt) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "upstream": a.upstream,
        "result": a.result,
        "duration_ms": _ms(a.duration),
    }
    if a.cause is not None:
        fields["retry_cause"] = a.cause
    return fields


class AccessLog:
    """Writes one line per request; ``enabled=False`` makes it a no-op.

    Lines are buffered and flushed within ``flush_interval`` seconds (and at
    shutdown), so a busy gateway does not pay a write system call per request.
    Between ``start()`` and ``close()`` a flush only hands its batch to the
    writer thread; a batch the thread is too far behind to take is dropped and
    its lines are reported to ``on_dropped`` (and logged at most once a
    minute). Lines are ASCII (JSON escapes), so no string from outside, not
    even a lone surrogate, can make a write fail; a write that fails anyway
    drops its lines (the buffer never grows past ``max_buffered``) and is
    reported to ``on_error``.
    """

    name = "access_log"

    def __init__(
        self,
        enabled: bool = True,
        stream: TextIO | None = None,
        flush_interval: float = 0.1,
        max_buffered: int = 256,
        on_error: Callable[[str], None] | None = None,
        on_dropped: Callable[[int], None] = lambda lines: None,
        queue_lines: int = QUEUE_LINES,
    ) -> None:
        self.enabled = enabled
        self._stream = stream
        self._interval = flush_interval
        # A batch is handed over once it is as long as the queue: a late timer (a loaded
        # machine) must not gather one the writer thread can never take.
        self._max = min(max_buffered, queue_lines)
        self._lines: list[str] = []
        self._scheduled = False
        self.on_error = on_error
        self.on_dropped = on_dropped
        self._writer = WriterThread("gateway-access-log", self._write, queue_lines)
        #: The writer thread's way around ``sys.stdout``'s buffer: its descriptor, while
        #: ``sys.stdout`` is still the object it was taken from.
        self._fd: int | None = None
        self._fd_of: object = None
        self._dropped_log = LogGate()

    def observe(self, record: RequestRecord) -> None:
        self.write(record)

    def write(self, record: RequestRecord) -> None:
        if not self.enabled:
            return
        self._lines.append(encode_line(log_fields(record)))
        if len(self._lines) >= self._max:
            self.flush()
        elif not self._scheduled:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.flush()
                return
            self._scheduled = True
            loop.call_later(self._interval, self.flush)

    def flush(self) -> None:
        self._scheduled = False
        if not self._lines:
            return
        text = "\n".join(self._lines) + "\n"
        lines = len(self._lines)
        self._lines.clear()
        writer = self._writer
        if writer.running and writer.offer(text, lines):
            return
        if writer.running:  # the thread is too far behind
            self._dropped(lines)
        else:  # not started, or the thread has ended (after close): written here
            self._write(text)

    # -- the writer thread ------------------------------------------------------------

    def start(self) -> None:
        """From now on flushes go to a writer thread (the gateway's lifespan starts it).

        The thread writes to stdout's file descriptor itself, not through
        ``sys.stdout``'s buffer: a thread blocked on a stalled stdout then holds
        no lock that the interpreter's exit would wait for."""
        if not self.enabled or self._writer.running:
            return
        if self._stream is None:
            try:
                self._fd = sys.stdout.fileno()
                self._fd_of = sys.stdout
                sys.stdout.flush()  # what was written before goes first
            except (AttributeError, OSError, ValueError):
                self._fd = None  # no descriptor (a test's capture): through the stream
        self._writer.start()

    def close(self, timeout: float = 5.0) -> None:
        """Let the thread write what it was handed (for at most ``timeout`` seconds: a
        stalled stdout must not hold the shutdown), then stop it. Flush first, on the
        loop; this may block, so the lifespan runs it in a thread."""
        self._writer.close(timeout)

    def _write(self, text: str) -> None:
        out = self._stream if self._stream is not None else sys.stdout
        try:
            if self._fd is not None and out is self._fd_of:
                _write_all(self._fd, text.encode("ascii"))
            else:  # a stream of its own, or sys.stdout replaced since (a test's capture)
                out.write(text)
                out.flush()
        except Exception:
            if self.on_error is None:
                raise
            self.on_error(self.name)

    def _dropped(self, lines: int) -> None:
        self.on_dropped(lines)
        if self._dropped_log.open():
            log.warning(
                "the access log's output is not keeping up: %d line(s) dropped (counted in "
                "gateway_access_log_dropped_lines_total; logged at most once a minute)",
                lines,
            )


def _write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd``, waiting while it is full: a descriptor someone made
    non-blocking takes part of it and then refuses (EAGAIN) instead of waiting."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [])
