"""Relaying an upstream's answer to the client: plain bodies unchanged, streams guarded.

A plain answer (anything but a 2xx stream in the protocol's framing) is
relayed as it is: status, headers, body; a 2xx JSON body (one JSON text, not
NDJSON lines) is read on the side for usage and model. A stream goes
through a ``StreamGuard``: upstream chunks are pulled only as fast as the
client takes them (backpressure: ``await send`` returns once uvicorn's
transport accepted the bytes), only event-aligned bytes are forwarded,
the deadlines run on one ``Watchdog``, and the annotation ends it.

While a retry on another upstream is still possible, the relay first holds
the answer (``hold_stream``, ``hold_plain``): the head is not sent until the
stream's first event (any other body: its first byte) has arrived, so an
answer that ends or breaks before that can still be retried; what was read
meanwhile goes out right after the head (``held=``), and time to first byte
is measured to that moment. The holding runs once per answer, never per event.

A client that stops taking bytes for ``timeouts.client_send`` is dropped:
its connection is aborted (a reset, nothing left queued) and the stream is
``client_stalled``. Once the response head is out, breaking the connection
is the only honest signal left for a failure the body cannot carry.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import NoReturn

import httpx

from gateway.capture.tap import Tap
from gateway.guard import Reason, StreamGuard, Usage
from gateway.guard.framing import framing_of
from gateway.guard.jsonparse import loads
from gateway.observe import RequestRecord
from gateway.policy.errors import RequestError
from gateway.proxy.buffered import (
    BufferedFailure,
    buffered_length,
    failure_body,
    read_upto,
    read_whole,
)
from gateway.proxy.connection import abort_connection
from gateway.proxy.deadlines import Watchdog
from gateway.proxy.exchange import AbortConnection, Exchange
from gateway.proxy.headers import (
    RESPONSE_DROP,
    STREAM_HEADERS,
    STREAM_RESPONSE_DROP,
    RawHeaders,
    strip_hop_by_hop,
)
from gateway.proxy.timer import Deadline
from gateway.proxy.upstream import ReadChunk, chunk_reader, drain_for_reuse

__all__ = [
    "Held",
    "Rescue",
    "Rescued",
    "hold_plain",
    "hold_stream",
    "one_json_text",
    "read_refusal",
    "relay_plain",
    "relay_stream",
    "response_headers",
]

_JSON_SNIFF_LIMIT = 8 * 1024 * 1024  # non-streamed bodies up to this size are read for usage
_DRAIN_SEND_SECONDS = 5.0  # while draining, how long a last send may wait for the client
#: Bytes of comment lines before a held stream's first event beyond which its head goes out.
_HOLD_LIMIT = 64 * 1024


def response_headers(
    response: httpx.Response, record: RequestRecord, drop: frozenset[bytes] = RESPONSE_DROP
) -> RawHeaders:
    headers = strip_hop_by_hop(response.headers.raw, drop)
    headers.append((b"x-request-id", record.request_id.encode()))
    if record.upstream is not None:
        headers.append((b"x-gateway-upstream", record.upstream.encode()))
    if record.upstream_request_id:
        headers.append((b"x-upstream-request-id", record.upstream_request_id.encode()))
    return headers


def drop_stalled_client(exchange: Exchange) -> NoReturn:
    """The client stopped taking bytes: abort its connection, never wait on it."""
    exchange.record.error = RequestError.CLIENT_STALLED
    abort_connection(exchange.scope)
    raise AbortConnection


async def _send_last(exchange: Exchange, body: bytes, draining: bool) -> None:
    """The response's last send, bounded by the client-send timeout (5 s while draining)."""
    seconds = exchange.route.timeouts.client_send
    if draining:
        seconds = min(seconds, _DRAIN_SEND_SECONDS)
    task = exchange.task
    loop = task.get_loop()
    deadline = Deadline(loop, task, loop.time() + seconds)
    try:
        await exchange.send({"type": "http.response.body", "body": body, "more_body": False})
    except asyncio.CancelledError:
        if not deadline.expired():
            raise
        raise TimeoutError from None
    finally:
        deadline.cancel()


