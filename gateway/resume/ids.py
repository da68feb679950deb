"""Stream ids and owners.

An id is 160 random bits (URL-safe base64) and the second it was made (hex),
so an id whose log can only have expired is told apart from one that never
was without the store keeping anything once the TTL passed. An owner is the
named client that made the stream, or a digest of the credential it presented.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time

from gateway.proxy.admission import presented_key
from gateway.proxy.exchange import Exchange
from gateway.settings import ANONYMOUS

__all__ = ["STREAM_ID", "made_at", "new_id", "owner_from", "owner_of"]

#: What a stream id looks like.
STREAM_ID = re.compile(r"[A-Za-z0-9_-]{27}\.[0-9a-f]{1,12}")


def new_id() -> str:
    """160 random bits, then the second it was made (hex)."""
    return f"{secrets.token_urlsafe(20)}.{int(time.time()):x}"


def made_at(stream_id: str) -> int:
    return int(stream_id.rpartition(".")[2], 16)


def owner_of(exchange: Exchange) -> str:
    """Whose a stream is: the named client's, or the presented credential's."""
    return owner_from(exchange.caller.name, exchange.scope["headers"])


def owner_from(name: str, headers: list[tuple[bytes, bytes]]) -> str:
    """``owner_of`` a client's name and a request's headers (a WebSocket's handshake)."""
    if name != ANONYMOUS:
        return f"client:{name}"
    key = presented_key(headers) or b""
    return "key:" + hashlib.sha256(key).hexdigest()[:32]
