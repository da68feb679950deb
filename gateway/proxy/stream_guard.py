"""Which answers are guarded streams, and the guard each one gets.

A 2xx answer in the protocol's framing (its media type; for a framing that is
also a bulk format, only when the request asked for a stream) is relayed
through a ``StreamGuard`` built from the route's options; any other answer is
relayed plain. A route that continues cut streams keeps the text sent so far
(what a continuation prefills) and withholds the upstream's own error event.
"""

from __future__ import annotations

import httpx

from gateway.guard import StreamGuard
from gateway.protocols import ContractOptions
from gateway.proxy.exchange import Exchange
from gateway.settings import GatewayLimits

__all__ = ["stream_guard"]


def stream_guard(
    exchange: Exchange, response: httpx.Response, limits: GatewayLimits
) -> StreamGuard | None:
    """A guard for a 2xx stream in the protocol's framing (its media type, and for a
    framing that is also a bulk format, a request that asked for a stream); None for
    any other answer (relayed plain)."""
    framing = exchange.spec.framing
    if not (
        200 <= response.status_code < 300
        and response.status_code not in (204, 205)
        and framing.is_stream(response.headers.get("content-type", ""))
        and exchange.scope["method"] != "HEAD"
        and (exchange.record.stream or not framing.announced_only)
    ):
        return None
    config = exchange.route.config
    options = ContractOptions(
        require_finish_reason=config.require_finish_reason,
        withhold_usage=exchange.withhold_usage,
        end_on_finish=config.termination == "finish",
    )
    contract = exchange.spec.new_contract(options)
    if config.continue_after_cut:
        contract.keep_text = True  # the text sent so far is what a continuation prefills
    guard = StreamGuard(
        contract,
        framing.new_decoder(limits.max_line_bytes, limits.max_event_bytes),
        max_stream_bytes=limits.max_response_bytes,
    )
    guard.withhold_errors = config.continue_after_cut
    guard.whole = exchange.events
    return guard
