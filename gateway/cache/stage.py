"""The response cache on a request's way: two stages (``gateway.proxy.stages``).

- ``lookup`` (before the limits): the request's key and controls
  (``ResponseCache.plan``; a ``DELETE`` of an entry is answered here), and
  whether a whole entry would answer it: then the request is ``free`` (the
  limits count it as a request that spends no tokens);
- ``serve`` (after the limits and the stream slot admitted it): a hit or a
  follower is answered from the store; otherwise the request goes on to its
  upstream, leading (its answer recorded) or bypassing the cache, and its entry
  is settled when it ends. A request counted free whose entry expired meanwhile
  is first reserved again as what it is (``Exchange.not_free``).

The two share each request's ``Plan``, kept here between them.
"""

from __future__ import annotations

from gateway.cache.cache import Plan, ResponseCache
from gateway.proxy.exchange import Exchange
from gateway.proxy.stages import Next

__all__ = ["CacheStages"]


class CacheStages:
    """The cache's two places on a request's way."""

    def __init__(self, cache: ResponseCache) -> None:
        self.cache = cache
        self._plans: dict[Exchange, Plan] = {}

    async def lookup(self, exchange: Exchange, call_next: Next) -> None:
        if not exchange.route.config.cache:
            await call_next(exchange)
            return
        cache = self.cache
        plan = await cache.plan(exchange, exchange.rest, exchange.request_json)
        if plan.answered:
            return
        exchange.free = await cache.peek(plan)
        self._plans[exchange] = plan
        try:
            await call_next(exchange)
        finally:
            self._plans.pop(exchange, None)

    async def serve(self, exchange: Exchange, call_next: Next) -> None:
        plan = self._plans.get(exchange)
        if plan is None:
            await call_next(exchange)
            return
        try:
            if not await self.cache.serve(exchange, plan):
                if exchange.free:  # the whole entry it was counted free for is gone
                    exchange.free = False
                    again = exchange.not_free
                    if again is not None and not await again():
                        return
                await call_next(exchange)
        finally:
            await self.cache.settle(exchange, plan)
