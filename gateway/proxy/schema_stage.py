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
  ``schema_mismatch``, so that the SDKs raise at that event;
- ``hold``: as ``end``, and the answer is held (``Exchange.hold_gate``: its head
  and events wait) until it finished valid, within ``schema_hold_max_bytes``
  and ``schema_hold_seconds`` (past them: ``limit_exceeded``). An answer that
  breaks its schema while held is never sent: the relay retries it on the next
  upstream (attempt result ``schema_mismatch``), and the client gets that
  answer, or only the error when none is left. Each hold's end is on the
  record (``schema_holds``: ``released``, ``retried``, ``failed``,
  ``over_bytes``, ``over_time``).

A request without a schema pays one substring search of its body; a request
with the header ``x-gateway-schema-check: off`` is not checked.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from gateway.guard import WholeEvents
from gateway.protocols.structured import Structured
from gateway.proxy.exchange import Exchange
from gateway.proxy.stages import Next
from gateway.schema import Bounds, StreamCheck
from gateway.schema.reader import Reader

__all__ = ["OFF_HEADER", "SchemaStage", "reader_for", "turned_off"]

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
        hold = None
        if route.schema_check == "hold" and reader.judges():
            hold = _Hold(reader, route.schema_hold_max_bytes, route.schema_hold_seconds)
            exchange.hold_gate = hold
        exchange.events.add(reader)
        exchange.trailer_words.append(reader.words)
        try:
            await call_next(exchange)
        finally:
            exchange.events.remove(reader)
            record = exchange.record
            record.schema = reader.verdicts()
            if hold is not None:
                exchange.hold_gate = None
                record.schema_holds = hold.ended(
                    record.verdict is not None and record.verdict.complete
                )


def _turned_off(exchange: Exchange) -> bool:
    return turned_off(exchange.scope.get("headers", ()))


def turned_off(headers: Any) -> bool:
    """Whether a request's raw headers turn the check off for itself."""
    return any(name == OFF_HEADER and value.strip().lower() == b"off" for name, value in headers)


async def _reader(exchange: Exchange, structured: Structured, most: int) -> Reader | None:
    body = exchange.body
    if len(body) > MAX_BODY_BYTES:
        return Reader.unchecked(f"the request body is over {MAX_BODY_BYTES} bytes")
    try:
        document: Any = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        words = str(exc).lower()
        if "depth" in words or "recursion" in words:  # nested past the parser: too deep
            return Reader.unchecked("the request's schema is nested too deeply to read")
        return None  # not JSON: no schema asked for
    if not isinstance(document, dict):
        return None
    return await reader_for(
        document, structured, exchange.route.config.schema_check, most, exchange.events
    )


async def reader_for(
    document: dict[str, Any],
    structured: Structured,
    mode: str,
    most: int,
    whole: WholeEvents | None = None,
) -> Reader | None:
    """The reader of one request's answer (``document``: its JSON body, or a WebSocket
    ``response.create``) on a route whose ``schema_check`` is ``mode``; None when the
    request asks for no schema. The validator's compile runs in a thread, once per
    distinct schema."""
    schemas = structured.schemas(document)
    if not schemas:
        return None
    check = StreamCheck(schemas, Bounds(max_answer_bytes=most))
    if not check.prepare(cached_only=True):  # a schema seen before costs no thread
        await asyncio.to_thread(check.prepare)
    return Reader(check, structured.parts, ends=mode != "record", whole=whole)


class _Hold:
    """The hold of a route with ``schema_check = "hold"`` (a ``HoldGate``): an answer
    goes out once it finished valid; what each hold came to is kept for the record."""

    __slots__ = ("_holding", "_reader", "_results", "max_bytes", "seconds")

    def __init__(self, reader: Reader, max_bytes: int, seconds: float) -> None:
        self._reader = reader
        self.max_bytes = max_bytes
        self.seconds = seconds
        self._results: list[str] = []
        self._holding = False  # an answer is held and its end is not yet known

    def restart(self) -> None:
        if self._holding and self._reader.faulted:
            self._results.append("retried")  # asked again: the relay retries only then
        self._holding = True
        self._reader.restart()

    def settled(self) -> bool:
        if not self._reader.ended:
            return False
        self._results.append("released")
        self._holding = False
        return True

    def gave_up(self, why: str) -> str:
        self._results.append(f"over_{why}")
        self._holding = False
        if why == "bytes":
            return (
                f"the schema hold's bound: over {self.max_bytes} bytes before the answer validated"
            )
        return f"the schema hold's bound: {self.seconds:g} s before the answer validated"

    def ended(self, complete: bool) -> list[str]:
        """What each hold came to, the last one's end told by the stream's verdict."""
        if self._holding:
            if self._reader.faulted:
                self._results.append("failed")
            elif complete:  # it ended whole within the hold: released with its end
                self._results.append("released")
        return self._results
