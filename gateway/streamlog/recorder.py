"""The recorder: the exchange's ``send`` that also writes the answer into its log.

It stands in ``Exchange.send`` and is one of the exchange's readers of whole
events (``gateway.guard.whole``). On the way to the client it

- appends the response head as event 1 (``head``; not counted against the
  log's byte bound), and adds ``extra`` headers for the client only (never
  into the log);
- appends a guarded stream's whole events as the guard hands them out, and a
  plain answer's body sends one event each (a plain body is also kept, up to
  the log's bound, so that its finish can be read once it is whole);
- keeps the last send (a stream's trailer) apart, for the log's end
  (``trailer``).

Once the client left while the answer is read on (its ``Detachment``
started), the sends go into the log alone. Two options, resume's:
``logged_first`` (every send waits until the log holds what the client got
before it) and ``on_stall`` (a client that stops reading is cut and the answer
read on into the log, rather than stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import ClassVar

from starlette.types import Message, Send

from gateway.guard import Event, Reason
from gateway.policy.errors import RequestError
from gateway.proxy.connection import abort_connection
from gateway.proxy.detach import Detachment
from gateway.proxy.exchange import Exchange
from gateway.proxy.headers import RawHeaders, get_header
from gateway.store import StoreError, Writer
from gateway.streamlog.head import encode_head

__all__ = ["Recorder"]


@dataclass(slots=True, eq=False)
class Recorder:
    """``send`` that also appends the response to its log (the head as event 1, then
    the body's events); the last send (a stream's trailer) is kept apart."""

    exchange: Exchange
    writer: Writer
    extra: RawHeaders
    #: The exchange's one detachment (made before this wraps the send).
    detachment: Detachment
    #: It refuses no event: ``WholeEvents`` does not ask it to check one.
    checks: ClassVar[bool] = False
    _: KW_ONLY
    logged_first: bool = False
    on_stall: Callable[[], None] | None = None
    #: Told each whole event as it is logged (None: no one asks).
    watch: Callable[[bytes], None] | None = field(init=False, default=None)
    #: A plain answer's body, kept to read its finish (None: a stream, or too long).
    body: list[bytes] | None = field(init=False, default=None)
    status: int = field(init=False, default=0)
    headers: RawHeaders = field(init=False, default_factory=list)
    #: Bytes of the body appended (kept or not).
    size: int = field(init=False, default=0)
    #: The last send's body, once it went out (``ended``).
    final: bytes = field(init=False, default=b"")
    ended: bool = field(init=False, default=False)
    #: Events were appended that the next send must wait for (``logged_first``).
    _unlogged: bool = field(init=False, default=False)
    #: Whole events taken since the last send: logged, all at once, before it goes out
    #: (or at the end), so a relayed chunk's events cost the log one call.
    _taken: list[bytes] = field(init=False, default_factory=list)
    _send: Send = field(init=False)

    def __post_init__(self) -> None:
        exchange = self.exchange
        self._send = exchange.send
        exchange.send = self
        exchange.events.add(self)

    # -- a reader of the stream's whole events ----------------------------------------

    def check(self, piece: bytes, event: Event) -> None:
        return None

    def take(self, piece: bytes, event: Event | None) -> None:
        """One whole event of a streamed answer, as the client gets it."""
        self._taken.append(piece)
        self.size += len(piece)
        self._unlogged = self.logged_first
        if self.watch is not None:
            self.watch(piece)

    # -- the send ------------------------------------------------------------------------

    async def __call__(self, message: Message) -> None:
        if self._taken:
            self._log_taken()
        kind = message["type"]
        writer = self.writer
        if kind == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", ()))
            head = encode_head(self.status, self.headers)
            writer.max_bytes += len(head)  # the bound is the body's
            writer.append(head)
            content_type = get_header(self.headers, b"content-type") or b""
            if not self.exchange.spec.framing.is_stream(content_type.decode("latin-1")):
                self.body = []
            if self.extra:
                message = {**message, "headers": [*self.headers, *self.extra]}
        elif kind == "http.response.body":
            body = message.get("body", b"")
            if message.get("more_body", False):
                if body and not self.exchange.events.streaming:
                    self._plain(body)
            else:
                self.final = body
                self.ended = True
        if self._unlogged and not self.detachment.active:
            # Logged before sent: a client never holds an event its log lacks (a
            # cursor it got is always one the log can serve, whoever dies).
            self._unlogged = False
            with contextlib.suppress(StoreError):
                await writer.flush()
        try:
            await self._send(message)  # (a detached exchange's gate keeps it)
        except asyncio.CancelledError:
            if not self._stalled():
                raise

    def _log_taken(self) -> None:
        taken, self._taken = self._taken, []
        self.writer.extend(taken)

    def _plain(self, body: bytes) -> None:
        writer = self.writer
        writer.append(body)
        self.size += len(body)
        if self.body is not None:
            self.body.append(body)
            if writer.stopped:
                self.body = None

    def _stalled(self) -> bool:
        """A client that stopped reading was cut: True when the answer goes on into the
        log (``on_stall``), False to let the cancellation through."""
        exchange = self.exchange
        if (
            self.on_stall is None
            or exchange.stop_reason is not Reason.CLIENT_STALLED
            or exchange.detach is None
            or not exchange.claim_stop()
        ):
            return False
        exchange.stop_reason = None
        exchange.record.error = RequestError.CLIENT_STALLED
        abort_connection(exchange.scope)
        self.on_stall()
        return True

    # -- the end -------------------------------------------------------------------------

    def trailer(self, streamed: bool) -> bytes:
        """The answer ended (or failed): stop reading it, and the trailer its log ends
        with: a stream's last send (after the bytes of an unended event), empty for a
        plain answer (its last send is its body's last event) or one never ended."""
        if self._taken:
            self._log_taken()
        exchange = self.exchange
        exchange.detach = None
        exchange.events.remove(self)
        self.detachment.end()
        if not self.ended:
            return b""
        if streamed:
            return exchange.events.pending + self.final
        if self.final:
            self._plain(self.final)
        return b""
