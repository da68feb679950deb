"""The response cache (issue 36): only an answer verified whole, replayed byte for byte.

``key`` makes a request's key and reads its controls (pure); ``entry`` says
what an entry's log holds (written by ``gateway.streamlog.Recorder``);
``judge`` decides whether an answer becomes an entry; ``admin`` answers the
DELETE of an entry; ``cache`` is a request's way through it all (hit, follow
a leader live, or lead and record) over the stream store (``gateway.store``).
Its two stages (``stage``: ``lookup`` before the limits, ``serve`` after them)
call ``plan``, ``peek``, ``serve`` and ``settle``.
"""

from __future__ import annotations

from gateway.cache.cache import Plan, ResponseCache
from gateway.cache.key import Controls, body_digest, controls_of, key_of
from gateway.observe import Metrics
from gateway.proxy.request_body import BodyParser
from gateway.settings import Settings
from gateway.store import StreamStore

__all__ = [
    "Controls",
    "Plan",
    "ResponseCache",
    "body_digest",
    "build_cache",
    "controls_of",
    "key_of",
]


def build_cache(
    settings: Settings, metrics: Metrics, bodies: BodyParser, store: StreamStore | None
) -> ResponseCache | None:
    """The response cache over the relay's stream store (the one resumable streams use,
    opened and closed by its owner); None when no route caches."""
    if store is None or not any(route.cache for route in settings.effective_routes()):
        return None
    return ResponseCache(
        store,
        metrics,
        bodies,
        settings.clients,
        lease=settings.stream_lease_seconds,
        annotate=settings.annotate,
    )
