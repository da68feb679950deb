"""What the relay asks of the spend feature, handed in by the app (``gateway.spend``).

The relay prices a named client's answers and keeps their receipts, but names no
module above it: ``app.py`` builds ``gateway.spend.Spend`` and the receipts stage
and hands them in as these two shapes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from gateway.money import Quote
from gateway.observe import RequestRecord
from gateway.policy.quota import Cost
from gateway.protocols import ProtocolSpec
from gateway.settings import RouteConfig

if TYPE_CHECKING:
    from gateway.proxy.exchange import Exchange

__all__ = ["Pricing", "Receipts"]


class Pricing(Protocol):
    """Prices a request: the quote its limits reserve money by, and its settled cost."""

    def quote(self, exchange: Exchange) -> Quote | None:
        """The dearest prices the request may be charged at (None: not priced)."""

    def price(self, exchange: Exchange, cost: Cost) -> Cost:
        """``cost`` with its money; the record's charge set."""

    def price_record(
        self,
        record: RequestRecord,
        spec: ProtocolSpec,
        config: RouteConfig,
        cost: Cost,
        team: str | None = None,
    ) -> Cost:
        """``price`` of a record that has no exchange (a WebSocket connection's)."""


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
