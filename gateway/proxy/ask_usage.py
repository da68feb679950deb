"""Asking the provider for a stream's usage (a stage).

On a route with ``inject_include_usage``, or for a client whose limits charge
what the provider reports, a streamed request whose protocol can ask for usage
(``ProtocolSpec.ask_for_usage``: OpenAI's ``stream_options.include_usage``)
goes upstream asking for it; the usage event the client did not ask for is
then withheld from it (``Exchange.withhold_usage``).
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.proxy.admission import body_weight
from gateway.proxy.exchange import Exchange
from gateway.proxy.rewrite import Rewriter
from gateway.proxy.stages import Next

__all__ = ["AskUsage"]


class AskUsage:
    """Rewrites a streamed request to ask for its usage."""

    def __init__(self, rewriter: Rewriter, charged: Callable[[str], bool]) -> None:
        self.rewriter = rewriter
        #: Whether a client's requests are charged what the provider reports.
        self.charged = charged

    async def __call__(self, exchange: Exchange, call_next: Next) -> None:
        record, request_json, route = exchange.record, exchange.request_json, exchange.route
        ask = exchange.spec.ask_for_usage
        if (
            record.stream
            and request_json is not None
            and (route.config.inject_include_usage or self.charged(record.client_name))
            and ask is not None
            and ask(request_json)
        ):
            changes = {"stream_options": request_json["stream_options"]}
            # The client's bytes are let go: only the rewritten ones are held (the body
            # counts body_weight times in the budget already; only growth beyond that).
            counted = body_weight(route) * len(exchange.body)
            if await self.rewriter.replace(exchange, changes, counted):
                exchange.withhold_usage = True
        await call_next(exchange)
