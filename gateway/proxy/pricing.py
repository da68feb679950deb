"""Spend: the one object the request's way asks what a request may cost and what it
cost, and that counts what it cost; and the receipts it is handed (``Receipts``).

``quote`` finds the prices a request will be charged at before it is sent (its
route's upstream when the route has one, else the route's), so that the limits
can reserve money; ``price`` turns a settled token ``Cost`` into a ``Charge``
(``gateway.money.charge``) and puts it on the cost, the record and the
``gateway_spend_usd_total`` counter. ``gateway.spend`` builds it, with the receipts
and the report; the receipts stage stands above the relay, which names no module
above it: ``app.py`` hands the stage in as a ``Receipts``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from gateway.money.charge import FREE, Charge, Evidence, billable, price_cost
from gateway.money.prices import Billable, Pricer, Quote
from gateway.policy.quota import Cost

if TYPE_CHECKING:
    from gateway.observe.record import Part, RequestRecord
    from gateway.protocols import ProtocolSpec
    from gateway.proxy.exchange import Exchange
    from gateway.settings import PriceOverride, RouteConfig, UpstreamConfig

__all__ = ["Receipts", "Spend"]


class Receipts(Protocol):
    """Keeps a finished request's receipt for its owner."""

    def keep(
        self,
        record: RequestRecord,
        owner: str,
        team: str | None = None,
        aliases: tuple[str, ...] = (),
        counted: bool = True,
    ) -> None:
        """Write ``record``'s receipt for ``owner`` (under its request id and ``aliases``)."""


class Spend:
    """Prices requests for the limits and the bill."""

    def __init__(
        self,
        overrides: Sequence[PriceOverride] = (),
        on_charge: Callable[[RequestRecord, Charge], None] | None = None,
        pricer: Pricer | None = None,
        teams: Mapping[str, str] | None = None,
    ) -> None:
        self.pricer = pricer if pricer is not None else Pricer(overrides)
        self._on_charge = on_charge
        #: client -> its team
        self._teams = dict(teams or {})
        #: route name -> its upstreams by name
        self._routes: dict[str, dict[str, UpstreamConfig]] = {}

    def _upstreams(self, config: RouteConfig) -> dict[str, UpstreamConfig]:
        found = self._routes.get(config.name)
        if found is None:
            found = self._routes[config.name] = {u.name: u for u in config.pool()}
        return found

    @property
    def version(self) -> str:
        return self.pricer.version

    def quote(self, exchange: Exchange) -> Quote | None:
        """The prices of the request's model before an upstream is chosen: its route's
        one upstream's, or the route's when it has several."""
        record, config = exchange.record, exchange.route.config
        upstreams = self._upstreams(config)
        upstream = next(iter(upstreams.values())) if len(upstreams) == 1 else None
        model = record.model
        if upstream is not None and model is not None:
            model = upstream.models.get(model, model)
        name, url = (upstream.name, upstream.url) if upstream is not None else ("", "")
        return self._quote(record, exchange.spec, config, model, name, url)

    def _quote(
        self,
        record: RequestRecord,
        spec: ProtocolSpec,
        config: RouteConfig,
        model: str | None,
        upstream: str,
        url: str,
    ) -> Quote | None:
        """The prices ``model`` is charged at by ``upstream`` (at ``url``) of the route,
        for the record's client."""
        return self.pricer.quote(
            model,
            spec.price_provider,
            upstream=upstream,
            upstream_url=url,
            route=config.name,
            client=record.client_name,
        )

    def price(self, exchange: Exchange, cost: Cost) -> Cost:
        """``cost`` with its money, the record's ``spend`` set and counted."""
        return self.price_record(
            exchange.record, exchange.spec, exchange.route.config, cost, exchange.caller.team
        )

    def price_record(
        self,
        record: RequestRecord,
        spec: ProtocolSpec,
        config: RouteConfig,
        cost: Cost,
        team: str | None = None,
    ) -> Cost:
        """``price`` of a record (a WebSocket connection's response has no exchange)."""
        if cost.total == 0:
            charge = FREE
        else:
            model, name, url = _answered_by(record, self._upstreams(config))
            quote = self._quote(record, spec, config, model, name, url)
            verdict = record.verdict
            usage = record.usage if record.usage is not None else verdict.usage if verdict else None
            charge = price_cost(
                cost,
                usage,
                record.continued == 0,
                record.billed is not None,
                spec.usage_basis,
                quote,
                model,
            )
            if record.continued and record.parts:  # rescued: the sum of its attempts
                charge = self._parts(record, spec, config, charge)
        record.spend = charge
        # a configured client's team, else the one its issued key was created for
        record.team = self._teams.get(record.client_name) or team
        if self._on_charge is not None:
            self._on_charge(record, charge)
        return replace(cost, money=charge.nanos)

    def _parts(
        self, record: RequestRecord, spec: ProtocolSpec, config: RouteConfig, whole: Charge
    ) -> Charge:
        """A rescued answer's charge: each attempt's part priced at its own upstream's
        prices (``record.part_nanos``), the answer the sum of them; unpriced when a part
        is."""
        upstreams = self._upstreams(config)
        nanos: list[int | None] = []
        tokens = Billable()
        table = whole.table
        for part in record.parts:
            upstream = upstreams.get(part.upstream)
            url = upstream.url if upstream is not None else ""
            model = _part_model(part, record, upstream)
            quote = self._quote(record, spec, config, model, part.upstream, url)
            used = part.usage
            billed = billable(
                used, spec.usage_basis, used.input_tokens or 0, used.output_tokens or 0
            )
            tokens += billed
            if quote is None:
                nanos.append(None)
                continue
            table = table or quote.table
            nanos.append(quote.cost(billed))
        record.part_nanos = nanos
        if None in nanos:
            evidence = Evidence.UNPRICED
        elif whole.evidence is Evidence.UNPRICED:  # the last upstream's model alone
            evidence = Evidence.PARTIAL
        else:
            evidence = whole.evidence
        total = sum(n for n in nanos if n is not None)
        return Charge(total, evidence, table, whole.model, tokens)


def _part_model(part: Part, record: RequestRecord, upstream: UpstreamConfig | None) -> str | None:
    if part.model is not None:
        return part.model
    if upstream is not None and record.model is not None:
        return upstream.models.get(record.model, record.model)
    return record.model


def _answered_by(
    record: RequestRecord, upstreams: Mapping[str, UpstreamConfig]
) -> tuple[str | None, str, str]:
    """The model that answered (as the answer named it, else as it was asked of the
    upstream), and that upstream's name and URL."""
    upstream = upstreams.get(record.upstream) if record.upstream is not None else None
    if upstream is None:
        return record.upstream_model or record.model, record.upstream or "", ""
    model = record.upstream_model or (
        upstream.models.get(record.model, record.model) if record.model else None
    )
    return model, upstream.name, upstream.url
