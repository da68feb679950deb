"""The store's total byte budget (``stream_store_max_bytes``), as this process counts it.

Every byte a writer keeps is taken from the budget; a log's bytes are given back
when its keys expire (its TTL after its last write) or when it is deleted. For the
memory store this is exact; for Redis it is the gateway's own accounting of what
it wrote (other replicas keep their own). A new log starts only while there is
room for its cap or a 64th of the budget, whichever is less: a log that could
keep next to nothing is not worth opening.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

__all__ = ["Budget"]


class Budget:
    def __init__(self, limit: int, clock: Callable[[], float]) -> None:
        self.limit = limit
        self.used = 0
        self._clock = clock
        self._held: dict[str, int] = {}
        self._expiry: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []

    def take(self, stream_id: str, size: int) -> bool:
        """Take ``size`` bytes for ``stream_id``; False (nothing taken) when over (what
        expired is given back by ``room`` and ``expire``, not on every event)."""
        if self.used + size > self.limit:
            return False
        self.used += size
        self._held[stream_id] = self._held.get(stream_id, 0) + size
        return True

    def room(self, max_bytes: int) -> bool:
        """Whether a new log may start: the budget has room for ``max_bytes`` (its cap)
        or for a 64th of itself, whichever is less."""
        self.expire()
        return self.used + min(max_bytes, self.limit // 64) <= self.limit

    def expires(self, stream_id: str, at: float) -> None:
        """``stream_id``'s bytes are given back at ``at`` (unless written again)."""
        self._expiry[stream_id] = at
        heapq.heappush(self._heap, (at, stream_id))

    def give_back(self, stream_id: str) -> None:
        self.used -= self._held.pop(stream_id, 0)
        self._expiry.pop(stream_id, None)

    def expire(self) -> list[str]:
        """Give back the bytes of the logs whose time is up; their ids."""
        now = self._clock()
        heap = self._heap
        gone: list[str] = []
        while heap and heap[0][0] <= now:
            at, stream_id = heapq.heappop(heap)
            if self._expiry.get(stream_id) == at:
                self.give_back(stream_id)
                gone.append(stream_id)
        return gone
