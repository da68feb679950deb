"""The memory backend over random sequences: a reservation is all or none, no counter
ever passes its limit while what is settled is at most what was reserved (strict's
promise), and the stream count returns to zero once every stream is settled."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from gateway.limits.backend import Ask, Bill
from gateway.limits.memory import MemoryBackend
from gateway.policy.quota import Limit, Rule, checks_for

_STEP = st.tuples(
    st.integers(min_value=0, max_value=2),  # which rules
    st.integers(min_value=0, max_value=40),  # input
    st.integers(min_value=1, max_value=40),  # output wanted
    st.booleans(),  # strict
    st.integers(min_value=0, max_value=60),  # what it cost, at most what it reserved
    st.integers(min_value=0, max_value=200),  # seconds on
)


@given(
    st.lists(_STEP, max_size=30),
    st.lists(st.integers(min_value=1, max_value=60), min_size=5, max_size=5),
)
def test_reservations_are_all_or_none_and_never_pass_a_limit(
    steps: list[tuple[int, int, int, bool, int, int]], values: list[int]
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
    backend = MemoryBackend()

    async def run() -> None:
        now = 1_800_000_000.0
        live = []
        for index, (which, input_, output, strict, cost, later) in enumerate(steps):
            now += later
            checks = checks_for(choices[which], True, now)
            ask = Ask(f"r{index}", input_, output, strict, 60.0)
            answer = await backend.reserve(checks, ask, now)
            if answer.refused is not None:
                # nothing taken: every counter as the answer says it stood
                assert [backend._counters.get(c.key, 0) for c in checks] == answer.used
                continue
            if strict:
                assert 1 <= answer.output <= output
            for check in checks:
                assert backend._counters[check.key] <= check.value
            reserved = answer.reserved(ask)
            live.append((checks, ask, reserved, min(cost, reserved)))
            if len(live) > 2:
                checks, ask, reserved, spent = live.pop(0)
                current = checks_for(choices[which], True, now)
                if [c.scope for c in current] == [c.scope for c in checks]:
                    await backend.settle(checks, current, ask, Bill(reserved, spent))
                    for check in current:
                        assert backend._counters.get(check.key, 0) <= check.value

    asyncio.run(run())


def test_a_reservation_of_no_tokens_passes_a_token_limit_that_is_over() -> None:
    """A cache hit reserves no tokens: a client whose tokens are spent past the limit is
    still admitted, and counted in its requests, which still refuse it at theirs."""
    rule = Rule("c", {Limit.REQUESTS_PER_MINUTE: 3, Limit.TOKENS_PER_MINUTE: 100})
    now = 1_800_000_030.0
    checks = checks_for([rule], False, now)
    backend = MemoryBackend()

    async def run() -> None:
        first = await backend.reserve(checks, Ask("a", 90, 10, False, 60.0), now)
        assert first.refused is None
        # it cost more than it reserved: the token counter is over its limit
        await backend.settle(checks, checks, Ask("a", 90, 10, False, 60.0), Bill(100, 400))
        assert [backend._counters[c.key] for c in checks] == [1, 400]
        hit = await backend.reserve(checks, Ask("h1", 0, 0, False, 60.0), now)
        assert (hit.refused, hit.used) == (None, [2, 400])
        # a request that spends tokens is refused by the token limit, and counts nothing
        miss = await backend.reserve(checks, Ask("b", 90, 10, False, 60.0), now)
        assert (miss.refused, miss.used) == (1, [2, 400])
        # strict has no output to cap in a reservation of none
        strict = await backend.reserve(checks, Ask("h2", 0, 0, True, 60.0), now)
        assert (strict.refused, strict.output, strict.used) == (None, 0, [3, 400])
        # the request limit still refuses a reservation of no tokens
        over = await backend.reserve(checks, Ask("h3", 0, 0, False, 60.0), now)
        assert (over.refused, over.used) == (0, [3, 400])

    asyncio.run(run())
    assert [backend._counters[c.key] for c in checks] == [3, 400]
