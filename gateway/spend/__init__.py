"""What an answer cost on a request's way: the object the relay and the limits ask
(``Spend``, kept beside the relay that asks it: ``gateway.proxy.pricing``), over the
prices and charges of ``gateway.money``; the receipts and the report (``stage``,
``ledger``).

Money is integer nano-dollars everywhere (1e-9 USD): charges, reservations,
counters, receipts and the report add up exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.money.charge import Charge, Evidence
from gateway.money.prices import NANOS_PER_USD, Billable, Pricer, Quote, nanos_to_usd
from gateway.proxy.pricing import Spend
from gateway.settings import Settings

if TYPE_CHECKING:
    from gateway.spend.stage import SpendStage

__all__ = [
    "NANOS_PER_USD",
    "Billable",
    "Charge",
    "Evidence",
    "Pricer",
    "Quote",
    "Spend",
    "build_spend",
    "build_stage",
    "nanos_to_usd",
]


def build_stage(settings: Settings) -> SpendStage | None:
    """The receipts and report stage, when there are named clients (None: no one to
    show a receipt to). Its ledger is Redis's with ``limits_backend = "redis"``, else
    this process's."""
    if not settings.clients:
        return None
    from gateway.money.prices import table_version
    from gateway.spend.ledger import Ledger, MemoryLedger, RedisLedger
    from gateway.spend.stage import SpendStage

    ledger: Ledger
    target = settings.redis_target()
    if settings.limits_backend == "redis" and target is not None:
        ledger = RedisLedger(
            target,
            max(settings.limits_timeout, 0.5),
            settings.receipts_ttl_seconds,
            settings.spend_retention_days,
        )
    else:
        ledger = MemoryLedger(
            settings.receipts_ttl_seconds, settings.receipts_max, settings.spend_retention_days
        )
    admins = frozenset(c.name for c in settings.clients if c.spend_admin)
    teams = {c.name: c.team for c in settings.clients if c.team is not None}
    return SpendStage(ledger, admins, table_version(), teams=teams)


def build_spend(settings: Settings) -> Spend:
    """The spend the settings ask for: the table, the overrides, each client's team."""
    teams = {c.name: c.team for c in settings.clients if c.team is not None}
    return Spend(settings.prices, teams=teams)
