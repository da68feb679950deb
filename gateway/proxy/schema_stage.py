"""The schema stage: a structured answer and its tool calls checked as the stream goes.

On a route whose ``schema_check`` is not ``off``, a streamed request whose body
asks for a schema (its protocol's ``structured`` markers, then its reader:
``gateway.protocols.structured``) gets a ``StreamCheck`` (``gateway.schema``),
compiled in a thread before the request goes on (the validator's compile is
the slow part), and a reader of its whole events (``gateway.guard.whole``)
that feeds each event's parts to it:

- ``record``: the bytes are unchanged; the verdict goes in the trailer
  (``schema=...``), the access log, the span and
  ``gateway_schema_verdicts_total``;
- ``end``: the event that carries a fault is refused: withheld, and the
  stream ends there with the protocol's error event and the reason
  ``schema_mismatch``, so that the SDKs raise at that event.

A request without a schema pays one substring search of its body; a request
with the header ``x-gateway-schema-check: off`` is not checked.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from gateway.guard import Event, Reason, Refusal
from gateway.protocols.structured import Structured
from gateway.proxy.exchange import Exchange
from gateway.proxy.stages import Next
from gateway.schema import (
    Bounds,
    Kind,
    Part,
    Result,
    Schemas,
    SchemaVerdict,
    StreamCheck,
    worst,
)

__all__ = ["OFF_HEADER", "SchemaStage"]

#: A request sends ``x-gateway-schema-check: off`` to skip the check for itself.
OFF_HEADER = b"x-gateway-schema-check"
#: A body larger than this is not parsed on the loop for its schemas (unchecked).
MAX_BODY_BYTES = 4 * 1024 * 1024


class SchemaStage:
    """Checks structured answers and tool calls against the request's schemas."""

    async def __call__(self, exchange: Exchange, call_next: Next) -> None:
        route = exchange.route.config
        structured = exchange.spec.structured
        if (
            route.schema_check == "off"
            or structured is None
            # a plain answer is not checked; a body the relay could not read may stream
            or not (exchange.record.stream or exchange.request_json is None)
            or not any(marker in exchange.body for marker in structured.markers)
            or _turned_off(exchange)
        ):
            await call_next(exchange)
            return
        reader = await _reader(exchange, structured, route.schema_max_answer_bytes)
        if reader is None:
            await call_next(exchange)
            return
        exchange.events.add(reader)
        exchange.trailer_words.append(reader.words)
        try:
            await call_next(exchange)
        finally:
            exchange.events.remove(reader)
            exchange.record.schema = reader.verdicts()


def _turned_off(exchange: Exchange) -> bool:
    for name, value in exchange.scope.get("headers", ()):
        if name == OFF_HEADER and value.strip().lower() == b"off":
            return True
    return False


async def _reader(exchange: Exchange, structured: Structured, most: int) -> _Reader | None:
    body = exchange.body
    if len(body) > MAX_BODY_BYTES:
        return _Reader.unchecked(f"the request body is over {MAX_BODY_BYTES} bytes")
    try:
        document: Any = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        words = str(exc).lower()
        if "depth" in words or "recursion" in words:  # nested past the parser: too deep
            return _Reader.unchecked("the request's schema is nested too deeply to read")
        return None  # not JSON: no schema asked for
    if not isinstance(document, dict):
        return None
    schemas = structured.schemas(document)
    if not schemas:
        return None
    check = StreamCheck(schemas, Bounds(max_answer_bytes=most))
    if not check.prepare(cached_only=True):  # a schema seen before costs no thread
        await asyncio.to_thread(check.prepare)
    return _Reader(check, structured, ends=exchange.route.config.schema_check == "end")


def _no_parts(data: str) -> list[Part]:
    return []


class _Reader:
    """A reader of the stream's whole events that feeds their parts to the check."""

    __slots__ = ("_check", "_ends", "_index", "_parts", "_verdicts")

    def __init__(self, check: StreamCheck, structured: Structured | None, *, ends: bool) -> None:
        self._check = check
        self._parts = structured.parts if structured is not None else _no_parts
        self._ends = ends
        self._index = 0
        self._verdicts: list[SchemaVerdict] | None = None

    @classmethod
    def unchecked(cls, reason: str) -> _Reader:
        """A reader of a request whose schemas cannot be read: its verdict is
        ``unchecked`` with ``reason``, whatever the answer."""
        reader = cls(StreamCheck(Schemas()), None, ends=False)
        reader._verdicts = [SchemaVerdict(Result.UNCHECKED, Kind.ANSWER, detail=reason)]
        return reader

    def check(self, piece: bytes, event: Event) -> Refusal | None:
        index = self._index
        self._index = index + 1
        parts: list[Part] = self._parts(event.data)
        if not parts or self._verdicts is not None:
            return None
        fault = self._check.feed(parts, index)
        if fault is not None and self._ends:
            return Refusal(
                Reason.SCHEMA_MISMATCH, f"{fault.kind} at {fault.pointer or '/'}: {fault.detail}"
            )
        return None

    def take(self, piece: bytes, event: Event | None) -> None:
        pass

    def verdicts(self) -> list[SchemaVerdict]:
        """Each judged part's verdict (the stream's end: computed once); none when no
        event came (a plain answer, an error before the stream)."""
        if self._verdicts is None:
            self._verdicts = self._check.finish() if self._index else []
        return self._verdicts

    def words(self) -> str:
        """The trailer's words: the verdict that speaks for the stream ("" when no part of
        it was judged, e.g. a request that declared tools and got text)."""
        verdict = worst(self.verdicts())
        return verdict.trailer() if verdict is not None else ""
