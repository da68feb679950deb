"""Header rules of the proxy: hop-by-hop filtering, request ids, forwarding headers.

Headers are ASGI-style lists of (lower-case name, value) byte pairs.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable

__all__ = [
    "HOP_BY_HOP",
    "RawHeaders",
    "get_header",
    "pick_request_id",
    "strip_hop_by_hop",
]

RawHeaders = list[tuple[bytes, bytes]]

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)

_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._-]{1,128}$")


def get_header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower-case), or None."""
    for key, value in headers:
        if key == name:
            return value
    return None


def strip_hop_by_hop(
    headers: Iterable[tuple[bytes, bytes]], also: frozenset[bytes] = frozenset()
) -> RawHeaders:
    """Drop hop-by-hop headers, those named in ``Connection``, and ``also``."""
    pairs = [(k.lower(), v) for k, v in headers]
    named: set[bytes] = set()
    for key, value in pairs:
        if key == b"connection":
            named.update(t.strip().lower() for t in value.split(b",") if t.strip())
    drop = HOP_BY_HOP | named | also
    return [(k, v) for k, v in pairs if k not in drop]


def pick_request_id(client_value: bytes | None) -> str:
    """The client's X-Request-ID when it is 1-128 of [A-Za-z0-9._-], else a new one."""
    if client_value is not None and _REQUEST_ID.match(client_value):
        return client_value.decode("ascii")
    return uuid.uuid4().hex