# -- holding the head ---------------------------------------------------------------


@dataclass(slots=True)
class Held:
    """What was read of a 2xx answer before its head went out (a retry was still possible)."""

    #: The bytes that go out right after the head.
    out: bytes
    #: Why the answer failed before it started (None: it started, or ended complete).
    failure: Reason | None = None
    #: A stream's reader, to go on with.
    read: ReadChunk | None = None
    #: A plain body's chunks, to go on with.
    chunks: AsyncIterator[bytes] | None = None
    #: A bounded JSON answer read whole (``out`` is all of it; ``failure``: why it is
    #: cut or broken, for the 502 when no retry is left).
    whole: bool = False


@dataclass(slots=True)
class Rescued:
    """A cut stream that was continued (``gateway.proxy.continuation``): the guard whose
    verdict and annotation end it, the reader to drain, how many continuations, and
    the usage billed across the attempts: ``usage`` when a whole continuation reported
    its own, else ``billed``, every attempt's estimated."""

    guard: StreamGuard
    read: ReadChunk
    continued: int
    usage: Usage | None = None
    billed: Usage | None = None


#: Called with a relayed stream's guard once its verdict is incomplete; None: not rescued.
Rescue = Callable[[StreamGuard], Awaitable[Rescued | None]]


async def _ended() -> bytes:
    return b""


def _stream_reader(exchange: Exchange, response: httpx.Response) -> ReadChunk:
    """The stream's chunk reader, recorded by a capture tap when the route captures."""
    read = chunk_reader(response)
    config = exchange.route.config
    if config.capture != "off":  # once per stream: a route without captures pays nothing more
        record = exchange.record
        record.tap = tap = Tap(
            record.started,
            config.capture_max_bytes,
            exchange.spec.name,
            response.headers.get("content-type", ""),
        )
        read = tap.wrap(read)
    return read


#: Bytes of whole events let through that are held against the bound until sent (a
#: chunk's worth below it is not worth a second account).
_UNSENT_COUNTED = 64 * 1024


def _fed(exchange: Exchange, guard: StreamGuard, unsent: int = 0) -> None:
    """After a feed: the stream's unfinished event, and the ``unsent`` bytes it let
    through until they are sent, held against the worker's bound
    (``gateway.proxy.partial``); past it, ``guard`` ends ``limit_exceeded``."""
    partial = exchange.partial
    if partial is not None:
        exchange.partial_held = partial.fed(
            guard, exchange.partial_held, exchange.route.name, unsent
        )


def _unfed(exchange: Exchange) -> None:
    """The stream holds no unfinished event against the bound any more."""
    if exchange.partial is not None:
        exchange.partial.hold(exchange.partial_held, 0)
    exchange.partial_held = 0


