"""The limiter: the relay's one question before an upstream, and its one report after.

``reserve`` turns a request into its checks (the client's own limits, its
share of the route, its share of the model) with the reservation estimate,
and asks the backend to apply them all or none: a refusal is a
``LimitRefused`` (429, in the protocol's own shape), an admission a
``Reservation``. ``settle`` replaces the reservation by the cost
(``gateway.policy.limits.cost_of``) and counts the stream out.

The backend is bounded by ``limits_timeout``: unreachable, slow or failing,
the request is admitted unreserved (``on_backend_error = "allow"``, counted
in ``gateway_limit_backend_errors_total`` and logged at most once a minute)
or refused with 503 (``"deny"``). A reservation that failed is never
settled, and nothing is replayed when the backend is back: no counter is
ever charged twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.limits.backend import Backend, BackendError
from gateway.limits.memory import MemoryBackend
from gateway.logsetup import LogGate
from gateway.policy.limits import (
    Check,
    Cost,
    Limit,
    Rule,
    Window,
    checks_for,
    requested_output,
)
from gateway.settings import ClientConfig, ClientLimits, Settings

__all__ = ["LimitRefused", "Limiter", "Reservation", "build_limiter"]

log = logging.getLogger("gateway")

#: How long the start waits for the backend to connect and load its scripts.
_START_SECONDS = 5.0
#: The budget gauges' windows, by limit.
BUDGETS = {Limit.TOKENS_PER_DAY: Window.DAY, Limit.TOKENS_PER_MONTH: Window.MONTH}
#: The x-ratelimit-* headers (limit, remaining, reset), by limit: OpenAI's names.
_HEADER_PARTS = (b"limit", b"remaining", b"reset")
_HEADER_NAMES = {
    limit: tuple(
        b"x-ratelimit-%s-%s" % (part, family) for part in (b"limit", b"remaining", b"reset")
    )
    for limit, family in (
        (Limit.REQUESTS_PER_MINUTE, b"requests"),
        (Limit.TOKENS_PER_MINUTE, b"tokens"),
    )
}


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

    @property
    def label(self) -> str:
        return str(self.limit) if self.limit is not None else "backend_error"


@dataclass(slots=True)
class Reservation:
    """One admitted request's hold on its client's counters."""

    client: str
    member: str
    checks: list[Check]
    reserved: int
    estimated_input: int
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    settled: bool = False
    #: the checks that feed the budget gauges: (index, window, value); see ``_Plan``
    budgets: tuple[tuple[int, Window, int], ...] = ()


def _rule(scope: str, limits: ClientLimits, divisor: int) -> Rule | None:
    values = {
        Limit(name): max(value // divisor, 1)
        for name, value in limits.model_dump().items()
        if value is not None
    }
    return Rule(scope, values) if values else None


@dataclass(frozen=True, slots=True)
class _ClientRules:
    own: Rule | None
    routes: Mapping[str, Rule]
    models: Mapping[str, Rule]


class Limiter:
    """Reserves and settles the named clients' limits on one backend."""

    def __init__(
        self,
        clients: list[ClientConfig],
        backend: Backend,
        *,
        timeout: float = 0.05,
        deny_on_error: bool = False,
        divisor: int = 1,
        on_error: Callable[[str], None] | None = None,
        on_budget: Callable[[str, Window, int, int], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        #: the memory backend itself (not a subclass): asked without a coroutine
        self._memory = backend if type(backend) is MemoryBackend else None
        self.timeout = timeout
        self.deny_on_error = deny_on_error
        self._on_error = on_error
        self._on_budget = on_budget
        self._clock = clock
        self._failure_log = LogGate()
        self._rules: dict[str, _ClientRules] = {}
        #: (client, route, model, stream) -> its plan for the current minute
        self._plans: dict[tuple[str, str, str | None, bool], _Plan] = {}
        for client in clients:
            if not client.limited():
                continue
            routes = {
                name: rule
                for name, limits in client.route_limits.items()
                if (rule := _rule(f"{client.name}/route={name}", limits, divisor)) is not None
            }
            models = {
                name: rule
                for name, limits in client.model_limits.items()
                if (rule := _rule(f"{client.name}/model={name}", limits, divisor)) is not None
            }
            own = _rule(client.name, client.limits, divisor)
            self._rules[client.name] = _ClientRules(own, routes, models)

    def clients(self) -> list[str]:
        """The limited clients, in configuration order."""
        return list(self._rules)

    def limited(self, client: str) -> bool:
        return client in self._rules

    def rules_of(self, client: str) -> list[Rule]:
        rules = self._rules.get(client)
        if rules is None:
            return []
        found = [rules.own] if rules.own is not None else []
        return found + list(rules.routes.values()) + list(rules.models.values())

    def _plan(self, client: str, route: str, model: str | None, stream: bool, now: float) -> _Plan:
        """The request's checks and header layout, kept for the current minute (the
        counters' names change at most once a minute)."""
        minute = int(now) // 60
        key = (client, route, model, stream)
        plan = self._plans.get(key)
        if plan is None or plan.minute != minute:
            if len(self._plans) > 4096:  # models are the client's claims: keep it bounded
                self._plans.clear()
            checks = checks_for(self._rules_for(client, route, model), stream, now)
            budgets = tuple(
                (index, window, check.value)
                for index, check in enumerate(checks)
                if (window := BUDGETS.get(check.limit)) is not None and check.scope == client
            )
            plan = self._plans[key] = _Plan(minute, checks, _header_layout(checks), budgets)
        return plan

    def _rules_for(self, client: str, route: str, model: str | None) -> list[Rule]:
        rules = self._rules[client]
        found = [rules.own] if rules.own is not None else []
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
        request: Mapping[str, Any] | None,
        estimated_input: int,
        default_output: int,
        stream: bool,
        member: str,
        hold: float,
    ) -> Reservation:
        """Reserve the request's estimate in every counter it touches, or LimitRefused."""
        now = self._clock()
        reserved = estimated_input + requested_output(request, default_output)
        plan = self._plans.get((client, route, model, stream))
        if plan is None or plan.minute != int(now) // 60:
            plan = self._plan(client, route, model, stream, now)
        checks = plan.checks
        try:
            if self._memory is not None:
                answer = self._memory.reserve_now(checks, reserved, now)
            else:
                call = self.backend.reserve(checks, reserved, member, now, hold)
                answer = await (self._ask(call) if self.backend.remote else call)
        except BackendError as exc:
            self._failed("reserve", exc)
            if self.deny_on_error:
                raise LimitRefused(503, None, 1.0, [(b"retry-after", b"1")]) from None
            return Reservation(client, member, [], 0, estimated_input, settled=True)
        if answer.refused is not None:
            check = checks[answer.refused]
            raise LimitRefused(429, check.limit, self._retry_after(check, now), []) from None
        reservation = Reservation(
            client,
            member,
            checks,
            reserved,
            estimated_input,
            _headers(plan.headers, answer.used, now) if plan.headers else [],
            False,
            plan.budgets,
        )
        if plan.budgets and self._on_budget is not None:
            self._budgets(client, plan.budgets, answer.used)
        return reservation

    async def settle(self, reservation: Reservation, cost: Cost) -> None:
        """Replace the reservation by ``cost``; once (a second call does nothing)."""
        if reservation.settled:
            return
        reservation.settled = True
        checks = reservation.checks
        try:
            if self._memory is not None:
                after = self._memory.settle_now(checks, cost.total - reservation.reserved)
            else:
                call = self.backend.settle(
                    checks, cost.total - reservation.reserved, reservation.member
                )
                after = await (self._ask(call) if self.backend.remote else call)
        except BackendError as exc:
            self._failed("settle", exc)
            return
        if reservation.budgets and self._on_budget is not None:
            self._budgets(reservation.client, reservation.budgets, after)

    async def usage(self, client: str) -> list[tuple[Rule, Limit, int]]:
        """Each limit of ``client`` with its counter now (the status page)."""
        now = self._clock()
        rules = self.rules_of(client)
        checks = checks_for(rules, True, now)
        values = await self._ask(self.backend.read(checks, now))
        by_scope = {rule.scope: rule for rule in rules}
        return [(by_scope[c.scope], c.limit, v) for c, v in zip(checks, values, strict=True)]

    async def start(self) -> None:
        """Warm the backend up at start (a connection, the scripts loaded): the first
        requests would otherwise pay for it within limits_timeout. A backend that is
        not there yet is logged, not fatal: requests then follow on_backend_error."""
        try:
            async with asyncio.timeout(_START_SECONDS):
                await self.backend.prepare()
        except (BackendError, TimeoutError) as exc:
            log.warning(
                "limits backend not ready at start (%s); requests follow "
                "on_backend_error until it answers",
                exc or "timeout",
            )

    async def close(self) -> None:
        await self.backend.close()

    async def _ask(self, call: Any) -> Any:
        if not self.backend.remote:
            return await call
        try:
            async with asyncio.timeout(self.timeout):
                return await call
        except TimeoutError:
            raise BackendError("timeout") from None

    def _failed(self, operation: str, exc: BackendError) -> None:
        if self._on_error is not None:
            self._on_error(operation)
        if self._failure_log.open():
            log.warning(
                "limits backend: %s failed (%s); %s until it answers again "
                "(logged at most once a minute)",
                operation,
                exc,
                "refusing limited clients (503)" if self.deny_on_error else "serving unlimited",
            )

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


@dataclass(frozen=True, slots=True)
class _Plan:
    minute: int
    checks: list[Check]
    headers: list[_HeaderSlot]
    #: the checks that feed the budget gauges: the client's own day and month limits,
    #: (index of the check, its window, its value)
    budgets: tuple[tuple[int, Window, int], ...]


#: A header of the layout: (index of the check, its limit header (a constant pair, shared
#: by every request of the plan: tuples are immutable), its remaining and reset names,
#: its value).
_HeaderSlot = tuple[int, tuple[bytes, bytes], bytes, bytes, int]


def _header_layout(checks: list[Check]) -> list[_HeaderSlot]:
    """Which checks give OpenAI's x-ratelimit-* headers: for each per-minute limit, the
    first scope's (the client's own when it has one)."""
    layout: list[_HeaderSlot] = []
    seen: set[Limit] = set()
    for index, check in enumerate(checks):
        names = _HEADER_NAMES.get(check.limit)
        if names is not None and check.limit not in seen:
            seen.add(check.limit)
            layout.append((index, (names[0], b"%d" % check.value), names[1], names[2], check.value))
    return layout


def _headers(layout: list[_HeaderSlot], used: list[int], now: float) -> list[tuple[bytes, bytes]]:
    reset = b"%.3fs" % (60.0 - now % 60.0)
    headers: list[tuple[bytes, bytes]] = []
    extend = headers.extend
    for index, limit, remaining, resets, value in layout:
        left = value - used[index]
        extend((limit, (remaining, b"%d" % left if left > 0 else b"0"), (resets, reset)))
    return headers


def build_limiter(
    settings: Settings,
    on_error: Callable[[str], None] | None = None,
    on_budget: Callable[[str, Window, int, int], None] | None = None,
) -> Limiter | None:
    """The limiter the settings ask for; None when no client has a limit."""
    if not any(c.limited() for c in settings.clients):
        return None
    backend: Backend
    if settings.limits_backend == "redis":
        from gateway.limits.redis_backend import RedisBackend

        assert settings.redis_url is not None
        backend = RedisBackend(settings.redis_url, settings.limits_timeout)
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
        timeout=settings.limits_timeout,
        deny_on_error=settings.on_backend_error == "deny",
        divisor=divisor,
        on_error=on_error,
        on_budget=on_budget,
    )
