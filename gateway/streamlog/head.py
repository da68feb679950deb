"""A log's head: event 1, the response's status and headers as the client got them.

Kept as compact JSON (``{"status": 200, "headers": [[name, value], ...]}``,
latin-1 strings), the body's events follow it: a reader that counts the body's
events (a resume's cursor) starts after ``HEAD_EVENTS``.
"""

from __future__ import annotations

import json

from gateway.proxy.headers import RawHeaders

__all__ = ["HEAD_EVENTS", "decode_head", "encode_head"]

#: The log's events before its body: the head.
HEAD_EVENTS = 1


def encode_head(status: int, headers: RawHeaders) -> bytes:
    pairs = [[k.decode("latin-1"), v.decode("latin-1")] for k, v in headers]
    return json.dumps({"status": status, "headers": pairs}, separators=(",", ":")).encode()


def decode_head(data: bytes) -> tuple[int, RawHeaders]:
    head = json.loads(data)
    return int(head["status"]), [
        (k.encode("latin-1"), v.encode("latin-1")) for k, v in head["headers"]
    ]
