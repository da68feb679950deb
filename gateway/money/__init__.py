"""Money, pure: what a model's tokens cost (``prices``: the pinned ``genai-prices``
table and the overrides) and what one answer was charged, with its evidence
(``charge``). Integer nano-dollars everywhere (1e-9 USD).

Below the limits (a money budget reserves by a ``Quote``) and the observers (a
record carries its ``Charge``); ``gateway.spend`` puts them on a request's way.
"""

from gateway.money.charge import Charge, Evidence
from gateway.money.prices import NANOS_PER_USD, Billable, Pricer, Quote, nanos_to_usd

__all__ = ["NANOS_PER_USD", "Billable", "Charge", "Evidence", "Pricer", "Quote", "nanos_to_usd"]
