"""Prices: what a model's tokens cost, from the pinned ``genai-prices`` table and the
configuration's overrides, in integer nano-dollars.

The table is the ``genai-prices`` package's own data (pydantic's, MIT: thousands of
models of dozens of providers with their price history, context tiers, cached-input
and reasoning prices), read from the installed package and never fetched at run
time: updating prices is upgrading the package (its version is every charge's
``table``). A ``[[prices]]`` override wins over it for a model (or ``"*"``) on an
upstream, a route or a client (the most specific one: client, then route, then
upstream, then any): a negotiated rate, a self-hosted model at a cost per token or
at zero, or the table's prices of another provider.

Money is integer nano-dollars (1e-9 USD) from here on: a charge is the table's own
``Decimal`` price rounded once, half up, to the nano-dollar (a millionth of a cent
is ten of them), so that sums of charges are exact wherever they are added. A
``Quote`` is found once per model, provider, route, upstream, client and UTC day
(kept, bounded); pricing a settled request is then the table's arithmetic on one
usage.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.settings import PriceOverride

__all__ = ["NANOS_PER_USD", "Billable", "Pricer", "Quote", "nanos_to_usd", "table_version"]

#: Nano-dollars in a dollar.
NANOS_PER_USD = 1_000_000_000
_PER_MTOK = Decimal(1_000_000)
_NANO = Decimal(1)
#: Cached quotes at most (model names are the clients' claims: bounded).
_MAX_QUOTES = 4096


def table_version() -> str:
    """The price table's version: the installed ``genai-prices`` package's."""
    import genai_prices

    return f"genai-prices {genai_prices.__version__}"


def nanos_to_usd(nanos: int) -> str:
    """``nanos`` as a decimal string of dollars, exact (``"0.000012345"``)."""
    return str((Decimal(nanos) / NANOS_PER_USD).quantize(Decimal("0.000000001")))


@dataclass(frozen=True, slots=True)
class Billable:
    """One answer's usage in the table's terms: ``input`` every input token (the cached
    ones read and written included), ``output`` every output token (reasoning
    included)."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    reasoning: int = 0

    def __add__(self, other: Billable) -> Billable:
        return Billable(
            self.input + other.input,
            self.output + other.output,
            self.cache_read + other.cache_read,
            self.cache_write + other.cache_write,
            self.reasoning + other.reasoning,
        )

    def as_table_usage(self) -> Any:
        from genai_prices import Usage

        values = {
            "input_tokens": self.input,
            "output_tokens": self.output,
            "cache_read_tokens": self.cache_read,
            "cache_write_tokens": self.cache_write,
            "output_reasoning_tokens": self.reasoning,
        }
        return Usage(**{key: value for key, value in values.items() if value})


@dataclass(frozen=True, slots=True)
class Quote:
    """A model's prices for one request: the table's (or an override's) ``ModelPrice``,
    where they come from, and the dearest input and output token in pico-dollars
    (1e-12 USD), which bound what a request can cost before it is answered."""

    model: str
    table: str
    price: Any  # genai_prices.types.ModelPrice
    input_pico: int
    output_pico: int

    def cost(self, usage: Billable) -> int:
        """What ``usage`` costs at these prices, in nano-dollars (rounded once, half up)."""
        if not (usage.input or usage.output):
            return 0
        total: Decimal = self.price.calc_price(usage.as_table_usage())["total_price"]
        return int((total * NANOS_PER_USD).quantize(_NANO, rounding=ROUND_HALF_UP))

    def bound(self, input_tokens: int, output_tokens: int) -> int:
        """The most ``input_tokens`` and ``output_tokens`` can cost, in nano-dollars."""
        return _ceil_div(input_tokens * self.input_pico, 1000) + _ceil_div(
            output_tokens * self.output_pico, 1000
        )


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _pico(per_mtok: Decimal) -> int:
    """USD a million tokens as pico-dollars a token, rounded up (a bound)."""
    return int((per_mtok * _PER_MTOK).to_integral_value(rounding=ROUND_CEILING))


