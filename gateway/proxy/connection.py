"""The client connection as one request sees it: reset it, watch it, ask why the edge refused it.

``gateway.server.edge.EdgeProtocol`` offers these through a scope extension
(``ABORT_EXTENSION``); under any other server each helper says it cannot
(``False`` or ``None``) and the relay falls back on what ``receive()`` tells.
This module imports nothing of uvicorn, so the relay's layers do not either.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any, Final

__all__ = [
    "ABORT_EXTENSION",
    "WS_EXTENSION",
    "abort_connection",
    "edge_refusal",
    "peer_of",
    "watch_connection",
]

ABORT_EXTENSION: Final = "gateway.abort"
#: The scope extension (a dict) in which the WebSocket edge tells the app what the
#: connection saw (``gateway.server.wsedge``).
WS_EXTENSION: Final = "gateway.ws"


def abort_connection(scope: MutableMapping[str, Any]) -> bool:
    """Reset this request's client connection (RST; bytes still queued are dropped).

    False when the server offers no way to (not running under ``EdgeProtocol``).
    """
    extension = (scope.get("extensions") or {}).get(ABORT_EXTENSION)
    if not extension:
        return False
    extension["abort"]()
    return True


def watch_connection(
    scope: MutableMapping[str, Any], callback: Callable[[], None]
) -> Callable[[], None] | None:
    """Have ``callback`` called once when this request's client connection is lost
    (at once if it already is); returns the function that stops the watch.

    None when the server offers no way to (not running under ``EdgeProtocol``):
    then only ``receive()`` tells of a disconnect.
    """
    extension = (scope.get("extensions") or {}).get(ABORT_EXTENSION)
    if not extension:
        return None
    watch: Callable[[Callable[[], None]], Callable[[], None]] = extension["watch"]
    return watch(callback)


def edge_refusal(scope: MutableMapping[str, Any]) -> tuple[int, str] | None:
    """The status and reason the edge refused this request's body with, if it did.

    The app sees such a request end in a disconnect; it logs it with these.
    """
    extension = scope.get("extensions", {}).get(ABORT_EXTENSION)
    refused = extension.get("refused") if extension is not None else None
    return refused if isinstance(refused, tuple) else None


def peer_of(scope: MutableMapping[str, Any]) -> str | None:
    """The TCP peer's address (None where the server gives none)."""
    client = scope.get("client")
    return client[0] if client else None