async def hold_stream(exchange: Exchange, response: httpx.Response, guard: StreamGuard) -> Held:
    """Read a 2xx event stream into ``guard`` until its first event, its end or a failure.

    Nothing is sent. The first read must come within ``first_byte`` of the
    head, later ones within ``idle`` (the watchdog's deadlines); comment
    lines alone do not start a stream, up to ``_HOLD_LIMIT`` bytes of them.
    A failure leaves the guard with its verdict.

    A stage's ``HoldGate`` (``Exchange.hold_gate``) holds on past the first
    event until it is settled, within its bounds (past them the stream ends
    ``limit_exceeded``); an answer that fails while the gate holds it keeps
    nothing to send: the client gets its error (or its retry's answer) only.
    """
    read = _stream_reader(exchange, response)
    exchange.events.hold()  # its whole events reach the readers once the head is out
    gate = exchange.hold_gate
    loop = asyncio.get_running_loop()
    timeouts = exchange.timeouts
    total = exchange.total_deadline
    now = loop.time()
    limit = now + timeouts.first_byte
    if gate is not None:
        gate.restart()
        until, cap = now + gate.seconds, gate.max_bytes
    else:
        until, cap = total, _HOLD_LIMIT
    out: list[bytes] = []
    size = 0
    got = False
    try:
        while True:
            async with asyncio.timeout_at(min(limit, total, until)):
                chunk = await read()
            if not chunk:
                guard.eof()
                if guard.final:
                    out.append(guard.final)
                    guard.final = b""  # sent with the held bytes, not again at the end
                break
            got = True
            data = guard.feed(chunk)
            _fed(exchange, guard)
            if data:
                out.append(data)
                size += len(data)
            if guard.done or (guard.contract.events and (gate is None or gate.settled())):
                break
            if size > cap:
                if gate is not None:
                    guard.abort(Reason.LIMIT_EXCEEDED, gate.gave_up("bytes"))
                break
            limit = loop.time() + timeouts.idle
    except TimeoutError:
        now = loop.time()
        if now >= total:
            guard.abort(Reason.TOTAL_TIMEOUT)
        elif gate is not None and now >= until:
            guard.abort(Reason.LIMIT_EXCEEDED, gate.gave_up("time"))
        else:
            guard.abort(Reason.IDLE_TIMEOUT if got else Reason.FIRST_BYTE_TIMEOUT)
    except httpx.DecodingError:
        guard.abort(Reason.INVALID_SHAPE, "the upstream's content encoding is broken")
    except httpx.TransportError:
        guard.abort(Reason.UPSTREAM_DISCONNECT)
    finally:
        _unfed(exchange)  # counted again by the relay's first read, if it relays it
    verdict = guard.verdict
    failure = verdict.reason if verdict is not None and not verdict.complete else None
    if gate is not None and failure is not None:
        exchange.events.hold()  # nothing of a held answer that failed reaches anyone
        out = []
    return Held(b"".join(out), failure, read=read)


async def hold_plain(exchange: Exchange, response: httpx.Response, buffer_limit: int = 0) -> Held:
    """Read a 2xx answer's first body byte(s) within ``first_byte`` of its head; one
    that ``relay_plain`` reads whole first is read whole now, so that a cut or broken
    one can still be retried."""
    chunks = response.aiter_raw().__aiter__()
    loop = asyncio.get_running_loop()
    total = exchange.total_deadline
    try:
        async with asyncio.timeout_at(min(loop.time() + exchange.timeouts.first_byte, total)):
            first = await anext(chunks, b"")
    except TimeoutError:
        late = Reason.TOTAL_TIMEOUT if loop.time() >= total else Reason.FIRST_BYTE_TIMEOUT
        return Held(b"", late, chunks=chunks)
    except (httpx.TransportError, OSError):
        return Held(b"", Reason.UPSTREAM_DISCONNECT, chunks=chunks)
    length = _buffered_length(exchange, response, buffer_limit)
    if length is None:
        return Held(first, chunks=chunks)
    seen: list[bytes] = []
    try:
        async with asyncio.timeout_at(total):
            body = await read_whole(_recorded(first, chunks, seen), length)
    except TimeoutError:
        return Held(b"".join(seen), Reason.TOTAL_TIMEOUT, whole=True)
    except BufferedFailure as exc:
        return Held(b"".join(seen), exc.reason, whole=True)
    return Held(body, whole=True)


async def _recorded(
    first: bytes, chunks: AsyncIterator[bytes], seen: list[bytes]
) -> AsyncIterator[bytes]:
    if first:
        seen.append(first)
        yield first
    async for chunk in chunks:
        seen.append(chunk)
        yield chunk


async def _resume(held: Held) -> AsyncIterator[bytes]:
    if held.out:
        yield held.out
    if held.chunks is not None:
        async for chunk in held.chunks:
            yield chunk


#: The most of a 400's body read to tell whether it says the prompt is too long.
_REFUSAL_LIMIT = 64 * 1024


async def read_refusal(response: httpx.Response) -> Held:
    """A 400's body (up to ``_REFUSAL_LIMIT``, then the rest goes on as ``chunks``)."""
    chunks = response.aiter_raw().__aiter__()
    out, cut = await read_upto(chunks, _REFUSAL_LIMIT)
    return Held(out, Reason.UPSTREAM_DISCONNECT if cut else None, chunks=chunks)


# -- plain answers ------------------------------------------------------------------


