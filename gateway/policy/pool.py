"""Pool: which upstream of a route an attempt goes to, and each upstream's passive health.

Balancing is least outstanding, weighted (Envoy's ``least_request``): the
upstream with the fewest attempts in flight per unit of weight
(``active / weight``) wins. Ties are broken at random in proportion to
weight, so an idle pool (every upstream at 0) still shares its load by
weight, and a busy one keeps each upstream's in-flight count proportional
to its weight.

Passive health (Envoy's outlier detection): ``eject_after`` consecutive
failures eject an upstream for ``base_seconds * 2**(n-1)`` (its n-th
ejection), at most ``max_seconds``. Once that time is over it is half-open:
the next attempt routed to it is the probe, and only one probe runs at a
time. The probe's success returns the upstream to the pool; its failure
ejects it again, for twice as long. The doubling starts over once an
upstream has stayed in for ``max_seconds``. At most ``max_ejected_percent``
of a pool, and never all of it, is out at once (ejected or half-open): a
failure that would eject one more is counted, and the upstream stays in.
Results of attempts that started before an ejection do not count. An
ejected upstream that panic routing (below) sent an attempt to, and that
answered it, is back in the pool at once: it is serving, so it is not out.

A ``Retry-After`` makes an upstream cool down: it is skipped until then,
without being ejected. When nothing is available for a request's first
attempt (all out or cooling down), the least loaded upstream is used anyway
(Envoy's "panic" routing): the pool never refuses a request by itself.

Pure logic: no I/O, no asyncio. Time comes from an injectable clock and
chance from an injectable ``random.Random``, so it is unit-tested without
sleeping. There is one pool per route in each worker process, and workers
share nothing: each learns the upstreams' health from its own traffic.
"""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

__all__ = ["Change", "EjectionPolicy", "Health", "Lease", "Pool"]


class Health(enum.Enum):
    """What one finished attempt says about its upstream."""

    OK = "ok"  # it answered (a 4xx too: the client's fault)
    FAILED = "failed"  # it failed (connect, timeout, 429, 5xx, a stream it broke)
    NEUTRAL = "neutral"  # nothing (the client left, the gateway stopped it)


class Change(enum.Enum):
    """What a finished attempt changed in its upstream's state."""

    NONE = "none"
    EJECTED = "ejected"
    RETURNED = "returned"


@dataclass(frozen=True, slots=True)
class EjectionPolicy:
    eject_after: int = 5
    base_seconds: float = 30.0
    max_seconds: float = 300.0
    max_ejected_percent: int = 50


@dataclass(frozen=True, slots=True)
class Lease:
    """One attempt's claim on an upstream, handed back to ``Pool.done``."""

    index: int
    probe: bool = False  # the half-open upstream's one probe
    panic: bool = False  # sent to an upstream that was out, because nothing else was left


class _Member:
    __slots__ = (
        "active",
        "cool_until",
        "ejections",
        "failures",
        "lease",
        "out_until",
        "probing",
        "returned_at",
        "weight",
    )

    def __init__(self, index: int, weight: int) -> None:
        self.weight = weight
        self.active = 0  # attempts in flight
        self.failures = 0  # consecutive
        self.ejections = 0  # for the doubling
        self.out_until: float | None = None  # ejected until then, half-open after
        self.probing = False  # a probe is in flight
        self.cool_until = 0.0  # Retry-After
        self.returned_at: float | None = None
        self.lease = Lease(index)


