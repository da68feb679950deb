"""The retry policy on its own: tiers, the same upstream after a backoff, Retry-After,
timeouts never on the same upstream, context_length on a higher tier only.

A fake clock and a seeded random source: nothing sleeps.
"""

from __future__ import annotations

import random

import pytest

from gateway.policy.failover import Result, is_context_length, retry_after_ms
from gateway.policy.pool import EjectionPolicy, Health, MemberState, Pool
from gateway.policy.retry import BACKOFF_CAP_SECONDS, Retry, RetryPolicy, backoff, next_attempt
from gateway.settings import DEFAULT_RETRY_ON
from tests.unit.test_pool import Clock

POLICY = RetryPolicy(max_attempts=4, retry_on=frozenset([*DEFAULT_RETRY_ON, "context_length"]))


def tiered(*tiers: int, clock: Clock | None = None) -> tuple[Pool, Clock]:
    clock = clock or Clock()
    pool = Pool([1] * len(tiers), EjectionPolicy(), clock=clock, rng=random.Random(3), tiers=tiers)
    return pool, clock


def plan(pool: Pool, result: Result, tried: list[int], **kw: object) -> Retry | None:
    kw.setdefault("model", "m")
    kw.setdefault("time_left", 30.0)
    return next_attempt(pool, POLICY, result=result, tried=tried, **kw)  # type: ignore[arg-type]


def test_traffic_goes_to_the_lowest_tier_and_to_a_higher_one_only_while_it_is_out() -> None:
    pool, clock = tiered(1, 0, 0, 2)
    picked = {pool.pick(model="m").index for _ in range(20)}  # type: ignore[union-attr]
    assert picked == {1, 2}
    pool.cool_down(1, 5, "m")
    pool.cool_down(2, 5, "m")
    assert pool.pick(model="m").index == 0  # type: ignore[union-attr]
    assert pool.pick(model="other").index in (1, 2)  # type: ignore[union-attr]  # per model
    clock.now += 5
    assert pool.pick(model="m").index in (1, 2)  # type: ignore[union-attr]


def test_a_recovered_lower_tier_takes_traffic_back_at_once() -> None:
    clock = Clock()
    pool = Pool([1, 1], EjectionPolicy(eject_after=1, base_seconds=10), clock=clock, tiers=[0, 1])
    lease = pool.pick()
    assert lease is not None
    assert lease.index == 0
    pool.done(lease, Health.FAILED)
    assert pool.state(0) is MemberState.EJECTED
    assert pool.pick().index == 1  # type: ignore[union-attr]
    clock.now += 10
    probe = pool.pick()
    assert probe is not None
    assert probe.probe
    assert probe.index == 0
    pool.done(probe, Health.OK)
    assert all(pool.pick().index == 0 for _ in range(5))  # type: ignore[union-attr]


def test_a_retry_goes_to_the_tier_first_then_the_same_upstream_then_the_next_tier() -> None:
    pool, _ = tiered(0, 0, 1)
    first = plan(pool, Result.STATUS_5XX, [0])
    assert first is not None
    assert (first.lease.index, first.wait) == (1, 0.0)
    same = plan(pool, Result.STATUS_5XX, [0, 1])
    assert same is not None
    assert same.lease.index == 1
    assert 0.25 <= same.wait <= 0.25 * 1.25
    nxt = plan(pool, Result.STATUS_5XX, [0, 1, 1])
    assert nxt is not None
    assert (nxt.lease.index, nxt.wait) == (2, 0.0)
    assert plan(pool, Result.STATUS_5XX, [0, 1, 1, 2]) is None  # max_attempts


@pytest.mark.parametrize("silent", [False, True])
def test_a_timeout_is_never_retried_on_the_same_upstream(silent: bool) -> None:
    pool, _ = tiered(0, 1)
    result = Result.CONNECT_ERROR if silent else Result.TIMEOUT
    policy = RetryPolicy(max_attempts=4, retry_on=frozenset(["connect", "first_byte_timeout"]))
    retry = next_attempt(
        pool, policy, result=result, tried=[0], model="m", time_left=30, silent=True
    )
    assert retry is not None
    assert (retry.lease.index, retry.wait) == (1, 0.0)


def test_a_short_retry_after_is_waited_out_on_the_same_upstream_a_long_one_is_not() -> None:
    pool, _ = tiered(0, 1)
    short = plan(pool, Result.STATUS_429, [0], retry_after=2.0)
    assert short is not None
    assert (short.lease.index, short.wait) == (0, 2.0)
    pool.cool_down(0, 60, "m")
    long = plan(pool, Result.STATUS_429, [0], retry_after=60.0)
    assert long is not None
    assert (long.lease.index, long.wait) == (1, 0.0)


