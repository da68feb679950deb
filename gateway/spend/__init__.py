"""What an answer cost: prices from the pinned table and the overrides (``prices``), a
charge with its evidence (``charge``), and the object the request's way asks
(``service``).

Money is integer nano-dollars everywhere (1e-9 USD): charges, reservations,
counters, receipts and the report add up exactly.
"""

from __future__ import annotations

from gateway.settings import Settings
from gateway.spend.charge import Charge, Evidence
from gateway.spend.prices import NANOS_PER_USD, Billable, Pricer, Quote, nanos_to_usd
from gateway.spend.service import Spend

__all__ = [
    "NANOS_PER_USD",
    "Billable",
    "Charge",
    "Evidence",
    "Pricer",
    "Quote",
    "Spend",
    "build_spend",
    "nanos_to_usd",
]


def build_spend(settings: Settings) -> Spend:
    """The spend the settings ask for: the table, the overrides, each client's team."""
    teams = {c.name: c.team for c in settings.clients if c.team is not None}
    return Spend(settings.prices, teams=teams)
