"""Whose a log is: the one owner of a cache entry and of a resumable stream.

The named client that made it (``client:{name}``), or without one a SHA-256
digest of the credential it presented (``key:{hex}``), or ``anonymous`` when it
presented none. A cache key of a client-scoped route includes it.
"""

from __future__ import annotations

import hashlib

from gateway.proxy.admission import presented_key
from gateway.proxy.exchange import Exchange
from gateway.settings import ANONYMOUS

__all__ = ["owner_of"]


def owner_of(exchange: Exchange) -> str:
    """Whose the request's logs are: the named client's, or the presented credential's."""
    name = exchange.caller.name
    if name != ANONYMOUS:
        return "client:" + name
    key = presented_key(exchange.scope["headers"])
    if key:
        return "key:" + hashlib.sha256(key).hexdigest()
    return "anonymous"
