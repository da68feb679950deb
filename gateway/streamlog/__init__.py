"""A stream log on a request's way: the one design the cache and resume share.

A log (``gateway.store``) holds, for one answer:

- event 1, its **head**: the status and headers as the client got them
  (``head``); the head is not counted against the log's byte bound;
- then its body: a stream's whole events as its guard hands them out
  (``gateway.guard.whole``), a plain answer's body sends one event each;
- its ``End``: the trailer the client got after the last event, and fields.

A log belongs to ``gateway.proxy.owner.owner_of``; ``recorder`` stands in the exchange's ``send``
and writes the log as the answer goes to the client; ``reader`` sends a log to
a client again, from a cursor, with its live tail, each send within the
client-send bound. What the cache (``gateway.cache``) and resume
(``gateway.resume``) do differently is said in docs/architecture.md.
"""

from gateway.streamlog.head import decode_head, encode_head
from gateway.streamlog.reader import ClientSends, LogReader, send_within
from gateway.streamlog.recorder import Recorder

__all__ = [
    "ClientSends",
    "LogReader",
    "Recorder",
    "decode_head",
    "encode_head",
    "send_within",
]
