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

Priority tiers (Envoy's priority levels): each upstream has a ``tier``
(its ``priority``, default 0). An attempt goes to the lowest tier with an
available upstream; a higher tier takes traffic only while every lower one
is out or cooling down, or as a retry's target (``pick(above=)``). An
ejected upstream whose time is over is available again (for its probe), so
traffic returns to a recovered lower tier at once.

A ``Retry-After`` (or a 429's backoff, ``throttle``) makes an upstream cool
down for one model (providers rate-limit per model; None: a request without
one): it is skipped for that model until then, without being ejected.
When nothing is available for a request's first attempt (all out or
cooling down), the least loaded upstream is used anyway (Envoy's "panic"
routing): the pool never refuses a request by itself.

A member is in one ``MemberState`` (after wsproto's ``ConnectionState``):
``in``, ``ejected`` (out until its time is over), ``half_open`` (its one
probe in flight); ``_TRANSITIONS`` is every move allowed and any other
raises ``PoolError``. ``cooling`` is what ``state`` reports for a member
that is in but waits out a ``Retry-After``.

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

__all__ = ["Change", "EjectionPolicy", "Health", "Lease", "MemberState", "Pool", "PoolError"]


class MemberState(enum.StrEnum):
    """Where one upstream of a pool stands."""

    IN = "in"  # takes traffic
    EJECTED = "ejected"  # out until ``out_until``; the next pick after that probes it
    HALF_OPEN = "half_open"  # its one probe is in flight
    COOLING = "cooling"  # in, but skipped until its Retry-After passes (reported only)


#: Every allowed move of a member's stored state (``cooling`` is derived, never stored).
_TRANSITIONS: dict[MemberState, frozenset[MemberState]] = {
    MemberState.IN: frozenset({MemberState.EJECTED}),
    # its time over, its probe; or, sent a request by panic routing, it answered
    MemberState.EJECTED: frozenset({MemberState.HALF_OPEN, MemberState.IN}),
    # a failed probe ejects again; a probe that said nothing leaves it ejected, probe-ready
    MemberState.HALF_OPEN: frozenset({MemberState.IN, MemberState.EJECTED}),
    MemberState.COOLING: frozenset(),
}


class PoolError(RuntimeError):
    """A member transition the table does not allow (a bug in the pool)."""


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
        "returned_at",
        "state",
        "throttles",
        "tier",
        "weight",
    )

    def __init__(self, index: int, weight: int, tier: int = 0) -> None:
        self.weight = weight
        self.tier = tier
        self.active = 0  # attempts in flight
        self.failures = 0  # consecutive
        self.ejections = 0  # for the doubling
        self.state = MemberState.IN
        self.out_until: float | None = None  # while not in: ejected until then
        self.cool_until: dict[str | None, float] = {}  # by model: Retry-After, backoff
        self.throttles: dict[str | None, tuple[int, float]] = {}  # by model: (count, until)
        self.returned_at: float | None = None
        self.lease = Lease(index)

    def move(self, to: MemberState) -> None:
        if to not in _TRANSITIONS[self.state]:
            raise PoolError(f"pool member: {self.state} -> {to} is not allowed")
        self.state = to


class Pool:
    """The upstreams of one route, by index, with their load and health."""

    def __init__(
        self,
        weights: Sequence[int],
        policy: EjectionPolicy | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        tiers: Sequence[int] | None = None,
    ) -> None:
        if not weights or any(w <= 0 for w in weights):
            raise ValueError("a pool needs at least one upstream, each of positive weight")
        tiers = tiers or [0] * len(weights)
        if len(tiers) != len(weights):
            raise ValueError("a pool needs one tier per upstream")
        pairs = zip(weights, tiers, strict=True)
        self._members = [_Member(i, w, t) for i, (w, t) in enumerate(pairs)]
        self.policy = policy or EjectionPolicy()
        self._clock = clock
        self._random = rng or random.Random()
        n = len(weights)
        self._max_out = min(n - 1, n * self.policy.max_ejected_percent // 100)

    def __len__(self) -> int:
        return len(self._members)

    # -- choosing ---------------------------------------------------------------------

    def pick(
        self,
        exclude: Collection[int] = (),
        *,
        panic: bool = True,
        model: str | None = None,
        tier: int | None = None,
        above: int | None = None,
    ) -> Lease | None:
        """Claim the upstream for the next attempt, or None.

        Skips ``exclude`` (the upstreams this request already tried), upstreams
        out of the pool and cooling down for ``model``; of the rest, the lowest
        tier (only ``tier`` when given, only tiers above ``above`` when given)
        and in it the least loaded. With nothing left: with ``panic`` the least
        loaded of the upstreams not excluded (a request's first attempt),
        without it None (a retry goes only to an available one).
        """
        members = self._members
        if len(members) == 1:
            if exclude:
                return None
            only = members[0]
            only.active += 1
            return only.lease
        now = self._clock()
        candidates = self._candidates(exclude, now, model)
        if tier is not None or above is not None:
            candidates = [i for i in candidates if self._in_range(members[i], tier, above)]
        best = self._least_loaded(self._lowest_tier(candidates))
        if best is None:
            if not panic:
                return None
            best = self._least_loaded([i for i in range(len(members)) if i not in exclude])
            if best is None:
                return None
            member = members[best]
            member.active += 1
            # sent to a member that is out: if it answers, it is serving (``done``)
            return Lease(best, panic=True) if member.state is not MemberState.IN else member.lease
        return self._claim(best)

    def claim(self, index: int) -> Lease | None:
        """Claim upstream ``index`` itself (a retry on the same upstream, which waits out
        its cool-down first), or None while it is out of the pool."""
        member = self._members[index]
        if member.state is not MemberState.IN and not self._usable(member, self._clock()):
            return None
        return self._claim(index)

    def _claim(self, index: int) -> Lease:
        member = self._members[index]
        member.active += 1
        if member.state is MemberState.EJECTED:  # its time is over: this attempt probes
            member.move(MemberState.HALF_OPEN)
            return Lease(index, probe=True)
        return member.lease

    def available(
        self,
        exclude: Collection[int] = (),
        *,
        model: str | None = None,
        tier: int | None = None,
        above: int | None = None,
    ) -> bool:
        """Whether ``pick(exclude, panic=False, ...)`` would find an upstream now."""
        now = self._clock()
        members = self._members
        return any(
            self._in_range(members[i], tier, above) for i in self._candidates(exclude, now, model)
        )

    def _candidates(self, exclude: Collection[int], now: float, model: str | None) -> list[int]:
        return [
            i
            for i, m in enumerate(self._members)
            if i not in exclude and self._usable(m, now, model)
        ]

    @staticmethod
    def _in_range(member: _Member, tier: int | None, above: int | None) -> bool:
        return (tier is None or member.tier == tier) and (above is None or member.tier > above)

    def _lowest_tier(self, candidates: list[int]) -> list[int]:
        if not candidates:
            return candidates
        members = self._members
        lowest = min(members[i].tier for i in candidates)
        return [i for i in candidates if members[i].tier == lowest]

    def _usable(self, member: _Member, now: float, model: str | None = None) -> bool:
        cool = member.cool_until
        if cool and (cool.get(model, 0.0) > now or cool.get(None, 0.0) > now):
            return False
        state = member.state
        if state is MemberState.IN:
            return True
        out = member.out_until
        return state is MemberState.EJECTED and out is not None and now >= out

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
            if health is Health.OK:
                self._return(member, now)
                return Change.RETURNED
            if health is Health.FAILED:
                self._eject(member, now)
                return Change.EJECTED
            member.move(MemberState.EJECTED)  # its time is over: the next pick probes again
            return Change.NONE
        if member.state is not MemberState.IN:
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

    def cool_down(self, index: int, seconds: float, model: str | None = None) -> None:
        """Skip upstream ``index`` for ``model`` for ``seconds`` (its ``Retry-After``)."""
        member = self._members[index]
        until = self._clock() + seconds
        cool = member.cool_until
        if cool.get(model, 0.0) < until:
            cool[model] = until

    def throttle(self, index: int, model: str | None, base: float, cap: float) -> float:
        """A 429 without ``Retry-After``: cool upstream ``index`` down for ``model`` for a
        backoff that doubles with each throttle in a row (``base``, at most ``cap``) and
        starts over once ``cap`` has passed without one; returns the cool-down."""
        member = self._members[index]
        now = self._clock()
        count, until = member.throttles.get(model, (0, 0.0))
        count = count + 1 if now - until < cap else 1
        seconds = min(base * 2.0 ** min(count - 1, 32), cap)
        member.throttles[model] = (count, now + seconds)
        self.cool_down(index, seconds, model)
        return seconds

    def cooling_for(self, index: int, model: str | None = None) -> float:
        """Seconds until upstream ``index`` ends cooling down for ``model`` (0: it is not)."""
        cool = self._members[index].cool_until
        until = max(cool.get(model, 0.0), cool.get(None, 0.0)) if cool else 0.0
        return max(until - self._clock(), 0.0)

    def _return(self, member: _Member, now: float) -> None:
        member.move(MemberState.IN)
        member.out_until = None
        member.failures = 0
        member.returned_at = now

    def _eject(self, member: _Member, now: float) -> None:
        policy = self.policy
        returned = member.returned_at  # None while out (a failed probe ejects it again)
        if returned is not None and now - returned >= policy.max_seconds:
            member.ejections = 0
        member.move(MemberState.EJECTED)
        member.returned_at = None
        member.ejections += 1
        doubling = 2.0 ** min(member.ejections - 1, 32)
        member.out_until = now + min(policy.base_seconds * doubling, policy.max_seconds)
        member.failures = 0

    def _out_count(self) -> int:
        return sum(1 for m in self._members if m.state is not MemberState.IN)

    # -- state, for metrics and tests ---------------------------------------------------

    def active(self, index: int) -> int:
        """Attempts in flight on upstream ``index``."""
        return self._members[index].active

    def is_out(self, index: int) -> bool:
        """Whether upstream ``index`` is ejected or half-open (not yet returned by a probe)."""
        return self._members[index].state is not MemberState.IN

    def state(self, index: int, model: str | None = None) -> MemberState:
        """Where upstream ``index`` stands now (``cooling``: in, but waiting out a
        Retry-After for ``model``)."""
        member = self._members[index]
        if member.state is MemberState.IN and self.cooling_for(index, model) > 0:
            return MemberState.COOLING
        return member.state

    def tier(self, index: int) -> int:
        """Upstream ``index``'s priority tier (0 first)."""
        return self._members[index].tier

    def out_until(self, index: int) -> float | None:
        """When upstream ``index``'s ejection ends (clock time), or None when it is in."""
        return self._members[index].out_until