def one_json_text(content_type: str) -> bool:
    """A JSON media type of one JSON text (a stream framing's, NDJSON, is many: never
    parsed whole)."""
    return "json" in content_type and framing_of(content_type) is None


def _read_answer(exchange: Exchange, body: bytes) -> None:
    """Usage and model of a whole non-streamed 2xx JSON answer, into the record.

    An answer that does not parse is recorded as ``invalid_json``: the client
    got it unchanged, but it is not the clean 200 it looks like.
    """
    record = exchange.record
    try:
        obj = loads(body)
    except (ValueError, RecursionError):
        record.error = RequestError.INVALID_JSON
        return
    if isinstance(obj, dict):
        record.usage = exchange.spec.answer_usage(obj)
        record.upstream_model = exchange.spec.answer_model(obj)


async def _relay_buffered(
    exchange: Exchange, response: httpx.Response, draining: bool, held: Held | None, length: int
) -> None:
    """Read a bounded JSON answer whole, then send it, or a 502/504 if it is cut or broken."""
    record = exchange.record
    chunks = response.aiter_raw() if held is None else _resume(held)
    status, failure = response.status_code, None
    task = exchange.task
    deadline = Deadline(task.get_loop(), task, exchange.total_deadline)
    try:
        if held is not None and held.whole:  # read and checked while a retry was possible
            body = held.out
            if held.failure is not None:
                raise BufferedFailure(held.failure)
        else:
            body = await read_whole(chunks, length)
    except asyncio.CancelledError:
        if not deadline.expired():
            raise
        status, failure, record.error = 504, Reason.TOTAL_TIMEOUT, RequestError.UPSTREAM_TIMEOUT
    except BufferedFailure as exc:
        if exc.reason is Reason.TOTAL_TIMEOUT:
            status, failure, record.error = 504, exc.reason, RequestError.UPSTREAM_TIMEOUT
        else:
            status, failure, record.error = 502, exc.reason, RequestError(exc.reason.value)
    finally:
        deadline.cancel()
    if failure is None:
        headers = response_headers(response, record)
    else:
        body, headers = failure_body(exchange.spec.protocol, failure, record.request_id)
    record.status = status
    record.time_to_first_byte = time.monotonic() - record.started
    await exchange.send({"type": "http.response.start", "status": status, "headers": headers})
    try:
        await _send_last(exchange, body, draining)
    except TimeoutError:
        drop_stalled_client(exchange)
    record.bytes_out += len(body)
    exchange.response_done = True
    if failure is None:
        _read_answer(exchange, body)


def _buffered_length(exchange: Exchange, response: httpx.Response, limit: int) -> int | None:
    """The length of an answer to read whole first (``gateway.proxy.buffered``), or None."""
    if not limit or exchange.scope["method"] == "HEAD":  # a HEAD answer has no body
        return None
    return buffered_length(response, limit)


