"""The memory backend's one-pass reservation and its settlement leave exactly the
counters the two-pass ones did (copied here as they were), refusals included, over
random sequences."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from gateway.limits.backend import Reserved
from gateway.limits.memory import MemoryBackend
from gateway.policy.limits import Check, Limit, Rule, checks_for


class _TwoPass(MemoryBackend):
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


_STEP = st.tuples(
    st.integers(min_value=0, max_value=2),  # which rules
    st.integers(min_value=0, max_value=40),  # reserved
    st.integers(min_value=-40, max_value=40),  # settlement delta
    st.booleans(),  # settled
    st.integers(min_value=0, max_value=200),  # seconds on
)


@given(
    st.lists(_STEP, max_size=30),
    st.lists(st.integers(min_value=1, max_value=60), min_size=5, max_size=5),
)
def test_one_pass_reservations_equal_two_pass(
    steps: list[tuple[int, int, int, bool, int]], values: list[int]
) -> None:
    own = Rule(
        "c",
        {
            Limit.REQUESTS_PER_MINUTE: values[0],
            Limit.TOKENS_PER_MINUTE: values[1],
            Limit.TOKENS_PER_DAY: values[2],
            Limit.MAX_CONCURRENT_STREAMS: values[3],
        },
    )
    route = Rule("c/route=r", {Limit.TOKENS_PER_MINUTE: values[4]})
    model = Rule("c/model=m", {Limit.REQUESTS_PER_MINUTE: values[4]})
    choices = [[own], [own, route], [route, own, model]]
    fast, plain = MemoryBackend(), _TwoPass()

    async def run() -> None:
        now = 1_800_000_000.0
        for which, reserved, delta, settled, later in steps:
            now += later
            checks = checks_for(choices[which], True, now)
            a = await fast.reserve(checks, reserved, "m", now, 60.0)
            b = await plain.reserve(checks, reserved, "m", now, 60.0)
            assert a == b
            assert fast._counters == plain._counters
            assert fast._expires == plain._expires
            if a.refused is None and settled:
                assert await fast.settle(checks, delta, "m") == await plain.settle(
                    checks, delta, "m"
                )
                assert fast._counters == plain._counters

    asyncio.run(run())
