"""The leader's ``send``: what the client gets is also appended to the entry's log.

The head goes in as event 1 (``entry.encode_head``); then a stream's whole
events as its guard hands them out (the recorder is one of the exchange's
readers, ``gateway.guard.whole``), a plain answer's body sends one event each;
the last send, a stream's trailer, is kept apart for the log's end. A plain
answer's body is also kept (up to the log's bound) so that its finish can be
read once it is whole. ``extra`` headers (``X-Gateway-Cache``) go to the
client only, never into the log. Once the leader's client left while others
follow its answer (``detachment`` started), the sends go into the log alone.
"""

from __future__ import annotations

from starlette.types import Message, Send

from gateway.cache.entry import encode_head
from gateway.guard import Event, Framing, WholeEvents
from gateway.proxy.detach import Detachment
from gateway.proxy.headers import RawHeaders, get_header
from gateway.store import Writer

__all__ = ["Recorder"]


class Recorder:
    """``send`` that also appends the response to the leader's log: the head as event 1,
    each body send as one event; the last send (a stream's trailer) is kept apart."""

    __slots__ = (
        "_framing",
        "_send",
        "body",
        "detachment",
        "ended",
        "extra",
        "final",
        "headers",
        "size",
        "status",
        "whole",
        "writer",
    )

    def __init__(
        self,
        send: Send,
        writer: Writer | None,
        extra: RawHeaders,
        framing: Framing,
        whole: WholeEvents,
        detachment: Detachment | None = None,
    ) -> None:
        self._send = send
        self._framing = framing
        self.writer = writer
        self.extra = extra
        #: A plain answer's body, kept to read its finish (None: a stream, or too long).
        self.body: list[bytes] | None = None
        self.status = 0
        self.headers: RawHeaders = []
        self.size = 0
        self.final = b""
        self.ended = False
        self.detachment = detachment
        #: The exchange's readers: a guarded stream's whole events come from its guard.
        self.whole = whole

    def check(self, piece: bytes, event: Event) -> None:
        return None

    def take(self, piece: bytes, event: Event | None) -> None:
        """One whole event of a streamed answer, as the client gets it."""
        writer = self.writer
        if writer is not None:
            writer.append(piece)
            self.size += len(piece)

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        writer = self.writer
        if kind == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", ()))
            if writer is not None:
                writer.append(encode_head(self.status, self.headers))
                content_type = get_header(self.headers, b"content-type") or b""
                if not self._framing.is_stream(content_type.decode("latin-1")):
                    self.body = []
            message = {**message, "headers": [*self.headers, *self.extra]}
        elif kind == "http.response.body":
            body = message.get("body", b"")
            if message.get("more_body", False):
                if body and writer is not None and not self.whole.streaming:
                    writer.append(body)
                    self.size += len(body)
                    if self.body is not None:
                        self.body.append(body)
                        if writer.stopped:
                            self.body = None
            else:
                self.final = body
                self.ended = True
        await self._send(message)  # (a detached exchange's gate, below, keeps it)