async def relay_plain(
    exchange: Exchange,
    response: httpx.Response,
    draining: bool,
    held: Held | None = None,
    *,
    buffer_limit: int = 0,
) -> None:
    """Relay a non-SSE answer unchanged (status, headers, body; ``held``: read so far).

    A 2xx JSON answer of known length up to ``buffer_limit`` is read whole first
    (``gateway.proxy.buffered``): a cut or unparseable one becomes a 502.
    """
    length = _buffered_length(exchange, response, buffer_limit)
    if length is not None:
        await _relay_buffered(exchange, response, draining, held, length)
        return
    send, record = exchange.send, exchange.record
    record.status = response.status_code
    await send(
        {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": response_headers(response, record),
        }
    )
    sniff: list[bytes] | None = (
        []
        if 200 <= response.status_code < 300
        and one_json_text(response.headers.get("content-type", ""))
        and not response.headers.get("content-encoding")
        else None
    )
    sniffed = 0
    task = exchange.task
    loop = task.get_loop()
    client_send = exchange.route.timeouts.client_send
    total = exchange.total_deadline
    send_deadline = float("inf")
    # One timer for the request's total deadline, brought forward to the client-send
    # deadline while a send waits (no asyncio.timeout per chunk).
    deadline = Deadline(loop, task, total)
    failed: RequestError | None = None
    try:
        async for chunk in response.aiter_raw() if held is None else _resume(held):
            if not chunk:
                continue
            if record.time_to_first_byte is None:
                record.time_to_first_byte = time.monotonic() - record.started
            if sniff is not None:
                sniffed += len(chunk)
                if sniffed <= _JSON_SNIFF_LIMIT:
                    sniff.append(chunk)
                else:
                    sniff = None
            send_deadline = loop.time() + client_send
            deadline.move(min(send_deadline, total))
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            deadline.move(total)
            record.bytes_out += len(chunk)
    except asyncio.CancelledError:
        if not deadline.expired():
            raise
        failed = RequestError.UPSTREAM_TIMEOUT
    except (httpx.TransportError, OSError):
        failed = RequestError.UPSTREAM_DISCONNECT
    finally:
        deadline.cancel()
    if failed is not None:
        if failed is RequestError.UPSTREAM_TIMEOUT and loop.time() >= send_deadline:
            drop_stalled_client(exchange)
        # Headers are out: the only honest signal left is to break the connection.
        record.error = failed
        raise AbortConnection
    try:
        await _send_last(exchange, b"", draining)
    except TimeoutError:
        drop_stalled_client(exchange)
    exchange.response_done = True
    if sniff:
        _read_answer(exchange, b"".join(sniff))


# -- event streams --------------------------------------------------------------------


class _Timing:
    """Time to first byte and first token, and the gaps between output-carrying reads.

    ``seen`` is public so that the relay's per-chunk loop can compare it with the
    contract's count itself and call ``content`` only when a read carried output.
    """

    __slots__ = ("_last", "_record", "seen")

    def __init__(self, record: RequestRecord) -> None:
        self._record = record
        self._last: float | None = None
        self.seen = 0

    def content(self, content_events: int) -> None:
        """A read carried output (``content_events`` grew): a token time."""
        self.seen = content_events
        now = time.monotonic()
        record = self._record
        if self._last is None:
            record.time_to_first_token = now - record.started
        else:
            record.chunk_gaps.append(now - self._last)
        self._last = now

    def first_byte(self) -> None:
        record = self._record
        if record.time_to_first_byte is None:
            record.time_to_first_byte = time.monotonic() - record.started


