"""The limiter: the relay's one question before an upstream, and its one report after.

``reserve`` turns a request into its checks (the client's own limits, its
share of the route, its share of the model) with the reservation estimate,
and asks the backend to apply them all or none: a refusal is a
``LimitRefused`` (429, in the protocol's own shape), an admission a
``Reservation``. ``settle`` replaces the reservation by the cost
(``gateway.policy.quota.cost_of``) and counts the stream out.

``budget_enforcement = "strict"`` (per client) reserves an upper bound of the
input and at most the output the token counters have left, and the
reservation says that cap (``output_cap``): the relay writes it into the
request's own output limit, so the provider stops there.

Before the backend has answered once, no limited request is admitted (503).
Unreachable, slow or failing later (``limits_timeout``, measured on the
backend's socket, not on this loop), the request is admitted unreserved
(``on_backend_error = "allow"``, counted in
``gateway_limit_backend_errors_total``) and settled at its whole cost when the
backend answers again, or refused with 503 (``"deny"``) and its reservation
cancelled. Every reservation has its own id: nothing the backend runs late is
ever charged twice or charged for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gateway.limits.backend import Ask, Backend, BackendError, Bill
from gateway.limits.memory import MemoryBackend
from gateway.money.prices import NANOS_PER_USD, Quote, nanos_to_usd
from gateway.policy.quota import (
    Check,
    Cost,
    Limit,
    Rule,
    Window,
    checks_for,
)
from gateway.settings import ClientConfig, ClientLimits, Settings, TeamConfig

__all__ = ["LimitRefused", "Limiter", "Reservation", "Unpriced", "build_limiter"]

log = logging.getLogger("gateway")

#: How long the start waits for the backend to connect and load its scripts.
_START_SECONDS = 5.0
#: How often a backend that has not answered yet is asked again.
_READY_INTERVAL = 0.5
#: The x-ratelimit-* header families, in the order they are sent (``usd``: a money budget's,
#: in dollars).
_FAMILIES = (b"requests", b"tokens", b"usd")


class LimitRefused(Exception):
    """A request that does not fit a limit of its client (429), or a backend that
    could not be asked with ``on_backend_error = "deny"`` (503)."""

    def __init__(
        self, status: int, limit: Limit | None, retry_after: float, headers: list[Any]
    ) -> None:
        super().__init__(str(limit))
        self.status = status
        self.limit = limit
        self.retry_after = retry_after
        self.headers = headers
        #: a money budget the request alone costs more than (it can never fit: not retried)
        self.never: tuple[int, int] | None = None

    @property
    def label(self) -> str:
        return str(self.limit) if self.limit is not None else "backend_error"

    @property
    def rejected(self) -> str:
        """The access log's ``rejected`` reason."""
        return "rate_limited" if self.status == 429 else "limits_unavailable"


class _BadRequest(LimitRefused):
    """A refusal with 400 that no wait can help, under no limit: ``name`` is its label
    and its ``rejected`` reason."""

    name: ClassVar[str]

    def __init__(self) -> None:
        super().__init__(400, None, 0.0, [])

    @property
    def label(self) -> str:
        return self.name

    @property
    def rejected(self) -> str:
        return self.name


class Unpriced(_BadRequest):
    """A request under a money budget for a model that nothing prices (400): retrying
    cannot help."""

    name = "unpriced"

    def __init__(self, model: str | None) -> None:
        super().__init__()
        self.model = model


class TooLarge(LimitRefused):
    """A request whose reservation is larger than a limit itself (429, no retry): it can
    never fit, however long it waits; its message says how to make it fit."""

    def __init__(
        self, limit: Limit, value: int, input_: int, output: int, strict: bool, headers: list[Any]
    ) -> None:
        super().__init__(429, limit, 0.0, headers)
        self.value = value
        self.input = input_
        self.output = output
        self.strict = strict

    @property
    def rejected(self) -> str:
        return "too_large"


class Uncapped(_BadRequest):
    """A strict client's request whose body the gateway could not rewrite to cap its
    output at what is left (too complex to parse within the body parser's budget): 400,
    never sent upstream uncapped; its own ``max_tokens`` at most ``cap`` needs no
    rewrite."""

    name = "uncapped"

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap


def _too_large(
    checks: list[Check], input_: int, output: int, strict: bool
) -> tuple[Check, int] | None:
    """The first token check a reservation can never fit in, whatever its counter holds:
    more tokens than its limit; with ``strict``, the output is capped at what is left, so
    only the input and one output token must fit. Its minimal amount with it. (A money
    budget the request alone costs more than is told so by ``LimitRefused.never``.)"""
    least = output if not strict else min(output, 1)
    for check in checks:
        if check.tokens and input_ + least > check.value:
            return check, input_ + least
    return None


