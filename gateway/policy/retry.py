"""The retry policy: where a failed attempt's retry goes, and how long it waits first.

In order, never past ``max_attempts`` or the total deadline, and only for a
result the route retries (``retry_on``):

1. another available upstream of the same priority tier, at once;
2. else the same upstream once more: after its ``Retry-After`` when that is
   at most ``max_retry_after_seconds`` (a longer one cooled it down: step 3),
   after a 429's throttle backoff, else after a jittered backoff
   (``retry_backoff_seconds``, doubling, at most 2 s). Never after a timeout
   (a connect timeout, no first byte): retrying a silent upstream only
   multiplies the wait. A pool of one never retries (as before tiers);
3. else the next tier (the lowest one above), at once.

``context_length`` (a 400 saying the prompt is too long) skips 1 and 2: the
same tier would say the same; only a higher tier (a larger model) may not.

An answer the upstream itself broke before anything reached the client
(``broke``: it stalled, sent garbage or an error event, or cut its body;
``failover.BROKE_ANSWER``) swaps 2 and 3: the same upstream would likely do it
again, so it is asked once more only when no other upstream can be.

Pure: the pool is handed in, time left and chance too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gateway.policy.failover import Result, retryable
from gateway.policy.pool import Lease, Pool

__all__ = ["BACKOFF_CAP_SECONDS", "Retry", "RetryPolicy", "backoff", "next_attempt"]

#: The longest backoff before a retry on the same upstream.
BACKOFF_CAP_SECONDS = 2.0
#: A same-upstream retry waits between its backoff and this much more (never less).
_JITTER = 0.25
#: Results never retried on the same upstream: it was silent.
_NOT_ON_THE_SAME = frozenset({Result.TIMEOUT, Result.CONTEXT_LENGTH})
_RANDOM = random.Random()


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A route's retry keys."""

    max_attempts: int
    retry_on: frozenset[str]
    backoff_seconds: float = 0.25
    max_retry_after_seconds: float = 5.0


@dataclass(frozen=True, slots=True)
class Retry:
    """The next attempt: its claimed upstream, and how long to wait before it."""

    lease: Lease
    wait: float = 0.0


def backoff(base: float, n: int, rng: random.Random) -> float:
    """The ``n``-th backoff (1: ``base``), doubled each time, jittered up, at most the cap."""
    seconds = base * 2.0 ** min(n - 1, 32) * (1.0 + _JITTER * rng.random())
    return min(seconds, BACKOFF_CAP_SECONDS)


def next_attempt(
    pool: Pool,
    policy: RetryPolicy,
    *,
    result: Result,
    tried: list[int],
    model: str | None,
    time_left: float,
    retry_after: float | None = None,
    silent: bool = False,
    broke: bool = False,
    rng: random.Random | None = None,
) -> Retry | None:
    """Where the retry of the attempt on ``tried[-1]`` that ended as ``result`` goes.

    ``retry_after``: the answer's wait (seconds), if it had one; ``silent``: the
    attempt failed by a timeout (no connection in time) even if ``result`` does
    not say so; ``broke``: the upstream broke its answer (the same upstream comes after
    the next tier). None: no retry (the client gets this attempt's answer).
    """
    if (
        len(tried) >= policy.max_attempts
        or time_left <= 0
        or not retryable(result, policy.retry_on)
    ):
        return None
    index = tried[-1]
    tier = pool.tier(index)
    if result is not Result.CONTEXT_LENGTH:
        lease = pool.pick(tried, panic=False, model=model, tier=tier)
        if lease is not None:
            return Retry(lease)
        if not broke:
            same = _same_upstream(
                pool, policy, result, tried, model, time_left, retry_after, silent, rng or _RANDOM
            )
            if same is not None:
                return same
    lease = pool.pick(tried, panic=False, model=model, above=tier)
    if lease is not None:
        return Retry(lease)
    if broke and result is not Result.CONTEXT_LENGTH:
        return _same_upstream(
            pool, policy, result, tried, model, time_left, retry_after, silent, rng or _RANDOM
        )
    return None


def _same_upstream(
    pool: Pool,
    policy: RetryPolicy,
    result: Result,
    tried: list[int],
    model: str | None,
    time_left: float,
    retry_after: float | None,
    silent: bool,
    rng: random.Random,
) -> Retry | None:
    index = tried[-1]
    if len(pool) == 1 or silent or result in _NOT_ON_THE_SAME or tried.count(index) > 1:
        return None
    if retry_after is not None:
        if retry_after > policy.max_retry_after_seconds:
            return None  # cooling down for longer: the next tier, at once
        wait = retry_after
    else:
        wait = backoff(policy.backoff_seconds, 1, rng)
        # a 429's throttle (Pool.throttle) may ask for longer: never sooner than it
        wait = max(wait, pool.cooling_for(index, model))
    if wait >= time_left:
        return None
    lease = pool.claim(index)
    return Retry(lease, wait) if lease is not None else None
