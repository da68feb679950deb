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
    sign, nanos = ("-", -nanos) if nanos < 0 else ("", nanos)
    dollars, rest = divmod(nanos, NANOS_PER_USD)
    return f"{sign}{dollars}.{rest:09d}"


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

    #: the same prices as integers (``_Fast``) where they are plain token prices of at
    #: most six decimals a million tokens (nearly every model): priced without Decimal
    fast: _Fast | None = None

    def cost(self, usage: Billable) -> int:
        """What ``usage`` costs at these prices, in nano-dollars (rounded once, half up):
        the table's own arithmetic (``ModelPrice.calc_price``), or the same sum in
        integer pico-dollars where the prices allow (equal to the nano-dollar)."""
        if not (usage.input or usage.output):
            return 0
        fast = self.fast
        if fast is not None:
            return fast.nanos(usage)
        total: Decimal = self.price.calc_price(usage.as_table_usage())["total_price"]
        return int((total * NANOS_PER_USD).quantize(_NANO, rounding=ROUND_HALF_UP))

    def bound(self, input_tokens: int, output_tokens: int) -> int:
        """The most ``input_tokens`` and ``output_tokens`` can cost, in nano-dollars."""
        return _ceil_div(input_tokens * self.input_pico, 1000) + _ceil_div(
            output_tokens * self.output_pico, 1000
        )


#: A token price in pico-dollars: the base one, and the tiers (start, price) where the
#: request's input tokens pass ``start`` (the price of every token then, as the table's).
_Tiered = tuple[int, tuple[tuple[int, int], ...]]
#: The price keys of the five counts a Billable has, and those whose count is always 0 in
#: it (another modality, another cache lifetime, a tool): priced at nothing here, as in
#: the table for a usage without them.
_KEYS = (
    "input_mtok",
    "cache_read_mtok",
    "cache_write_mtok",
    "output_mtok",
    "output_reasoning_mtok",
)


@dataclass(frozen=True, slots=True)
class _Fast:
    """A model's token prices in integer pico-dollars a token (None: not priced)."""

    input: _Tiered | None
    cache_read: _Tiered | None
    cache_write: _Tiered | None
    output: _Tiered | None
    reasoning: _Tiered | None

    def nanos(self, usage: Billable) -> int:
        total_in = usage.input
        # the leaves, as the table splits them: a count whose unit has no price stays in
        # its parent's (cached tokens priced as input when the cache has no price of its own)
        read = usage.cache_read if self.cache_read is not None else 0
        written = usage.cache_write if self.cache_write is not None else 0
        reasoning = usage.reasoning if self.reasoning is not None else 0
        pico = (
            _at(self.input, total_in, total_in - read - written)
            + _at(self.cache_read, total_in, read)
            + _at(self.cache_write, total_in, written)
            + _at(self.output, total_in, usage.output - reasoning)
            + _at(self.reasoning, total_in, reasoning)
        )
        return (pico + 500) // 1000  # half up, to the nano-dollar


def _at(price: _Tiered | None, total_input: int, count: int) -> int:
    if price is None or not count:
        return 0
    each, tiers = price
    for start, tier in reversed(tiers):
        if total_input > start:
            each = tier
            break
    return each * count


def _fast(price: Any) -> _Fast | None:
    """``price`` as integers, or None where it has a price this cannot keep exactly (a
    request price, more than six decimals) so that the table's arithmetic does."""
    from genai_prices.types import TieredPrices

    found: dict[str, _Tiered] = {}
    for key, value in vars(price).items():
        if value is None or key.startswith("_"):
            continue
        if not key.endswith("_mtok"):
            if key.startswith(("requests", "input_mchars")):
                return None  # charged whatever the tokens: the table's arithmetic
            continue
        if key not in _KEYS:
            continue
        if isinstance(value, TieredPrices):
            base = _exact_pico(value.base)
            tiers = tuple((tier.start, _exact_pico(tier.price)) for tier in value.tiers)
            if base is None or any(p is None for _, p in tiers):
                return None
            found[key] = (base, tuple((s, p) for s, p in tiers if p is not None))
        else:
            each = _exact_pico(value)
            if each is None:
                return None
            found[key] = (each, ())
    if "input_mtok" not in found or "output_mtok" not in found:
        return None
    return _Fast(*(found.get(key) for key in _KEYS))


def _exact_pico(per_mtok: Decimal) -> int | None:
    """USD a million tokens as pico-dollars a token, when that is a whole number."""
    pico = per_mtok * _PER_MTOK
    return int(pico) if pico == pico.to_integral_value() else None


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
    return Quote(model, table, price, input_pico, output_pico, _fast(price))
