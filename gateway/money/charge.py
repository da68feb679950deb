"""A charge: what one answer cost in money, priced from its verified usage, with its
evidence.

Pure: the usage (as the protocol reported it, read through its ``UsageBasis``)
and the settled token cost in, a ``Charge`` out. The evidence says how much the
gateway knows of what it charges:

- ``reported``: the provider reported the whole usage (every attempt of a rescued
  answer included: a continuation's usage is the sum of its attempts);
- ``partial``: part reported, part estimated (a cut Messages stream's input from
  its ``message_start`` and its output from what was relayed; a rescue whose
  attempts were not all reported);
- ``estimated``: nothing reported (a cut stream, an upstream that sends no
  usage): the input estimated from the request and the output from what
  reached the client, never $0 for an answer that produced output;
- ``unpriced``: neither the table nor an override prices the model (0, said so).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gateway.guard.verdict import Usage
from gateway.money.prices import Billable, Quote
from gateway.policy.quota import Cost, Source
from gateway.protocols._spec import UsageBasis

__all__ = ["Charge", "Evidence", "billable", "price_cost"]


class Evidence(enum.StrEnum):
    """How much of a charge was reported: the ``evidence`` label of the spend metric."""

    REPORTED = "reported"
    ESTIMATED = "estimated"
    PARTIAL = "partial"
    UNPRICED = "unpriced"


@dataclass(frozen=True, slots=True)
class Charge:
    """One request's money: ``nanos`` (1e-9 USD), the evidence, the prices' source
    (``table``: the table's version, or the override) and the usage priced."""

    nanos: int
    evidence: Evidence
    table: str
    model: str | None
    usage: Billable


#: A request that reached no upstream, or was answered from the cache: nothing.
FREE = Charge(0, Evidence.REPORTED, "", None, Billable())


def billable(usage: Usage, basis: UsageBasis, input_: int, output: int) -> Billable:
    """``usage`` in the table's terms; ``input_``/``output`` stand for a side the usage
    did not report (the settled cost's estimate)."""
    read = usage.cached_input_tokens or 0
    written = usage.cache_write_tokens or 0
    reasoning = usage.reasoning_tokens or 0
    total_in = input_ if usage.input_tokens is None else usage.input_tokens
    if usage.input_tokens is not None and not basis.input_includes_cached:
        total_in += read + written
    total_out = output if usage.output_tokens is None else usage.output_tokens
    if usage.output_tokens is not None and not basis.output_includes_reasoning:
        total_out += reasoning
    return Billable(total_in, total_out, min(read, total_in), min(written, total_in), reasoning)


def price_cost(
    cost: Cost,
    usage: Usage | None,
    whole: bool,
    billed: bool,
    basis: UsageBasis,
    quote: Quote | None,
    model: str | None,
) -> Charge:
    """The money of a settled ``cost``: at ``quote``'s prices (None: unpriced), from
    ``usage`` where the provider reported it (``whole``: every attempt's, nothing of
    it estimated), else from the cost's estimated tokens; ``billed``: the cost sums cut
    attempts, some reported and some estimated."""
    if cost.total == 0:
        return FREE
    if billed:
        tokens = Billable(cost.input, cost.output)
        evidence = Evidence.PARTIAL
    elif cost.source is Source.REPORTED and usage is not None:
        tokens = billable(usage, basis, cost.input, cost.output)
        complete = whole and usage.input_tokens is not None and usage.output_tokens is not None
        evidence = Evidence.REPORTED if complete else Evidence.PARTIAL
    else:
        tokens = Billable(cost.input, cost.output)
        evidence = Evidence.ESTIMATED
    if quote is None:
        return Charge(0, Evidence.UNPRICED, "", model, tokens)
    return Charge(quote.cost(tokens), evidence, quote.table, quote.model, tokens)
