"""Each named client's use against its limits, for the ``/status`` page."""

from __future__ import annotations

from gateway.limits.backend import BackendError
from gateway.limits.limiter import Limiter
from gateway.observe.status_page import ClientUse

__all__ = ["client_use"]


async def client_use(limiter: Limiter) -> list[ClientUse]:
    """Every limit of every limited client with its counter now; a backend that does not
    answer within limits_timeout shows them as unavailable."""
    rows: list[ClientUse] = []
    for client in limiter.clients():
        try:
            usage = await limiter.usage(client)
            values: list[int | None] = [used for _, _, used in usage]
        except BackendError:
            usage = [(rule, limit, 0) for rule in limiter.rules_of(client) for limit in rule.limits]
            values = [None] * len(usage)
        for (rule, limit, _), used in zip(usage, values, strict=True):
            scope = rule.scope.partition("/")[2] or "all"
            rows.append(ClientUse(client, scope, str(limit), used, rule.limits[limit]))
    return rows
