"""The reader: one log sent to a client again, from a cursor, with its live tail.

``LogReader.read`` sends the log's head (event 1) as the response head, then
the body's events after the cursor as they are written, then the end's
trailer, and records what the access log says of a replayed answer (status,
first byte, bytes, the log's verdict). Every send goes through ``ClientSends``,
the one client-send bound: each within ``timeouts.client_send`` (a client that
stops reading is dropped, ``client_stalled``), and all of them, where the
owner asks, within a total. A subclass says what differs (the head it sends,
what it does when a wait brings no news, the trailer); store failures are its
caller's to answer, but where the owner reads on after an outage.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import NoReturn

from starlette.types import Message

from gateway.guard import Outcome, Reason, StreamGuard, Verdict
from gateway.guard.verdict import COMPLETE_REASONS
from gateway.protocols import ContractOptions, ProtocolSpec
from gateway.proxy.answers import drop_stalled_client
from gateway.proxy.connection import abort_connection
from gateway.proxy.exchange import AbortConnection, Exchange
from gateway.proxy.headers import RawHeaders
from gateway.proxy.timer import Deadline
from gateway.store import End, StoreError, StreamStore, Vanished
from gateway.streamlog.head import HEAD_EVENTS, decode_head

__all__ = ["ClientSends", "LogReader", "send_within"]

_REASONS = frozenset(str(reason) for reason in Reason)


class ClientSends:
    """Sends to a client: each within ``client_send``, all before the loop time
    ``until`` (one timer, moved, as the relay's plain answers do)."""

    __slots__ = ("_client_send", "_loop", "_send", "_total", "_until", "deadline")

    def __init__(self, exchange: Exchange, until: float = math.inf) -> None:
        loop = exchange.task.get_loop()
        self._loop = loop
        self._send = exchange.send
        self._client_send = exchange.route.timeouts.client_send
        self._total = until
        self._until = math.inf
        self.deadline = Deadline(loop, exchange.task, until)

    async def __call__(self, message: Message) -> None:
        self._until = self._loop.time() + self._client_send
        self.deadline.move(min(self._until, self._total))
        await self._send(message)
        self._until = math.inf
        self.deadline.move(self._total)

    def stalled(self) -> bool:
        """The deadline that passed was a send's: the client stopped reading."""
        return self._loop.time() >= self._until


class LogReader:
    """Sends one log to the exchange's client. ``jump`` body events the client holds
    are read over; ``skip`` more, that the log lacks so far, are dropped as they come."""

    def __init__(
        self, exchange: Exchange, store: StreamStore, stream_id: str, *, wait: float
    ) -> None:
        self.exchange = exchange
        self.store = store
        self.stream_id = stream_id
        self.wait = wait
        #: The loop time all sends end by (``math.inf``: none).
        self.until = math.inf
        #: The log's events read so far (the head's included).
        self.at = 0
        self.jump = 0
        self.skip = 0
        #: The response head went out.
        self.started = False
        self._send: ClientSends | None = None

    # -- what an owner says ----------------------------------------------------------------

    def head(self, status: int, headers: RawHeaders) -> tuple[int, RawHeaders]:
        """The response head sent for the log's."""
        return status, headers

    def render(self, events: list[bytes]) -> bytes:
        """What the client gets of a batch of the body's events."""
        return b"".join(events)

    async def quiet(self) -> bool:
        """A wait brought no news and no end: whether to read on."""
        return True

    async def outage(self) -> bool:
        """The store failed under the reader: whether to read on (once it is back)."""
        return False

    def trailer(self, end: End) -> bytes:
        """What the client gets of the log's end (may raise ``AbortConnection``)."""
        return end.trailer

    # -- sending -----------------------------------------------------------------------------

    async def read(self) -> bool:
        """Send the log from where this reader stands to its end: True once the end
        went out; False when nothing was sent (the log ended, or this reader gave up,
        before its head). Raises what the store raises (``Vanished``, ``Gone``,
        ``BeyondEnd``, ``StoreError``); ``AbortConnection`` once the client's bound
        passed (its connection dropped)."""
        send = self._send = ClientSends(self.exchange, self.until)
        try:
            while True:
                try:
                    batch = await self.store.read(self.stream_id, self.at, wait=self.wait)
                except StoreError:
                    if not await self.outage():
                        raise
                    continue
                if batch is None:
                    raise Vanished(self.stream_id)
                events = batch.events
                self.at += len(events)
                if events and not self.started:
                    await self.send_head(events[0])
                    events = events[1:]
                    jump, self.jump = self.jump, 0
                    if jump > len(events):  # the cursor lies further on: read from there
                        self.at = HEAD_EVENTS + jump
                        continue
                    events = events[jump:]
                if self.skip and events:
                    dropped = min(self.skip, len(events))
                    self.skip -= dropped
                    events = events[dropped:]
                if events:
                    data = self.render(events)
                    if data:
                        await self.body(data)
                elif not batch.events and batch.end is None and not await self.quiet():
                    if not self.started:
                        return False
                    raise AbortConnection
                if batch.end is not None:
                    if not self.started:
                        return False
                    await self.body(self.trailer(batch.end), more=False)
                    self.judged(batch.end)
                    return True
        except asyncio.CancelledError:
            if not send.deadline.expired():
                raise
            _timed_out(self.exchange, send)
        finally:
            send.deadline.cancel()
            self._send = None

    async def send_head(self, data: bytes | None) -> None:
        """Send the response head for the log's head ``data`` (None: the log has none,
        an owner's default is sent)."""
        status, headers = decode_head(data) if data is not None else (200, [])
        status, headers = self.head(status, headers)
        record = self.exchange.record
        await self._sends({"type": "http.response.start", "status": status, "headers": headers})
        record.status = status
        record.time_to_first_byte = time.monotonic() - record.started
        self.started = True

    async def body(self, data: bytes, *, more: bool = True) -> None:
        """One send of the body, within the client's bound."""
        await self._sends({"type": "http.response.body", "body": data, "more_body": more})
        self.exchange.record.bytes_out += len(data)

    async def _sends(self, message: Message) -> None:
        send = self._send
        if send is None:  # outside ``read`` (an ending alone): a bound of its own
            await send_within(self.exchange, message, self.until)
        else:
            await send(message)

    async def lost(self, spec: ProtocolSpec, annotate: bool) -> None:
        """End an answer whose log can no longer be read (its writer is lost to this
        reader): the protocol's error event and trailer, reason ``owner_lost``, as the
        relay ends a cut stream; never a reset."""
        exchange = self.exchange
        record = exchange.record
        guard = StreamGuard(spec.new_contract(ContractOptions()))
        guard.abort(Reason.OWNER_LOST, force=True)
        ending = guard.withheld
        if annotate:
            ending += guard.annotation(record.request_id)
        await self.body(ending, more=False)
        exchange.response_done = True
        record.stream = True
        record.verdict = guard.verdict

    def judged(self, end: End) -> None:
        """The access log's facts of a replayed answer: the log's verdict."""
        exchange = self.exchange
        record, fields = exchange.record, end.fields
        exchange.response_done = True
        record.stream = fields.get("streamed", "1") == "1"
        reason = fields.get("reason", "")
        if reason in _REASONS:
            complete = (
                fields.get("outcome") == str(Outcome.COMPLETE)
                or fields.get("stored") == "1"
                or Reason(reason) in COMPLETE_REASONS
            )
            outcome = Outcome.COMPLETE if complete else Outcome.INCOMPLETE
            record.verdict = Verdict(outcome=outcome, reason=Reason(reason))


async def send_within(exchange: Exchange, message: Message, until: float = math.inf) -> None:
    """One send to the client within the client-send bound (and ``until``)."""
    send = ClientSends(exchange, until)
    try:
        await send(message)
    except asyncio.CancelledError:
        if not send.deadline.expired():
            raise
        _timed_out(exchange, send)
    finally:
        send.deadline.cancel()


def _timed_out(exchange: Exchange, send: ClientSends) -> NoReturn:
    """A bound passed: the connection is dropped (``AbortConnection``)."""
    record = exchange.record
    if record.stream:
        record.verdict = Verdict(Outcome.INCOMPLETE, Reason.CLIENT_STALLED)
    if send.stalled():
        drop_stalled_client(exchange)  # raises AbortConnection
    record.status = record.status or 504
    abort_connection(exchange.scope)
    raise AbortConnection from None