class Pool:
    """The upstreams of one route, by index, with their load and health."""

    def __init__(
        self,
        weights: Sequence[int],
        policy: EjectionPolicy | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if not weights or any(w <= 0 for w in weights):
            raise ValueError("a pool needs at least one upstream, each of positive weight")
        self._members = [_Member(i, w) for i, w in enumerate(weights)]
        self.policy = policy or EjectionPolicy()
        self._clock = clock
        self._random = rng or random.Random()
        n = len(weights)
        self._max_out = min(n - 1, n * self.policy.max_ejected_percent // 100)

    def __len__(self) -> int:
        return len(self._members)

    # -- choosing ---------------------------------------------------------------------

    def pick(self, exclude: Collection[int] = (), *, panic: bool = True) -> Lease | None:
        """Claim the upstream for the next attempt, or None.

        Skips ``exclude`` (the upstreams this request already tried), upstreams
        out of the pool and cooling down. With nothing left: with ``panic``
        the least loaded of the upstreams not excluded (a request's first
        attempt), without it None (a retry goes only to an available one).
        """
        members = self._members
        if len(members) == 1:
            if exclude:
                return None
            only = members[0]
            only.active += 1
            return only.lease
        now = self._clock()
        best = self._least_loaded(
            [i for i in range(len(members)) if i not in exclude and self._usable(members[i], now)]
        )
        if best is None:
            if not panic:
                return None
            best = self._least_loaded([i for i in range(len(members)) if i not in exclude])
            if best is None:
                return None
            member = members[best]
            member.active += 1
            return Lease(best, panic=True) if member.out_until is not None else member.lease
        member = members[best]
        member.active += 1
        if member.out_until is not None:  # half-open: this attempt is the probe
            member.probing = True
            return Lease(best, probe=True)
        return member.lease

    def available(self, exclude: Collection[int] = ()) -> bool:
        """Whether ``pick(exclude, panic=False)`` would find an upstream now."""
        now = self._clock()
        return any(i not in exclude and self._usable(m, now) for i, m in enumerate(self._members))

    def _usable(self, member: _Member, now: float) -> bool:
        if member.cool_until > now:
            return False
        out = member.out_until
        return out is None or (now >= out and not member.probing)

    def _least_loaded(self, candidates: list[int]) -> int | None:
        """The candidate with the least ``active / weight``; ties at random, by weight."""
        if not candidates:
            return None
        members = self._members
        tied: list[int] = []
        best_active, best_weight = 0, 1
        for i in candidates:
            m = members[i]
            # active / weight < best_active / best_weight, without division
            if not tied or m.active * best_weight < best_active * m.weight:
                tied = [i]
                best_active, best_weight = m.active, m.weight
            elif m.active * best_weight == best_active * m.weight:
                tied.append(i)
        if len(tied) == 1:
            return tied[0]
        point = self._random.random() * sum(members[i].weight for i in tied)
        for i in tied:
            point -= members[i].weight
            if point < 0:
                return i
        return tied[-1]

    # -- results ----------------------------------------------------------------------

    def done(self, lease: Lease, health: Health) -> Change:
        """An attempt ended: release its claim and learn from its result."""
        member = self._members[lease.index]
        member.active -= 1
        if len(self._members) == 1:
            return Change.NONE  # a pool of one is never ejected
        now = self._clock()
        if lease.probe:
            member.probing = False
            if health is Health.OK:
                self._return(member, now)
                return Change.RETURNED
            if health is Health.FAILED:
                self._eject(member, now)
                return Change.EJECTED
            return Change.NONE  # still half-open: the next attempt routed to it probes
        if member.out_until is not None:
            if lease.panic and health is Health.OK:  # out, and yet it answered: it is in
                self._return(member, now)
                return Change.RETURNED
            return Change.NONE  # started before the ejection, or failed while out
        if health is Health.OK:
            member.failures = 0
        elif health is Health.FAILED:
            member.failures += 1
            if member.failures >= self.policy.eject_after and self._out_count() < self._max_out:
                self._eject(member, now)
                return Change.EJECTED
        return Change.NONE

    def cool_down(self, index: int, seconds: float) -> None:
        """Skip upstream ``index`` for ``seconds`` (its ``Retry-After``)."""
        member = self._members[index]
        member.cool_until = max(member.cool_until, self._clock() + seconds)

    def _return(self, member: _Member, now: float) -> None:
        member.out_until = None
        member.failures = 0
        member.returned_at = now

    def _eject(self, member: _Member, now: float) -> None:
        policy = self.policy
        returned = member.returned_at  # None while out (a failed probe ejects it again)
        if returned is not None and now - returned >= policy.max_seconds:
            member.ejections = 0
        member.returned_at = None
        member.ejections += 1
        doubling = 2.0 ** min(member.ejections - 1, 32)
        member.out_until = now + min(policy.base_seconds * doubling, policy.max_seconds)
        member.failures = 0

    def _out_count(self) -> int:
        return sum(1 for m in self._members if m.out_until is not None)

    # -- state, for metrics and tests ---------------------------------------------------

    def active(self, index: int) -> int:
        """Attempts in flight on upstream ``index``."""
        return self._members[index].active

    def is_out(self, index: int) -> bool:
        """Whether upstream ``index`` is ejected or half-open (not yet returned by a probe)."""
        return self._members[index].out_until is not None

    def out_until(self, index: int) -> float | None:
        """When upstream ``index``'s ejection ends (clock time), or None when it is in."""
        return self._members[index].out_until
