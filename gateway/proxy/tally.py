"""One attempt's account: what it came to, its upstream's health, the pool and the
metrics told, and the facts of the pool the retry policy reads (a Retry-After's
cool-down, whether an answer may be held for a retry)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import httpx

from gateway.guard import Reason
from gateway.observe import Attempt, Metrics
from gateway.policy.failover import (
    Result,
    health_of,
    result_of_answer,
    retry_after_ms,
    retry_after_seconds,
)
from gateway.policy.pool import Change, Health, Lease
from gateway.policy.retry import BACKOFF_CAP_SECONDS
from gateway.policy.routing import Endpoint, Route
from gateway.proxy.exchange import Exchange

__all__ = ["Tally", "account", "attempt_done", "cool_down", "may_hold", "settle"]

log = logging.getLogger("gateway")


@dataclass(slots=True, eq=False)
class Tally:
    """What one attempt came to, filled in as it goes and read once: when it failed (before
    its retry is chosen) or at its end."""

    started: float
    position: int
    endpoint: Endpoint
    lease: Lease
    #: Accounted for (``settle``): once, when it failed or when it ended.
    settled: bool = field(init=False, default=False)
    result: Result = field(init=False, default=Result.OK)
    reason: Reason | None = field(init=False, default=None)
    #: The answer went to the client: its result is read off the record.
    answered: bool = field(init=False, default=False)
    #: Cancelled (the client left, the drain): says nothing about the upstream.
    cancelled: bool = field(init=False, default=False)

    def stopped(self) -> None:
        self.answered = False
        self.cancelled = True


def settle(exchange: Exchange, tally: Tally, metrics: Metrics) -> None:
    """Account for an attempt once: as soon as it failed (before its retry is chosen,
    so that the retry sees its upstream's health), else when it ends."""
    if not tally.settled:
        tally.settled = True
        account(exchange, tally.endpoint, tally.lease, tally, metrics)


def account(
    exchange: Exchange, endpoint: Endpoint, lease: Lease, tally: Tally, metrics: Metrics
) -> None:
    """An attempt ended: its result (an answer's is read off the record), its
    upstream's health, the access log's attempt, the pool and the metrics."""
    record = exchange.record
    result, reason = tally.result, tally.reason
    if tally.answered:
        verdict = record.verdict
        result = result_of_answer(record.status, verdict, record.error)
        reason = verdict.reason if verdict is not None else None
    if tally.cancelled:
        result, reason = Result.INCOMPLETE, exchange.stop_reason
        health = Health.NEUTRAL  # cancelled: says nothing about the upstream
    else:
        health = health_of(result, reason, record.error)
    cause = str(reason) if reason is not None and not tally.answered else None
    entry = Attempt(endpoint.name, result, time.monotonic() - tally.started, cause)
    record.attempts.insert(tally.position, entry)
    attempt_done(exchange.route, endpoint, lease, health, metrics)


def attempt_done(
    route: Route, endpoint: Endpoint, lease: Lease, health: Health, metrics: Metrics
) -> None:
    """An attempt on ``endpoint`` is over: the pool told its health, ejections logged."""
    metrics.upstream_ended(route.name, endpoint.name)
    change = route.pool.done(lease, health)
    if change is Change.NONE:
        return
    ejected = change is Change.EJECTED
    metrics.upstream_out(route.name, endpoint.name, ejected)
    if ejected:
        until = route.pool.out_until(lease.index) or 0.0
        log.warning(
            "route %s: upstream %s ejected for %.0f s (consecutive failures)",
            route.name,
            endpoint.name,
            max(until - time.monotonic(), 0.0),
        )
    else:
        log.info(
            "route %s: upstream %s is back (it answered a request)",
            route.name,
            endpoint.name,
        )


def cool_down(exchange: Exchange, index: int, response: httpx.Response) -> float | None:
    """A 429's or 503's (or another status the protocol says is overloaded)
    Retry-After cools ``index`` down for the request's model (a 429
    without one: its doubling backoff); returns the Retry-After in seconds, if any."""
    if response.status_code not in exchange.spec.cool_down_statuses:
        return None
    route, model = exchange.route, exchange.record.model
    ceiling = route.config.eject_max_seconds
    headers = response.headers
    seconds = retry_after_ms(headers.get("retry-after-ms"), ceiling)
    if seconds is None:
        seconds = retry_after_seconds(headers.get("retry-after"), time.time(), ceiling)
    if seconds is not None:
        route.pool.cool_down(index, seconds, model)
    elif response.status_code == 429:
        route.pool.throttle(index, model, route.retry.backoff_seconds, BACKOFF_CAP_SECONDS)
    return seconds


def may_hold(exchange: Exchange, tried: list[int]) -> bool:
    """Whether an answer that breaks before it starts could still be retried: on
    another upstream, or (an early end) on the same one once more."""
    route = exchange.route
    pool = route.pool
    return (
        len(pool) > 1
        and len(tried) < route.config.max_attempts
        and ("early_eof" in route.retry_on or "first_byte_timeout" in route.retry_on)
        and asyncio.get_running_loop().time() < exchange.total_deadline
        and (pool.available(tried, model=exchange.record.model) or tried.count(tried[-1]) < 2)
    )
