"""The memory backend: exact counters for one process (the default).

Counters are a dict keyed by the check's key; a window's counter is dropped
once its window has ended (swept at most once a minute), so the dict holds
at most the configured scopes' current windows. Nothing awaits: a
reservation is a few dictionary operations (well under 10 µs), and the limiter
calls ``reserve_now`` and ``settle_now`` without a coroutine. A reservation of
no tokens (a cache hit) fits every token counter, even one over its limit. Nothing can
fail or arrive late, so a reservation's identity is the limiter's business
(it settles each once).
"""

from __future__ import annotations

from gateway.limits.backend import Ask, Bill, Reserved, money_of
from gateway.policy.quota import Check

__all__ = ["MemoryBackend"]


class MemoryBackend:
    remote = False
    ready = True
    #: This process's counters never stop answering.
    down_for: float | None = None

    def __init__(self) -> None:
        #: key -> count; a window's key names its window, so a new window is a new key
        self._counters: dict[str, int] = {}
        #: key -> its window's end, for the sweep (the concurrency count has none)
        self._expires: dict[str, int] = {}
        self._next_sweep = 0.0

    async def reserve(self, checks: list[Check], ask: Ask, now: float) -> Reserved:
        return self.reserve_now(checks, ask, now)

    async def settle(
        self, checks: list[Check], current: list[Check], ask: Ask, bill: Bill
    ) -> list[int | None]:
        money_delta = bill.cost_money - bill.reserved_money
        return self.settle_now(checks, current, bill.cost - bill.reserved, bill.served, money_delta)

    def reserve_now(self, checks: list[Check], ask: Ask, now: float) -> Reserved:
        """``reserve`` without a coroutine: nothing here awaits."""
        input_, output, strict = ask.input, ask.output, ask.strict
        input_money, output_pico = ask.input_money, ask.output_pico
        if now >= self._next_sweep:
            self._sweep(now)
        counters = self._counters
        get = counters.get
        if strict and output:  # (a request that reserves no output has none to cap)
            for check in checks:
                if check.tokens:
                    room = check.value - get(check.key, 0) - input_
                    if room < output:
                        output = room if room > 1 else 1
                elif check.money and output_pico:
                    room = (check.value - get(check.key, 0) - input_money) * 1000 // output_pico
                    if room < output:
                        output = room if room > 1 else 1
        amount = input_ + output
        money = money_of(input_money, output, output_pico)
        expires = self._expires
        after: list[int] = []
        fresh: list[str] | None = None  # the counters this reservation made
        # one pass: each counter written as it fits (a Check unpacked once costs less
        # than its fields read by name); a refusal puts the earlier ones back
        for _, _, value, key, tokens, end, is_money, _ in checks:
            step = amount if tokens else money if is_money else 1
            count = get(key)
            if count is None:
                count = step
                if end is not None:
                    expires[key] = end
                if fresh is None:
                    fresh = [key]
                else:
                    fresh.append(key)
            else:
                count += step
            counters[key] = count
            # a reservation of no tokens (a cache hit) is refused by no token counter,
            # even one over its limit: only its request and stream counters count it
            if count > value and step:
                return self._refused(checks, len(after), amount, money, output, fresh)
            after.append(count)
        return Reserved(None, after, output, money)

    def _refused(
        self,
        checks: list[Check],
        index: int,
        amount: int,
        money: int,
        output: int,
        fresh: list[str] | None,
    ) -> Reserved:
        """Take back what a refused reservation wrote, up to and with the counter it did
        not fit (a counter it made is dropped again); every counter as it stood."""
        counters = self._counters
        for check in checks[: index + 1]:
            if fresh is not None and check.key in fresh:
                del counters[check.key]
                self._expires.pop(check.key, None)
            else:
                counters[check.key] -= check.amount(amount, money)
        return Reserved(index, [counters.get(c.key, 0) for c in checks], output, money)

    def settle_now(
        self,
        checks: list[Check],
        current: list[Check],
        delta: int,
        served: bool = True,
        money_delta: int = 0,
    ) -> list[int | None]:
        """``settle`` without a coroutine: ``delta`` (cost minus reservation) to the token
        counters of the windows reserved in (``money_delta`` to the money ones), or what
        it adds to the current ones' where that window has ended; the stream counted
        out; a request not ``served`` (refused after its reservation) counted out of its
        requests too."""
        counters = self._counters
        get = counters.get
        after: list[int | None] = []
        token_delta = delta
        for (_, _, _, key, tokens, end, is_money, _), now_check in zip(
            checks, current, strict=False
        ):
            delta = money_delta if is_money else token_delta
            if end is None:
                count = get(key)
                if count is not None:
                    counters[key] = count - 1 if count > 0 else 0
            elif tokens or is_money:
                if key == now_check[3]:
                    count = get(key)
                    if count is not None:
                        count += delta
                        counters[key] = count if count > 0 else 0
                elif delta > 0:  # its window ended: the rest is charged in the current one
                    key = now_check[3]
                    if key not in counters and now_check[5] is not None:
                        self._expires[key] = now_check[5]
                    counters[key] = get(key, 0) + delta
            elif not served:
                count = get(key)
                if count:
                    counters[key] = count - 1
            after.append(get(now_check[3]))
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
