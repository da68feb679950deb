"""The memory backend: exact counters for one process (the default).

Counters are a dict keyed by the check's key; a window's counter is dropped
once its window has ended (swept at most once a minute), so the dict holds
at most the configured scopes' current windows. Nothing awaits: a
reservation is a few dictionary operations (well under 10 µs).
"""

from __future__ import annotations

from gateway.limits.backend import Reserved
from gateway.policy.limits import Check

__all__ = ["MemoryBackend"]


class MemoryBackend:
    remote = False

    def __init__(self) -> None:
        #: key -> count; a window's key names its window, so a new window is a new key
        self._counters: dict[str, int] = {}
        #: key -> its window's end, for the sweep (the concurrency count has none)
        self._expires: dict[str, int] = {}
        self._next_sweep = 0.0

    async def reserve(
        self, checks: list[Check], reserved: int, member: str, now: float, hold: float
    ) -> Reserved:
        if now >= self._next_sweep:
            self._sweep(now)
        counters = self._counters
        after: list[int] = []
        for index, check in enumerate(checks):
            count = counters.get(check.key, 0) + (reserved if check.tokens else 1)
            if count > check.value:
                return Reserved(index, [count - (reserved if check.tokens else 1)])
            after.append(count)
        for check, count in zip(checks, after, strict=True):
            if check.key not in counters and check.expires is not None:
                self._expires[check.key] = check.expires
            counters[check.key] = count
        return Reserved(None, after)

    async def settle(self, checks: list[Check], delta: int, member: str) -> list[int | None]:
        counters = self._counters
        after: list[int | None] = []
        for check in checks:
            count = counters.get(check.key)
            if count is not None:
                if check.expires is None:
                    count = max(count - 1, 0)
                elif check.tokens:
                    count = max(count + delta, 0)
                counters[check.key] = count
            after.append(count)
        return after

    async def read(self, checks: list[Check], now: float) -> list[int]:
        return [self._counters.get(check.key, 0) for check in checks]

    async def prepare(self) -> None:
        pass

    async def close(self) -> None:
        self._counters.clear()
        self._expires.clear()

    def _sweep(self, now: float) -> None:
        ended = [key for key, end in self._expires.items() if end <= now]
        for key in ended:
            del self._expires[key]
            self._counters.pop(key, None)
        self._next_sweep = now + 60.0
