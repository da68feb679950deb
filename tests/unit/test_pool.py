"""The pool on its own: least outstanding (weighted), Retry-After, ejection, half-open probes.

A fake clock and a seeded random source: nothing sleeps, every run is the same.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gateway.policy.pool import (
    Change,
    EjectionPolicy,
    Health,
    Lease,
    MemberState,
    Pool,
    PoolError,
    _Member,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(
    weights: list[int], clock: Clock | None = None, seed: int = 7, **policy: float
) -> tuple[Pool, Clock]:
    clock = clock or Clock()
    pool = Pool(
        weights,
        EjectionPolicy(**policy),  # type: ignore[arg-type]
        clock=clock,
        rng=random.Random(seed),
    )
    return pool, clock


def take(pool: Pool, exclude: tuple[int, ...] = (), panic: bool = True) -> Lease:
    lease = pool.pick(exclude, panic=panic)
    assert lease is not None
    return lease


def fail(pool: Pool, index: int, times: int) -> list[Change]:
    """``times`` failed attempts on upstream ``index`` (excluding the others to reach it)."""
    others = tuple(i for i in range(len(pool)) if i != index)
    changes = []
    for _ in range(times):
        lease = take(pool, others)
        assert lease.index == index
        changes.append(pool.done(lease, Health.FAILED))
    return changes


# -- balancing ---------------------------------------------------------------------------


def test_the_upstream_with_the_fewest_attempts_in_flight_is_picked() -> None:
    pool, _ = make([1, 1, 1])
    held = [take(pool) for _ in range(3)]
    assert sorted(lease.index for lease in held) == [0, 1, 2]  # one each
    pool.done(held[1], Health.OK)  # upstream held[1] now has nothing in flight
    assert take(pool).index == held[1].index


def test_weights_divide_the_load_in_flight() -> None:
    pool, _ = make([3, 1])
    for _ in range(40):
        take(pool)
    assert (pool.active(0), pool.active(1)) == (30, 10)


def test_ties_go_at_random_in_proportion_to_weight() -> None:
    """An idle pool (every upstream at 0 in flight) shares its load by weight."""
    pool, _ = make([3, 1], seed=1)
    counts: Counter[int] = Counter()
    for _ in range(4000):
        lease = take(pool)
        counts[lease.index] += 1
        pool.done(lease, Health.OK)
    assert 2800 < counts[0] < 3200, counts
    assert counts[0] + counts[1] == 4000


def test_equal_ties_are_not_always_the_first() -> None:
    pool, _ = make([1, 1], seed=3)
    seen = set()
    for _ in range(50):
        lease = take(pool)
        seen.add(lease.index)
        pool.done(lease, Health.OK)
    assert seen == {0, 1}


def test_a_retry_excludes_the_upstreams_already_tried() -> None:
    pool, _ = make([1, 1, 1])
    assert take(pool, (0, 1)).index == 2
    assert pool.pick((0, 1, 2)) is None


def test_a_pool_of_one_always_gives_its_one_upstream_and_never_a_second() -> None:
    pool, _ = make([1], eject_after=1)
    for _ in range(10):
        lease = take(pool)
        assert lease.index == 0
        assert pool.done(lease, Health.FAILED) is Change.NONE
    assert not pool.is_out(0)
    assert pool.pick((0,)) is None
    assert not pool.available((0,))


# -- Retry-After --------------------------------------------------------------------------


def test_a_cooling_upstream_is_skipped_until_its_retry_after_passes() -> None:
    pool, clock = make([1, 1])
    pool.cool_down(0, 30)
    for _ in range(20):
        lease = take(pool)
        assert lease.index == 1
        pool.done(lease, Health.OK)
    assert pool.pick((1,), panic=False) is None
    assert not pool.available((1,))
    clock.now += 30
    assert pool.available((1,))
    assert take(pool, (1,), panic=False).index == 0


def test_with_nothing_available_a_first_attempt_still_gets_the_least_loaded() -> None:
    pool, _ = make([1, 1])
    pool.cool_down(0, 30)
    pool.cool_down(1, 60)
    first = take(pool)  # panic: a request is never refused by the pool
    second = take(pool)
    assert {first.index, second.index} == {0, 1}
    assert pool.pick((first.index,), panic=False) is None  # but never a retry


# -- ejection -----------------------------------------------------------------------------


def test_consecutive_failures_eject_and_a_success_resets_the_count() -> None:
    pool, _ = make([1, 1], eject_after=3)
    assert fail(pool, 0, 2) == [Change.NONE, Change.NONE]
    lease = take(pool, (1,))
    pool.done(lease, Health.OK)
    assert fail(pool, 0, 2) == [Change.NONE, Change.NONE]
    assert not pool.is_out(0)
    assert fail(pool, 0, 1) == [Change.EJECTED]
    assert pool.is_out(0)
    for _ in range(10):
        lease = take(pool)
        assert lease.index == 1
        pool.done(lease, Health.OK)


def test_neutral_results_neither_count_nor_reset() -> None:
    pool, _ = make([1, 1], eject_after=2)
    fail(pool, 0, 1)
    lease = take(pool, (1,))
    pool.done(lease, Health.NEUTRAL)
    assert fail(pool, 0, 1) == [Change.EJECTED]


def test_ejection_lasts_base_doubling_up_to_max_then_half_open() -> None:
    pool, clock = make([1, 1], eject_after=1, base_seconds=10, max_seconds=35)
    lengths = []
    for _ in range(4):
        assert fail(pool, 0, 1) == [Change.EJECTED]
        until = pool.out_until(0)
        assert until is not None
        lengths.append(until - clock.now)
        clock.now = until  # half-open now: the next attempt on it is the probe
        probe = take(pool, (1,))
        assert probe.probe
        assert pool.done(probe, Health.FAILED) is Change.EJECTED
        until = pool.out_until(0)
        assert until is not None
        lengths.append(until - clock.now)
        clock.now = until
        probe = take(pool, (1,))
        assert pool.done(probe, Health.OK) is Change.RETURNED
        assert not pool.is_out(0)
        clock.now += 1  # back for less than max_seconds: the doubling goes on
    assert lengths == [10, 20, 35, 35, 35, 35, 35, 35]


def test_the_doubling_starts_over_after_max_seconds_in_the_pool() -> None:
    pool, clock = make([1, 1], eject_after=1, base_seconds=10, max_seconds=100)
    for _ in range(2):
        fail(pool, 0, 1)
        clock.now = pool.out_until(0) or 0.0
        assert pool.done(take(pool, (1,)), Health.OK) is Change.RETURNED
    fail(pool, 0, 1)
    assert (pool.out_until(0) or 0.0) - clock.now == 40
    clock.now = pool.out_until(0) or 0.0
    pool.done(take(pool, (1,)), Health.OK)
    clock.now += 100
    fail(pool, 0, 1)
    assert (pool.out_until(0) or 0.0) - clock.now == 10


def test_half_open_lets_one_probe_at_a_time() -> None:
    pool, clock = make([1, 1], eject_after=1, base_seconds=5)
    fail(pool, 0, 1)
    assert pool.pick((1,), panic=False) is None  # ejected
    clock.now += 5
    probe = take(pool, (1,), panic=False)
    assert (probe.index, probe.probe) == (0, True)
    # While the probe is in flight nothing else goes to upstream 0.
    assert pool.pick((1,), panic=False) is None
    for _ in range(10):
        assert take(pool).index == 1
    # A probe that says nothing (the client left) keeps it half-open for the next one.
    assert pool.done(probe, Health.NEUTRAL) is Change.NONE
    assert pool.is_out(0)
    probe = take(pool, (1,), panic=False)
    assert probe.probe
    assert pool.done(probe, Health.OK) is Change.RETURNED
    assert not pool.is_out(0)
    lease = take(pool, (1,))
    assert not lease.probe


def test_results_of_attempts_started_before_an_ejection_do_not_count() -> None:
    pool, clock = make([1, 1], eject_after=1, base_seconds=5)
    early = take(pool, (1,))
    fail(pool, 0, 1)
    assert pool.done(early, Health.OK) is Change.NONE
    assert pool.is_out(0)
    clock.now += 5
    assert take(pool, (1,), panic=False).probe


def test_an_ejected_upstream_that_answers_a_panic_attempt_is_back_at_once() -> None:
    """Both were down at start: the healthy one was ejected first (the cap kept the other
    in); it then serves the attempts panic routing sends it, so it must not stay out."""
    pool, _ = make([1, 1], eject_after=2, base_seconds=30)
    assert fail(pool, 1, 2)[-1] is Change.EJECTED  # "healthy": connect errors at start
    assert fail(pool, 0, 3) == [Change.NONE] * 3  # "failing": the cap keeps it in
    busy = take(pool, (1,))  # one attempt in flight on it: panic routing picks the other
    pool.cool_down(0, 1)  # its 503's Retry-After: nothing usable now
    lease = take(pool)
    assert (lease.index, lease.panic, lease.probe) == (1, True, False)
    assert pool.done(lease, Health.OK) is Change.RETURNED
    assert not pool.is_out(1)
    assert pool.available((0,))  # a retry off the failing one has somewhere to go
    # and now the failing one can go out: its failures went on counting under the cap
    assert pool.done(busy, Health.FAILED) is Change.EJECTED


def test_a_panic_attempt_that_fails_leaves_the_ejection_as_it_was() -> None:
    pool, _ = make([1, 1], eject_after=1, base_seconds=30)
    fail(pool, 1, 1)
    until = pool.out_until(1)
    take(pool, (1,))
    pool.cool_down(0, 5)
    lease = take(pool)
    assert lease.panic
    assert pool.done(lease, Health.FAILED) is Change.NONE
    assert pool.out_until(1) == until


@pytest.mark.parametrize(
    ("size", "percent", "most"),
    [(2, 50, 1), (4, 50, 2), (3, 50, 1), (2, 100, 1), (5, 100, 4), (4, 0, 0), (10, 10, 1)],
)
def test_never_more_than_max_ejected_percent_and_never_all(
    size: int, percent: int, most: int
) -> None:
    pool, _ = make([1] * size, eject_after=1, max_ejected_percent=percent)
    for index in range(size):
        fail(pool, index, 3)
    assert sum(pool.is_out(i) for i in range(size)) == most
    assert pool.available()


def test_a_member_kept_in_by_the_percent_cap_is_ejected_once_there_is_room() -> None:
    pool, clock = make([1, 1], eject_after=2, base_seconds=5)
    assert fail(pool, 0, 2)[-1] is Change.EJECTED
    assert fail(pool, 1, 5) == [Change.NONE] * 5  # the cap: one of two at most
    clock.now += 5
    assert pool.done(take(pool, (1,)), Health.OK) is Change.RETURNED
    assert fail(pool, 1, 1) == [Change.EJECTED]  # its failures went on counting


def test_a_pool_needs_a_positive_weight_for_each_upstream() -> None:
    with pytest.raises(ValueError, match="at least one upstream"):
        Pool([])
    with pytest.raises(ValueError, match="positive weight"):
        Pool([1, 0])


# -- named states ----------------------------------------------------------------------------


def test_a_member_walks_in_ejected_half_open_in_and_reports_cooling() -> None:
    pool, clock = make([1, 1], eject_after=1, base_seconds=10)
    assert pool.state(0) is MemberState.IN
    pool.cool_down(0, 5)
    assert pool.state(0) is MemberState.COOLING
    clock.now += 5
    assert pool.state(0) is MemberState.IN
    fail(pool, 0, 1)
    assert pool.state(0) is MemberState.EJECTED
    clock.now += 10
    probe = take(pool, (1,))
    assert probe.probe
    assert pool.state(0) is MemberState.HALF_OPEN
    assert pool.done(probe, Health.NEUTRAL) is Change.NONE
    assert pool.state(0) is MemberState.EJECTED  # its time is over: the next pick probes
    probe = take(pool, (1,))
    assert pool.done(probe, Health.OK) is Change.RETURNED
    assert pool.state(0) is MemberState.IN


@pytest.mark.parametrize(
    ("start", "to"),
    [
        (MemberState.IN, MemberState.HALF_OPEN),
        (MemberState.IN, MemberState.IN),
        (MemberState.EJECTED, MemberState.EJECTED),
        (MemberState.HALF_OPEN, MemberState.HALF_OPEN),
        (MemberState.IN, MemberState.COOLING),
    ],
)
def test_a_member_refuses_a_transition_its_table_does_not_allow(
    start: MemberState, to: MemberState
) -> None:
    member = _Member(0, 1)
    member.state = start
    with pytest.raises(PoolError):
        member.move(to)
