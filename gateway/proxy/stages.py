"""Stages: a request's optional features, as an ordered list the app hands the relay.

A stage is ``async (exchange, call_next)``: it may act before the rest of the
request's way (refuse it, answer it itself, rewrite the body, reserve), call
``call_next(exchange)`` once or not at all, and act after it (settle, record),
knowing only the next. ``chain`` wraps the list around the relay's own last
step in reverse, as Starlette's ``build_middleware_stack`` wraps its layers, so
the first stage listed is the outermost: an order that matters (a resume is
answered before the cache is asked; a cache hit spends no tokens; limits settle
last) is the list's order, written once where the app builds it.

When a stage runs, the exchange already knows what the request is: its
protocol spec, ``rest`` (the path under the route's prefix), ``request_json``
(the body's small top-level members, or None), and the record's protocol,
model and stream flag. The relay names no feature: what a stage needs from
it is on the exchange.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from gateway.proxy.exchange import Exchange

__all__ = ["Next", "Stage", "chain"]

#: The rest of the request's way, as seen from one stage.
Next = Callable[[Exchange], Awaitable[None]]


class Stage(Protocol):
    """One optional feature on a request's way."""

    async def __call__(self, exchange: Exchange, call_next: Next) -> None: ...


def chain(stages: Sequence[Stage], last: Next) -> Next:
    """``stages`` wrapped around ``last``, the first listed outermost."""
    handler = last
    for stage in reversed(stages):
        handler = _bind(stage, handler)
    return handler


def _bind(stage: Stage, call_next: Next) -> Next:
    async def run(exchange: Exchange) -> None:
        await stage(exchange, call_next)

    return run