class _Sender:
    """Sends body bytes to the client, keeping the watchdog and the byte count right."""

    __slots__ = ("_loop", "_record", "_send", "watchdog")

    def __init__(
        self, exchange: Exchange, watchdog: Watchdog, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._send = exchange.send
        self._record = exchange.record
        self._loop = loop
        self.watchdog = watchdog

    async def body(self, data: bytes) -> None:
        watchdog = self.watchdog
        # The wait for the client is the client's, not upstream silence: while it
        # lasts the watchdog runs the client-send clock instead of the idle one.
        watchdog.sending = True
        await self._send({"type": "http.response.body", "body": data, "more_body": True})
        watchdog.sending = False
        self._record.bytes_out += len(data)
        watchdog.last = self._loop.time()


async def relay_stream(
    exchange: Exchange,
    response: httpx.Response,
    guard: StreamGuard,
    *,
    annotate: bool,
    draining: bool,
    held: Held | None = None,
    rescue: Rescue | None = None,
) -> None:
    """Relay a 2xx event stream through ``guard``, then append the annotation.

    ``held``: what ``hold_stream`` read (already fed to ``guard``), sent right
    after the head; a stream it saw end goes straight to its annotation.
    ``rescue``: a route that continues cut streams; asked once the verdict is
    incomplete, it may relay a continuation whose verdict then ends the stream.
    """
    send, record = exchange.send, exchange.record
    record.status = response.status_code
    await send(
        {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": [*response_headers(response, record, STREAM_RESPONSE_DROP), *STREAM_HEADERS],
        }
    )
    exchange.events.begin(held is not None)
    loop = asyncio.get_running_loop()
    reader = _stream_reader(exchange, response) if held is None else held.read
    assert reader is not None
    read = _ended if held is not None and guard.done else reader
    timing = _Timing(record)
    # One timer for the first-byte, idle, client-send and total deadlines, re-armed
    # only when it fires: cheaper than rescheduling a timeout on every chunk.
    watchdog = Watchdog(loop, exchange.stop, exchange.timeouts, exchange.total_deadline)
    sender = _Sender(exchange, watchdog, loop)
    contract = guard.contract
    try:
        if held is not None:
            watchdog.first_chunk()
            if contract.content_events != timing.seen:
                timing.content(contract.content_events)
            if held.out:
                timing.first_byte()
                await sender.body(held.out)
        # Once per upstream read: the contract's counters are read directly, and the
        # timing is called only when a read carried output.
        while True:
            chunk = out = b""  # an idle stream keeps no chunk while it waits
            chunk = await read()
            if not chunk:
                guard.eof()
                if guard.final:
                    watchdog.last = loop.time()
                    await sender.body(guard.final)
                break
            if watchdog.got_chunk:
                watchdog.last = loop.time()
            else:
                watchdog.first_chunk()
            out = guard.feed(chunk)
            _fed(exchange, guard, len(out))
            if contract.content_events != timing.seen:
                timing.content(contract.content_events)
            if out:
                if record.time_to_first_byte is None:
                    timing.first_byte()
                await sender.body(out)
                if len(out) > _UNSENT_COUNTED:
                    _fed(exchange, guard)  # sent: only its unfinished event is held
            if contract.verdict is not None:
                break
    except httpx.DecodingError:
        guard.abort(Reason.INVALID_SHAPE, "the upstream's content encoding is broken")
    except httpx.TransportError:
        guard.abort(Reason.UPSTREAM_DISCONNECT)
    except asyncio.CancelledError:
        if not exchange.claim_stop():
            raise
        assert exchange.stop_reason is not None
        # Bytes whose send was interrupted may never have reached the client: a
        # verdict reached on them (even "complete") does not stand.
        guard.abort(exchange.stop_reason, force=watchdog.sending)
    finally:
        watchdog.cancel()
        _unfed(exchange)
    rescued = None
    verdict = guard.verdict
    if rescue is not None and verdict is not None and not verdict.complete:
        rescued = await rescue(guard)
    if rescued is None:
        await end_stream(exchange, guard, reader, timing, annotate=annotate, draining=draining)
        return
    await end_stream(
        exchange,
        rescued.guard,
        rescued.read,
        timing,
        annotate=annotate,
        draining=draining,
        continued=rescued.continued,
    )
    if rescued.usage is not None:
        exchange.record.usage = rescued.usage
    exchange.record.billed = rescued.billed


async def end_stream(
    exchange: Exchange,
    guard: StreamGuard,
    reader: ReadChunk,
    timing: _Timing,
    *,
    annotate: bool,
    draining: bool,
    continued: int = 0,
) -> None:
    """The end of a relayed stream, once its verdict is reached: record the verdict;
    a client that left gets nothing more, a stalled one is dropped; else the trailer
    (the annotation) is the last send, and a complete upstream body is drained so that
    its connection can be reused."""
    record = exchange.record
    verdict = guard.verdict
    assert verdict is not None
    record.verdict = verdict
    record.upstream_model = guard.contract.model
    if exchange.stop_reason is Reason.CLIENT_DISCONNECT:
        return
    if exchange.stop_reason is Reason.CLIENT_STALLED:
        drop_stalled_client(exchange)
    words = " ".join(word() for word in exchange.trailer_words) if annotate else ""
    trailer = guard.annotation(record.request_id, continued, words) if annotate else b""
    if guard.withheld:  # the upstream's own error event, withheld for a continuation
        trailer = guard.withheld + trailer
    if trailer:
        timing.first_byte()
    exchange.response_done = True
    try:
        # A client that stopped reading must not hold the request (or the drain).
        await _send_last(exchange, trailer, draining)
    except TimeoutError:
        # What the verdict was reached on may still sit in the send buffer.
        record.verdict = guard.abort(Reason.CLIENT_STALLED, force=True)
        drop_stalled_client(exchange)
    record.bytes_out += len(trailer)
    if verdict.complete:
        await drain_for_reuse(reader)