@dataclass(slots=True)
class Reservation:
    """One admitted request's hold on its client's counters."""

    client: str
    ask: Ask
    checks: list[Check]
    reserved: int
    estimated_input: int
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    settled: bool = False
    #: the checks that feed the budget gauges: (index, window, value); see ``_Plan``
    budgets: tuple[tuple[int, Window, int], ...] = ()
    #: (client, route, model, stream): its plan, for the checks of the settlement's windows
    plan: tuple[str, str, str | None, bool] = ("", "", None, False)
    #: ``strict``: the output tokens the request may produce (the relay caps it there)
    output_cap: int | None = None
    #: False when the backend did not answer the reservation (it may still run late)
    counted: bool = True
    #: the money reserved (nano-dollars)
    money: int = 0
    #: after its settlement: each day, month or total budget it was charged in, and what
    #: that budget has left (its receipt's ``budgets``)
    left: list[tuple[str, str, int, int, bool]] | None = None

    @property
    def member(self) -> str:
        return self.ask.member


def _rule(scope: str, limits: ClientLimits, divisor: int, tag: str = "") -> Rule | None:
    values: dict[Limit, int] = {}
    for name, value in limits.model_dump().items():
        if value is None:
            continue
        limit = Limit[name.upper()]
        if limit.counts_money:  # dollars (a Decimal) to nano-dollars, exactly
            value = int(value * NANOS_PER_USD)
        values[limit] = max(value // divisor, 1)
    return Rule(scope, values, tag) if values else None


@dataclass(frozen=True, slots=True)
class _ClientRules:
    own: Rule | None
    routes: Mapping[str, Rule]
    models: Mapping[str, Rule]
    strict: bool
    #: its team's limits (shared by the team's clients), checked with its own
    team: Rule | None = None
    #: whether any of its limits (its team's included) counts money
    money: bool = False
    #: a model nothing prices is served (unpriced, charged nothing) instead of refused
    allow_unpriced: bool = False

    def always(self) -> list[Rule]:
        """The rules every request of the client meets: its own and its team's."""
        found = [self.own] if self.own is not None else []
        if self.team is not None:
            found.append(self.team)
        return found


def _client_rules(
    client: ClientConfig, divisor: int, team_limits: Mapping[str, ClientLimits]
) -> _ClientRules | None:
    """A client's rules (its team's included); None when it has no limit at all."""
    team = client.team
    # a client in a team and the team share one tag (one Redis Cluster slot)
    tag = f"team:{team}" if team is not None else ""
    team_rule = (
        _rule(f"team:{team}", team_limits[team], divisor, tag)
        if team is not None and team in team_limits
        else None
    )
    if not client.limited() and team_rule is None:
        return None
    routes = {
        name: rule
        for name, limits in client.route_limits.items()
        if (rule := _rule(f"{client.name}/route={name}", limits, divisor, tag)) is not None
    }
    models = {
        name: rule
        for name, limits in client.model_limits.items()
        if (rule := _rule(f"{client.name}/model={name}", limits, divisor, tag)) is not None
    }
    own = _rule(client.name, client.limits, divisor, tag)
    strict = client.budget_enforcement == "strict"
    every = [r for r in (own, team_rule, *routes.values(), *models.values()) if r]
    money = any(limit.counts_money for r in every for limit in r.limits)
    return _ClientRules(own, routes, models, strict, team_rule, money, client.unpriced == "allow")


class Limiter:
    """Reserves and settles the named clients' limits on one backend."""

    def __init__(
        self,
        clients: list[ClientConfig],
        backend: Backend,
        *,
        teams: list[TeamConfig] | None = None,
        deny_on_error: bool = False,
        divisor: int = 1,
        on_error: Callable[[str], None] | None = None,
        on_budget: Callable[[str, Window, int, int], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        #: the memory backend itself (not a subclass): asked without a coroutine
        self._memory = backend if type(backend) is MemoryBackend else None
        self.deny_on_error = deny_on_error
        self._on_error = on_error
        self._on_budget = on_budget
        self._clock = clock
        self._rules: dict[str, _ClientRules] = {}
        #: (client, route, model, stream) -> its plan for the current minute
        self._plans: dict[tuple[str, str, str | None, bool], _Plan] = {}
        #: reservation ids: unique to this process and its start, then a count
        self._ids = itertools.count()
        self._id_prefix = f"{os.getpid():x}{secrets.token_hex(4)}."
        self._waiting: asyncio.Task[None] | None = None
        self._divisor = divisor
        self._team_limits = {team.name: team.limits for team in teams or ()}
        for client in clients:
            rules = _client_rules(client, divisor, self._team_limits)
            if rules is not None:
                self._rules[client.name] = rules

    def put_client(self, name: str, client: ClientConfig | None) -> None:
        """A client's limits changed at run time (an issued key's): ``client``'s (its team's
        included) from now on, or none (None, or a client without limits)."""
        for key in [k for k in self._plans if k[0] == name]:
            del self._plans[key]
        rules = _client_rules(client, self._divisor, self._team_limits) if client else None
        if rules is None:
            self._rules.pop(name, None)
        else:
            self._rules[name] = rules

    @property
    def ready(self) -> bool:
        """Whether the backend has answered once (before that, nothing is admitted)."""
        return self.backend.ready

    @property
    def backend_down_for(self) -> float | None:
        """Seconds since the backend stopped answering, None while it answers."""
        return self.backend.down_for

    def clients(self) -> list[str]:
        """The limited clients, in configuration order."""
        return list(self._rules)

    def limited(self, client: str) -> bool:
        return client in self._rules

    def strict(self, client: str) -> bool:
        """Whether ``client``'s budgets are enforced strictly (an upper bound reserved)."""
        rules = self._rules.get(client)
        return rules is not None and rules.strict

    def counts_money(self, client: str) -> bool:
        """Whether ``client`` (or its team) has a money limit (its requests are priced
        before they are sent)."""
        rules = self._rules.get(client)
        return rules is not None and rules.money

    def rules_of(self, client: str) -> list[Rule]:
        rules = self._rules.get(client)
        if rules is None:
            return []
        return rules.always() + list(rules.routes.values()) + list(rules.models.values())

    def _plan(self, client: str, route: str, model: str | None, stream: bool, now: float) -> _Plan:
        """The request's checks, kept for the current minute (the counters' names change
        at most once a minute)."""
        minute = int(now) // 60
        key = (client, route, model, stream)
        plan = self._plans.get(key)
        if plan is None or plan.minute != minute:
            if len(self._plans) > 4096:  # models are the client's claims: keep it bounded
                self._plans.clear()
            checks = checks_for(self._rules_for(client, route, model), stream, now)
            budgets = tuple(
                (index, check.limit.window, check.value)
                for index, check in enumerate(checks)
                if check.limit.is_budget
                and check.scope == client
                and check.limit.window
                and check.tokens
            )
            plan = self._plans[key] = _Plan(minute, checks, budgets, _header_layout(checks))
        return plan

    def _rules_for(self, client: str, route: str, model: str | None) -> list[Rule]:
        rules = self._rules.get(client)
        if rules is None:
            return []
        found = rules.always()
        if rules.routes and route in rules.routes:
            found.append(rules.routes[route])
        if rules.models and model is not None and model in rules.models:
            found.append(rules.models[model])
        return found

    async def reserve(
        self,
        client: str,
        route: str,
        model: str | None,
        estimated_input: int,
        output: int,
        stream: bool,
        request_id: str,
        hold: float,
        bound_input: int | None = None,
        quote: Quote | None = None,
    ) -> Reservation:
        """Reserve the request's estimate (``strict``: ``bound_input`` and at most what is
        left for the output) in every counter it touches, or LimitRefused. ``output`` is
        what the request allows itself by its protocol's own fields
        (``ProtocolSpec.requested_output``), or its route's default reservation. Under a
        money limit the request is priced at ``quote`` (its dearest token prices: an upper
        bound); a model without one is refused (``Unpriced``) unless its client allows
        it (then it reserves, and is charged, no money)."""
        now = self._clock()
        rules = self._rules.get(client)
        if rules is None:  # its limits were taken away since it was asked (an issued key)
            return Reservation(client, Ask("", 0, 0, False, hold), [], 0, 0, settled=True)
        strict = rules.strict
        input_ = bound_input if strict and bound_input is not None else estimated_input
        input_money = output_pico = 0
        if rules.money and (input_ or output):  # (a cache hit reserves nothing)
            if quote is not None:
                input_money = quote.bound(input_, 0)
                output_pico = quote.output_pico
            elif not rules.allow_unpriced:
                raise Unpriced(model)
        ask = Ask(
            # an id only where a reservation can outlive its call (the memory backend's
            # cannot)
            "" if self._memory is not None else f"{self._id_prefix}{next(self._ids)}",
            input_,
            output,
            strict,
            hold,
            input_money,
            output_pico,
        )
        key = (client, route, model, stream)
        plan = self._plans.get(key)
        if plan is None or plan.minute != int(now) // 60:
            plan = self._plan(client, route, model, stream, now)
        checks = plan.checks
        never = _too_large(checks, input_, output, strict)
        if never is not None:
            check, _ = never
            raise TooLarge(check.limit, check.value, input_, output, strict, [])
        if self._memory is not None:
            answer = self._memory.reserve_now(checks, ask, now)
        elif not checks:  # (a client whose only limit is on streams, and no stream)
            return Reservation(client, ask, [], 0, estimated_input, settled=True, plan=key)
        elif not self.backend.ready:
            raise LimitRefused(503, None, 1.0, [])
        else:
            try:
                answer = await self.backend.reserve(checks, ask, now)
            except BackendError as exc:
                self._failed("reserve", exc)
                if self.deny_on_error:
                    cancel = getattr(self.backend, "cancel", None)
                    if cancel is not None:
                        cancel(checks, ask)
                    raise LimitRefused(503, None, 1.0, []) from None
                reserved = input_ + output
                return Reservation(
                    client,
                    ask,
                    checks,
                    reserved,
                    estimated_input,
                    plan=key,
                    counted=False,
                    money=input_money + -(-output * output_pico // 1000),
                )
        headers = _headers(plan.headers, answer.used, now)
        if answer.refused is not None:
            check = checks[answer.refused]
            refused = LimitRefused(429, check.limit, self._retry_after(check, now), headers)
            if check.money and answer.money > check.value:
                refused.never = (answer.money, check.value)
            raise refused
        reservation = Reservation(
            client,
            ask,
            checks,
            input_ + answer.output,
            estimated_input,
            headers,
            False,
            plan.budgets,
            key,
            answer.output if strict else None,
            money=answer.money,
        )
        if plan.budgets and self._on_budget is not None:
            self._budgets(client, plan.budgets, answer.used)
        return reservation

    async def settle(self, reservation: Reservation, cost: Cost, served: bool = True) -> None:
        """Replace the reservation by ``cost``; once (a second call does nothing). A request
        refused after its reservation (not ``served``) is counted out of its requests."""
        if reservation.settled:
            return
        reservation.settled = True
        checks = reservation.checks
        if not checks:
            return
        now = self._clock()
        plan = self._plans.get(reservation.plan)
        if plan is None or plan.minute != int(now) // 60:
            plan = self._plan(*reservation.plan, now)
        current = plan.checks
        if self._memory is not None:
            delta = cost.total - reservation.reserved
            after = self._memory.settle_now(
                checks, current, delta, served, cost.money - reservation.money
            )
        else:
            try:
                bill = Bill(reservation.reserved, cost.total, served, reservation.money, cost.money)
                after = await self.backend.settle(checks, current, reservation.ask, bill)
            except BackendError as exc:
                self._failed("settle", exc)
                return
        reservation.left = _left(current, after)
        if reservation.budgets and self._on_budget is not None:
            self._budgets(reservation.client, reservation.budgets, after)

    async def usage(self, client: str) -> list[tuple[Rule, Limit, int]]:
        """Each limit of ``client`` with its counter now (the status page)."""
        now = self._clock()
        rules = self.rules_of(client)
        checks = checks_for(rules, True, now)
        values = await self.backend.read(checks, now)
        by_scope = {rule.scope: rule for rule in rules}
        return [(by_scope[c.scope], c.limit, v) for c, v in zip(checks, values, strict=True)]

    async def start(self) -> None:
        """Warm the backend up at start (a connection, the scripts loaded). A backend that
        is not there yet is logged, not fatal: it is asked again until it answers, and
        until then the gateway is not ready and admits no limited request."""
        try:
            async with asyncio.timeout(_START_SECONDS):
                await self.backend.prepare()
        except (BackendError, TimeoutError) as exc:
            log.warning(
                "limits backend not ready at start (%s): not ready, and no limited "
                "request is admitted, until it answers",
                exc or "timeout",
            )
            self._waiting = asyncio.get_running_loop().create_task(self._until_ready())

    async def _until_ready(self) -> None:
        while not self.backend.ready:
            with contextlib.suppress(BackendError):
                await self.backend.prepare()
            if not self.backend.ready:
                await asyncio.sleep(_READY_INTERVAL)

    async def close(self) -> None:
        if self._waiting is not None:
            self._waiting.cancel()
        await self.backend.close()

    def _failed(self, operation: str, exc: BackendError) -> None:
        if self._on_error is not None:
            self._on_error(operation)

    def _retry_after(self, check: Check, now: float) -> float:
        if check.expires is None:
            return 1.0
        return max(check.expires - now, 0.001)

    def _budgets(
        self,
        client: str,
        budgets: tuple[tuple[int, Window, int], ...],
        values: list[int | None] | list[int],
    ) -> None:
        """The budget gauges: the client's own day and month checks, at their new values
        (their positions kept in the plan: the other checks are not looked at)."""
        assert self._on_budget is not None
        for index, window, limit in budgets:
            value = values[index]
            if value is not None:
                self._on_budget(client, window, limit, value)


def _left(checks: list[Check], after: list[int | None]) -> list[tuple[str, str, int, int, bool]]:
    """Each budget (a day's, a month's, a total) of ``checks``: its scope, limit, value,
    what it has left, and whether it counts money (nano-dollars; formatted by whoever
    shows it, not on the request's way)."""
    return [
        (check.scope, check.limit.value, check.value, check.value - value, check.money)
        for check, value in zip(checks, after, strict=False)
        if value is not None and check.limit.is_budget
    ]


@dataclass(frozen=True, slots=True)
class _Plan:
    minute: int
    checks: list[Check]
    #: the checks that feed the budget gauges: the client's own day and month limits,
    #: (index of the check, its window, its value)
    budgets: tuple[tuple[int, Window, int], ...]
    #: the x-ratelimit-* headers' layout (``_header_layout``)
    headers: tuple[_Family, ...]


#: A family's headers in a plan: its three names, and its candidates (the index of each
#: check of the family, its value, its window's end).
_Family = tuple[bytes, bytes, bytes, tuple[tuple[int, int, int], ...]]


def _header_layout(checks: list[Check]) -> tuple[_Family, ...]:
    """Which checks give OpenAI's x-ratelimit-* headers: every windowed limit of each
    family (requests, tokens), of every scope; the one with the least left is told."""
    layout: list[_Family] = []
    for name in _FAMILIES:
        candidates = tuple(
            (index, check.value, check.expires)
            for index, check in enumerate(checks)
            if check.expires is not None and check.limit.family.encode() == name
        )
        if candidates:
            limit, remaining, reset = (
                b"x-ratelimit-%s-%s" % (part, name) for part in (b"limit", b"remaining", b"reset")
            )
            layout.append((limit, remaining, reset, candidates))
    return tuple(layout)


def _headers(layout: tuple[_Family, ...], used: list[int], now: float) -> list[tuple[bytes, bytes]]:
    """For each family, the limit with the least left, its remaining and its reset."""
    headers: list[tuple[bytes, bytes]] = []
    extend = headers.extend
    for limit_name, remaining_name, reset_name, candidates in layout:
        index, value, end = candidates[0]
        left = value - used[index]
        if len(candidates) > 1:
            for other_index, other_value, other_end in candidates:
                other_left = other_value - used[other_index]
                if other_left < left:
                    left, value, end = other_left, other_value, other_end
        if limit_name.endswith(b"usd"):  # a money budget's, in dollars
            extend(
                (
                    (limit_name, nanos_to_usd(value).encode()),
                    (remaining_name, nanos_to_usd(max(left, 0)).encode()),
                    (reset_name, b"%.3fs" % (end - now if end > now else 0.0)),
                )
            )
            continue
        extend(
            (
                (limit_name, b"%d" % value),
                (remaining_name, b"%d" % left if left > 0 else b"0"),
                (reset_name, b"%.3fs" % (end - now if end > now else 0.0)),
            )
        )
    return headers


def build_limiter(
    settings: Settings,
    on_error: Callable[[str], None] | None = None,
    on_budget: Callable[[str, Window, int, int], None] | None = None,
) -> Limiter | None:
    """The limiter the settings ask for; None when no client has a limit (and no key
    can be issued one at run time)."""
    team_limited = {team.name for team in settings.teams if team.limits.any()}
    if (
        not any(c.limited() or c.team in team_limited for c in settings.clients)
        and settings.keys.store == "off"
    ):
        return None
    backend: Backend
    if settings.limits_backend == "redis":
        from gateway.limits.redis_backend import RedisBackend

        target = settings.redis_target()
        assert target is not None
        backend = RedisBackend(target, settings.limits_timeout)
        divisor = 1
    else:
        backend = MemoryBackend()
        divisor = settings.workers if settings.limits_per_worker else 1
        if divisor > 1:
            log.info(
                "limits_per_worker: each of the %d workers enforces every client limit "
                "divided by %d",
                divisor,
                divisor,
            )
    return Limiter(
        settings.clients,
        backend,
        teams=settings.teams,
        deny_on_error=settings.on_backend_error == "deny",
        divisor=divisor,
        on_error=on_error,
        on_budget=on_budget,
    )
