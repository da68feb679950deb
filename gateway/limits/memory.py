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
        #: key -> [count, window end (0: no window)]
        self._counters: dict[str, list[int]] = {}
        self._next_sweep = 0.0

    async def reserve(self, checks: list[Check], member: str, now: float, hold: float) -> Reserved:
        if now >= self._next_sweep:
            self._sweep(now)
        counters = self._counters
        used: list[int] = []
        for index, check in enumerate(checks):
            entry = counters.get(check.key)
            count = entry[0] if entry is not None and (not entry[1] or entry[1] > now) else 0
            if count + check.amount > check.value:
                return Reserved(index, [count])
            used.append(count)
        for check, count in zip(checks, used, strict=True):
            counters[check.key] = [count + check.amount, check.expires or 0]
        return Reserved(None, [count + c.amount for c, count in zip(checks, used, strict=True)])

    async def settle(self, checks: list[Check], delta: int, member: str) -> list[int | None]:
        after: list[int | None] = []
        for check in checks:
            entry = self._counters.get(check.key)
            if entry is None:
                after.append(None)
                continue
            if check.expires is None:
                entry[0] = max(entry[0] - 1, 0)
            elif check.limit.counts_tokens:
                entry[0] = max(entry[0] + delta, 0)
            after.append(entry[0])
        return after

    async def read(self, checks: list[Check], now: float) -> list[int]:
        values = []
        for check in checks:
            entry = self._counters.get(check.key)
            alive = entry is not None and (not entry[1] or entry[1] > now)
            values.append(entry[0] if entry is not None and alive else 0)
        return values

    async def close(self) -> None:
        self._counters.clear()

    def _sweep(self, now: float) -> None:
        self._counters = {k: v for k, v in self._counters.items() if not v[1] or v[1] > now}
        self._next_sweep = now + 60.0
