"""The status board: what the ``/status`` page shows of finished requests, in bounded memory.

An observer. It keeps per-minute counts by (route, upstream, kind) for the
last ``minutes`` minutes (routes and upstreams come from the configuration,
kinds from ``KINDS``: a bounded table), and the last ``keep`` incomplete
streams as small frozen rows (time, request id, route, upstream, model cut
to ``MODEL_CHARS``, reason, bytes, duration). Nothing else of a request is
kept: never content, never a key, never a whole record.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from gateway.guard import Outcome
from gateway.observe.accesslog import bounded
from gateway.observe.record import RequestRecord

__all__ = ["FEATURE_KINDS", "KINDS", "IncompleteStream", "StatusBoard", "feature_kinds"]

#: What became of a request, as the board counts it.
KINDS = ("complete", "incomplete", "plain_ok", "plain_error", "refused")
#: What the features did with it, counted beside its kind: the cache's result
#: (``cache_hit``, ``cache_follow``, ``cache_miss``, ``cache_refused``, ``cache_bypass``),
#: a stream read on into its log after its client left, a cut stream continued.
FEATURE_KINDS = (
    "cache_hit",
    "cache_follow",
    "cache_miss",
    "cache_refused",
    "cache_bypass",
    "detached",
    "continued",
)
#: Longest model name kept (a client's claim: any text).
MODEL_CHARS = 128

#: (route, upstream or "", kind)
_Key = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class IncompleteStream:
    """One incomplete stream, as the page lists it."""

    at: float  # wall-clock seconds (time.time) when it ended
    request_id: str
    route: str
    upstream: str | None
    model: str | None
    reason: str
    bytes_out: int
    duration: float


def kind_of(record: RequestRecord) -> str:
    if record.rejected is not None:
        return "refused"
    verdict = record.verdict
    if record.stream and verdict is not None:
        return "complete" if verdict.outcome is Outcome.COMPLETE else "incomplete"
    return "plain_ok" if 0 < record.status < 400 else "plain_error"


def feature_kinds(record: RequestRecord) -> list[str]:
    """What the features did with a request (``FEATURE_KINDS``)."""
    kinds = [f"cache_{record.cache}"] if record.cache is not None else []
    if record.detached:
        kinds.append("detached")
    if record.continued:
        kinds.append("continued")
    return [kind for kind in kinds if kind in FEATURE_KINDS]


class StatusBoard:
    """Counts per minute and the last incomplete streams, for the status page."""

    name = "status"

    def __init__(
        self, minutes: int = 15, keep: int = 50, clock: Callable[[], float] = time.time
    ) -> None:
        self.minutes = minutes
        self.keep = keep
        self._clock = clock
        self._buckets: deque[tuple[int, Counter[_Key]]] = deque(maxlen=minutes)
        self.incomplete: deque[IncompleteStream] = deque(maxlen=keep)
        self.started = clock()

    def observe(self, record: RequestRecord) -> None:
        now = self._clock()
        minute = int(now // 60)
        if not self._buckets or self._buckets[-1][0] != minute:
            self._buckets.append((minute, Counter()))
        kind = kind_of(record)
        bucket = self._buckets[-1][1]
        for counted in (kind, *feature_kinds(record)):
            bucket[(record.route, record.upstream or "", counted)] += 1
        if kind == "incomplete" and record.verdict is not None:
            self.incomplete.append(
                IncompleteStream(
                    at=now,
                    request_id=record.request_id,
                    route=record.route,
                    upstream=record.upstream,
                    model=bounded(record.model, MODEL_CHARS),
                    reason=str(record.verdict.reason),
                    bytes_out=record.bytes_out,
                    duration=record.duration,
                )
            )

    def minute_counts(self) -> list[tuple[int, Counter[_Key]]]:
        """The per-minute counters as kept (for a worker's share, status_share.py)."""
        return list(self._buckets)

    def counts(self) -> dict[tuple[str, str], Counter[str]]:
        """Counts by kind per (route, upstream) over the last ``minutes`` minutes."""
        oldest = int(self._clock() // 60) - self.minutes + 1
        out: dict[tuple[str, str], Counter[str]] = {}
        for minute, bucket in self._buckets:
            if minute < oldest:
                continue
            for (route, upstream, kind), count in bucket.items():
                out.setdefault((route, upstream), Counter())[kind] += count
        return out
