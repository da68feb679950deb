"""Rewriting an admitted request body, within the buffered-body budget.

A stage or the relay that changes a few top-level members of the body (usage
injection, the strict output cap, an upstream's ``models`` map: ``for_endpoint``) gets the new
bytes from the body parser (``BodyParser.rewrite``, off the loop for a large
body) and counts the copy it holds in the admission's buffered-body budget
until the request ends (never refused there: the request is admitted
already).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.proxy.admission import Admission
from gateway.proxy.exchange import Exchange
from gateway.proxy.request_body import BodyParser

__all__ = ["Rewriter"]


class Rewriter:
    """Rewrites request bodies and counts the copies held."""

    __slots__ = ("admission", "bodies")

    def __init__(self, bodies: BodyParser, admission: Admission) -> None:
        self.bodies = bodies
        self.admission = admission

    async def rewrite(self, body: bytes, changes: dict[str, Any]) -> bytes | None:
        """``body`` with ``changes`` (None: it could not be rewritten)."""
        return await self.bodies.rewrite(body, changes)

    async def replace(self, exchange: Exchange, changes: dict[str, Any], counted: int) -> bool:
        """The exchange's body with ``changes``, in its place; ``counted``: bytes of it
        the budget holds already. False when it could not be rewritten."""
        rewritten = await self.bodies.rewrite(exchange.body, changes)
        if rewritten is None:
            return False
        self.hold(exchange, len(rewritten) - counted)
        exchange.body = rewritten
        return True

    async def for_endpoint(
        self,
        exchange: Exchange,
        models: Mapping[str, str],
        body: bytes,
        request_json: dict[str, Any] | None,
    ) -> bytes:
        """The body for an upstream with the ``models`` map: with its name for the
        client's model when the map has one (or a ``"*"`` entry); otherwise ``body`` as it
        is, byte for byte."""
        if not models or request_json is None:
            return body
        model = request_json.get("model")
        mapped = models.get(model, models.get("*")) if isinstance(model, str) else None
        if mapped is None:
            return body
        rewritten = await self.bodies.rewrite(body, {"model": mapped})
        if rewritten is None:
            return body
        # Beside the body the other upstreams get, which counts twice in the budget already.
        self.hold(exchange, len(rewritten) - len(body))
        return rewritten

    def hold(self, exchange: Exchange, size: int) -> None:
        """``size`` more bytes of the request's body are held (a rewritten copy)."""
        if size > 0:
            self.admission.charge(size)
            exchange.held_copies += size
