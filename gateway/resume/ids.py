"""Stream ids.

An id is 160 random bits (URL-safe base64), ``~``, and the second it was made
(hex), so an id whose log can only have expired is told apart from one that
never was without the store keeping anything once the TTL passed. (A stream's
owner is any log's: ``gateway.proxy.owner``.)

The ``~`` marks a log whose event 1 is its response head (``gateway.streamlog``):
the versions before wrote ``.`` and no head. Neither reads the other's ids (each
answers 404, as for an id that never was), so replicas of both on one Redis during
an upgrade never miscount a log's events.
"""

from __future__ import annotations

import re
import secrets
import time

__all__ = ["STREAM_ID", "made_at", "new_id"]

#: What a stream id looks like.
STREAM_ID = re.compile(r"[A-Za-z0-9_-]{27}~[0-9a-f]{1,12}")


def new_id() -> str:
    """160 random bits, then the second it was made (hex)."""
    return f"{secrets.token_urlsafe(20)}~{int(time.time()):x}"


def made_at(stream_id: str) -> int:
    return int(stream_id.rpartition("~")[2], 16)
