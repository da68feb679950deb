"""The memory backend: exact counters for one process (the default).

Counters are a dict keyed by the check's key; a window's counter is dropped
once its window has ended (swept at most once a minute), so the dict holds
at most the configured scopes' current windows. Nothing awaits: a
reservation is a few dictionary operations (well under 10 µs), and the limiter
calls ``reserve_now`` and ``settle_now`` without a coroutine.
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
        return self.reserve_now(checks, reserved, now)

    async def settle(self, checks: list[Check], delta: int, member: str) -> list[int | None]:
        return self.settle_now(checks, delta)

    def reserve_now(self, checks: list[Check], reserved: int, now: float) -> Reserved:
        """``reserve`` without a coroutine: nothing here awaits (the limiter calls it
        directly; ``member`` and ``hold`` are the Redis backend's)."""
        if now >= self._next_sweep:
            self._sweep(now)
        counters = self._counters
        get = counters.get
        after: list[int] = []
        fresh: list[str] | None = None  # the counters this reservation made
        # one pass: each counter written as it fits (a Check unpacked once costs less
        # than its fields read by name); a refusal puts the earlier ones back
        for index, (_, _, value, key, tokens, end) in enumerate(checks):
            amount = reserved if tokens else 1
            count = get(key)
            if count is None:
                if amount > value:
                    self._undo(checks, after, reserved, fresh)
                    return Reserved(index, [0])
                count = amount
                if end is not None:
                    self._expires[key] = end
                if fresh is None:
                    fresh = [key]
                else:
                    fresh.append(key)
            else:
                count += amount
                if count > value:
                    self._undo(checks, after, reserved, fresh)
                    return Reserved(index, [count - amount])
            counters[key] = count
            after.append(count)
        return Reserved(None, after)

    def _undo(
        self, checks: list[Check], after: list[int], reserved: int, fresh: list[str] | None
    ) -> None:
        """Take back what a refused reservation added to the counters before the one it
        did not fit: a counter it made is dropped again."""
        counters = self._counters
        for check, count in zip(checks, after, strict=False):
            if fresh is not None and check.key in fresh:
                del counters[check.key]
                self._expires.pop(check.key, None)
            else:
                counters[check.key] = count - check.amount(reserved)

    def settle_now(self, checks: list[Check], delta: int) -> list[int | None]:
        """``settle`` without a coroutine."""
        counters = self._counters
        get = counters.get
        after: list[int | None] = []
        for _, _, _, key, tokens, end in checks:
            count = get(key)
            if count is not None:
                # a request count stays as it is: it is not written back
                if end is None:
                    count = counters[key] = count - 1 if count > 0 else 0
                elif tokens:
                    count += delta
                    if count < 0:
                        count = 0
                    counters[key] = count
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