def test_no_wait_past_the_total_deadline() -> None:
    pool, _ = tiered(0)
    pool2, _ = tiered(0, 5)
    assert plan(pool2, Result.STATUS_429, [0], retry_after=2.0, time_left=1.0).lease.index == 1  # type: ignore[union-attr]
    assert plan(pool, Result.STATUS_5XX, [0]) is None  # a pool of one never retries


def test_a_persistent_429_without_retry_after_gets_at_most_four_attempts_in_three_seconds() -> None:
    """Requests one after another, each: the throttled upstream when it is not cooling
    down, its one same-upstream retry after the wait, else the next tier."""
    pool, clock = tiered(0, 1)
    on_primary: list[float] = []
    end = clock.now + 3.0
    while clock.now < end:
        lease = pool.pick(model="m")
        assert lease is not None
        tried = [lease.index]
        while lease.index == 0 and clock.now < end:
            on_primary.append(clock.now)
            pool.throttle(0, "m", 0.25, BACKOFF_CAP_SECONDS)
            retry = plan(pool, Result.STATUS_429, tried)
            pool.done(lease, Health.FAILED)
            if retry is None:
                break
            clock.now += retry.wait
            lease = retry.lease
            tried.append(lease.index)
        pool.done(lease, Health.OK)
        clock.now += 0.05
    assert 2 <= len(on_primary) <= 4


def test_context_length_goes_to_a_higher_tier_only() -> None:
    pool, _ = tiered(0, 0, 1)
    retry = plan(pool, Result.CONTEXT_LENGTH, [0])
    assert retry is not None
    assert retry.lease.index == 2
    flat, _ = tiered(0, 0)
    assert plan(flat, Result.CONTEXT_LENGTH, [0]) is None


def test_backoff_doubles_is_never_below_its_base_and_is_capped() -> None:
    rng = random.Random(1)
    waits = [backoff(0.25, n, rng) for n in range(1, 8)]
    assert all(w >= min(0.25 * 2**i, 2.0) for i, w in enumerate(waits))
    assert max(waits) == BACKOFF_CAP_SECONDS


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"error": {"code": "context_length_exceeded", "message": "too long"}}', True),
        (
            b'{"type": "error", "error": {"type": "invalid_request_error",'
            b' "message": "prompt is too long: 208310 tokens > 200000 maximum"}}',
            True,
        ),
        (b'{"error": {"type": "invalid_request_error", "message": "bad model"}}', False),
        (b"not json", False),
        (b"[]", False),
    ],
)
def test_a_context_length_400_is_told_from_any_other(body: bytes, expected: bool) -> None:
    assert is_context_length(body) is expected


def test_retry_after_ms() -> None:
    assert retry_after_ms(b"1500", 300) == 1.5
    assert retry_after_ms("x", 300) is None
    assert retry_after_ms("-5", 300) is None
    assert retry_after_ms(None, 300) is None


def test_an_answer_the_upstream_broke_goes_to_the_next_tier_before_the_same_upstream() -> None:
    pool, _ = tiered(0, 1)
    # a stall, a malformed chunk, a cut: the fallback tier first, at once
    nxt = plan(pool, Result.EARLY_EOF, [0], broke=True)
    assert nxt is not None
    assert (nxt.lease.index, nxt.wait) == (1, 0.0)
    # the same upstream only when no other can be asked: here after the fallback broke too
    same = plan(pool, Result.EARLY_EOF, [0, 1], broke=True)
    assert same is not None
    assert same.lease.index == 1
    assert same.wait > 0
    # not broken (a 5xx): the same upstream after the backoff comes before the next tier
    pool, _ = tiered(0, 1)
    same = plan(pool, Result.STATUS_5XX, [0])
    assert same is not None
    assert same.lease.index == 0


def test_a_broken_answer_on_a_pool_of_one_tier_is_retried_on_the_same_upstream() -> None:
    pool, _ = tiered(0, 0)
    other = plan(pool, Result.EARLY_EOF, [0], broke=True)
    assert other is not None
    assert other.lease.index == 1
    pool.done(other.lease, Health.NEUTRAL)
    pool2, _ = tiered(0, 0)
    pool2.cool_down(1, 60, "m")  # the other one cools down: only the same is left
    same = plan(pool2, Result.EARLY_EOF, [0], broke=True)
    assert same is not None
    assert same.lease.index == 0
