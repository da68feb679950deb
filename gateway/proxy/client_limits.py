"""The named clients' limits and charges on a request's way (a stage).

For a request of a named client, around the rest of its way:

- when the client has limits: a reservation first (``gateway.limits``; a
  refusal is answered 429, or 503 with the backend down, and counted apart
  from the gateway's own rejections); under ``budget_enforcement = "strict"``
  the request's own output limit is lowered to what its budgets have left
  (``ProtocolSpec.capped_output``), so that the provider stops there (a body it
  cannot rewrite is refused, never sent uncapped). A request
  an earlier stage knows costs no tokens (``Exchange.free``: a whole cached
  answer will serve it) is counted as a request that reserves none, and reserved
  again as a miss if it goes upstream after all (``Exchange.not_free``);
- when its way ends, whatever happened: what it cost (``cost_of_record``,
  priced by ``gateway.spend``) into the record, and the reservation settled
  with it: last, after every stage inside this one (the cache's settle, the
  stream slot) is done. A request a stage inside refused (``record.rejected``)
  settles as not served.
"""

from __future__ import annotations

from gateway.limits import Limiter, LimitRefused, Reservation, Uncapped
from gateway.observe import Metrics
from gateway.policy.quota import NOTHING
from gateway.proxy.exchange import Exchange
from gateway.proxy.limited import cost_of_record, send_limited, with_headers
from gateway.proxy.pricing import Spend
from gateway.proxy.request_body import input_estimate, strict_input
from gateway.proxy.rewrite import Rewriter
from gateway.proxy.stages import Next
from gateway.settings import ANONYMOUS

__all__ = ["ClientLimits"]


class _Account:
    """One request's reservation, and the size of its body as it goes upstream."""

    __slots__ = ("reservation", "size")

    def __init__(self, reservation: Reservation | None, size: int) -> None:
        self.reservation = reservation
        self.size = size


class ClientLimits:
    """Reserves, caps, charges and settles a named client's requests."""

    def __init__(
        self, limiter: Limiter | None, spend: Spend, rewriter: Rewriter, metrics: Metrics
    ) -> None:
        self.limiter = limiter
        self.spend = spend
        self.rewriter = rewriter
        self.metrics = metrics

    async def __call__(self, exchange: Exchange, call_next: Next) -> None:
        record = exchange.record
        if record.client_name == ANONYMOUS:
            await call_next(exchange)
            return
        account = _Account(None, 0)
        limiter = self.limiter
        if limiter is not None and limiter.limited(record.client_name):
            account.reservation = await self._reserve(exchange, limiter, exchange.free)
            if account.reservation is None:
                return  # refused, and answered
            if exchange.free:

                async def again() -> bool:
                    return await self._again(exchange, limiter, account)

                exchange.not_free = again
        account.size = len(exchange.body)  # as it goes upstream (after every rewrite)
        try:
            await call_next(exchange)
        finally:
            # refused by the gateway itself (a late stream over the cap): not served
            served = record.rejected is None
            cost = NOTHING
            if served:
                # What a named client's request cost: its tokens metric, its limits.
                estimate = input_estimate(exchange.request_json, account.size)
                cost = self.spend.price(exchange, cost_of_record(record, estimate))
                record.charge = cost
            reservation = account.reservation
            if reservation is not None and limiter is not None:
                await limiter.settle(reservation, cost, served=served)
                record.budgets = reservation.left

    async def _again(self, exchange: Exchange, limiter: Limiter, account: _Account) -> bool:
        """A request reserved as free that goes upstream after all: reserved again as a
        miss (strict's bound and cap too); False when that is refused (answered)."""
        reservation = account.reservation
        if reservation is not None:
            account.reservation = None
            await limiter.settle(reservation, NOTHING, served=False)
        account.reservation = await self._reserve(exchange, limiter, False)
        account.size = len(exchange.body)
        return account.reservation is not None

    async def _reserve(
        self, exchange: Exchange, limiter: Limiter, free: bool
    ) -> Reservation | None:
        """The request's reservation (its headers and output cap applied), or None when
        its limits refused it (answered). ``free``: counted as a request that spends no
        tokens."""
        route, record, request_json = exchange.route, exchange.record, exchange.request_json
        size = len(exchange.body)
        strict = limiter.strict(record.client_name) and not free
        # The output the request allows itself, by its protocol's own fields.
        output = exchange.spec.requested_output(
            request_json, route.config.default_output_reservation
        )
        try:
            reservation = await limiter.reserve(
                record.client_name,
                route.name,
                record.model,
                0 if free else input_estimate(request_json, size),
                0 if free else output,
                record.stream,
                record.request_id,
                route.timeouts.total,
                strict_input(request_json, size) if strict else None,
                None if free else self.spend.quote(exchange),
            )
            if reservation.output_cap is not None and not free:  # a free one is not sent
                try:
                    await self._cap_output(exchange, reservation.output_cap)
                except LimitRefused:
                    await limiter.settle(reservation, NOTHING, served=False)
                    raise
        except LimitRefused as refused:
            await self._limited(exchange, refused)
            return None
        if reservation.headers:
            exchange.send = with_headers(exchange.send, reservation.headers)
        return reservation

    async def _cap_output(self, exchange: Exchange, cap: int) -> None:
        """``budget_enforcement = "strict"``: the request's own output limit lowered to the
        tokens its client has left, so that the provider stops there (``length``); a body
        too complex to rewrite is refused (``Uncapped``), never sent uncapped."""
        spec, request_json = exchange.spec, exchange.request_json
        if request_json is None and exchange.body and spec.output_limit:
            # not JSON to the gateway (too complex to parse within the body parser's
            # budget): its output limit cannot be read, nor capped
            raise Uncapped(cap)
        changes = spec.capped_output(request_json, cap)
        if changes and not await self.rewriter.replace(exchange, changes, len(exchange.body)):
            raise Uncapped(cap)

    async def _limited(self, exchange: Exchange, refused: LimitRefused) -> None:
        """Answer a request its client's limits refuse (429, or 503 with the backend down)."""
        record = exchange.record
        record.rejected = refused.rejected
        record.status = refused.status
        # Counted apart from gateway_rejected_requests_total: a team at its limit is no
        # sign of an overloaded gateway.
        self.metrics.limited(record.client_name, refused.label)
        record.bytes_out += await send_limited(
            exchange.send, str(exchange.spec.name), refused, record.request_id
        )
