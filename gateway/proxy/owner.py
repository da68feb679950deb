"""Whose a request's logs and receipts are: the one owner function.

The named client that made it (``client:{name}``), or without one a SHA-256
digest of the credential it presented (``key:{hex}``), or ``anonymous`` when it
presented none. A cache entry, a resumable stream and a spend receipt belong
to it; a cache key of a client-scoped route includes it.
"""

from __future__ import annotations

import hashlib

from gateway.proxy.admission import presented_key
from gateway.proxy.exchange import Exchange
from gateway.proxy.headers import RawHeaders
from gateway.settings import ANONYMOUS

__all__ = ["owner_from", "owner_of"]


def owner_of(exchange: Exchange) -> str:
    """Whose the request's logs are: the named client's, or the presented credential's."""
    return owner_from(exchange.caller.name, exchange.scope["headers"])


def owner_from(name: str, headers: RawHeaders) -> str:
    """``owner_of`` a client's name and a request's headers (a WebSocket's handshake)."""
    if name != ANONYMOUS:
        return "client:" + name
    key = presented_key(headers)
    if key:
        return "key:" + hashlib.sha256(key).hexdigest()
    return "anonymous"