def _dearest(price: Any) -> tuple[int, int]:
    """The dearest input and output token price of a ``ModelPrice`` (tiers included), in
    pico-dollars: input counts cached reads and writes, output counts reasoning."""
    from genai_prices.types import TieredPrices

    inputs: list[Decimal] = [Decimal(0)]
    outputs: list[Decimal] = [Decimal(0)]
    for key, value in vars(price).items():
        if not key.endswith("_mtok") or value is None:
            continue
        values = (
            [value.base, *(tier.price for tier in value.tiers)]
            if isinstance(value, TieredPrices)
            else [value]
        )
        (outputs if key.startswith("output") else inputs).extend(values)
    return _pico(max(inputs)), _pico(max(outputs))


class Pricer:
    """Quotes models at the table's prices and the configuration's overrides."""

    def __init__(self, overrides: Sequence[PriceOverride] = (), clock: Any = time.time) -> None:
        self.version = table_version()
        self._overrides = list(overrides)
        self._clock = clock
        self._quotes: dict[tuple[str, str | None, str, str, str, str, int], Quote | None] = {}

    def quote(
        self,
        model: str | None,
        provider: str | None,
        *,
        upstream: str = "",
        upstream_url: str = "",
        route: str = "",
        client: str = "",
    ) -> Quote | None:
        """The prices of ``model`` for a request of ``client`` on ``route`` to
        ``upstream`` (``provider``: the protocol's provider in the table); None when
        neither an override nor the table prices it."""
        if not model:
            return None
        day = int(self._clock()) // 86400
        key = (model, provider, upstream, upstream_url, route, client, day)
        try:
            return self._quotes[key]
        except KeyError:
            pass
        if len(self._quotes) >= _MAX_QUOTES:
            self._quotes.clear()
        found = self._quotes[key] = self._find(
            model, provider, upstream, upstream_url, route, client
        )
        return found

    def _override(self, model: str, upstream: str, route: str, client: str) -> PriceOverride | None:
        best: PriceOverride | None = None
        best_rank = -1
        for override in self._overrides:
            if override.model not in ("*", model):
                continue
            if override.client not in (None, client):
                continue
            if override.route not in (None, route):
                continue
            if override.upstream not in (None, upstream):
                continue
            rank = (
                (8 if override.client else 0)
                + (4 if override.route else 0)
                + (2 if override.upstream else 0)
                + (1 if override.model != "*" else 0)
            )
            if rank > best_rank:
                best, best_rank = override, rank
        return best

    def _find(
        self,
        model: str,
        provider: str | None,
        upstream: str,
        upstream_url: str,
        route: str,
        client: str,
    ) -> Quote | None:
        override = self._override(model, upstream, route, client)
        if override is not None and override.input is not None:
            from genai_prices.types import ModelPrice

            assert override.output is not None  # (the settings ask for both)
            price = ModelPrice(
                input_mtok=override.input,
                output_mtok=override.output,
                cache_read_mtok=override.cache_read,
                cache_write_mtok=override.cache_write,
                output_reasoning_mtok=override.reasoning,
            )
            return _quote(model, f"override {override.label}", price)
        if override is not None and override.provider is not None:
            provider, upstream_url = override.provider, ""
        return self._from_table(model, provider, upstream_url)

    def _from_table(self, model: str, provider: str | None, upstream_url: str) -> Quote | None:
        from datetime import UTC, datetime

        from genai_prices.data_snapshot import get_snapshot

        snapshot = get_snapshot()
        found = None
        if upstream_url:  # a provider's own host says whose prices they are
            try:
                found = snapshot.find_provider_model(model, None, None, upstream_url)
            except LookupError:
                found = None
        if found is None and provider is not None:
            try:
                found = snapshot.find_provider_model(model, None, provider, None)
            except LookupError:
                found = None
        if found is None:
            return None
        _, info = found
        price = info.get_prices(datetime.fromtimestamp(self._clock(), tz=UTC))
        return _quote(model, self.version, price)


def _quote(model: str, table: str, price: Any) -> Quote:
    input_pico, output_pico = _dearest(price)
    return Quote(model, table, price, input_pico, output_pico)
