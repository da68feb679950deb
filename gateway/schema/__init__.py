"""Structured outputs: an answer and its tool calls judged against the schemas the
request asked for, as the deltas arrive (sans-IO, beside the guard).

``StreamCheck`` takes each event's structured parts (``Part``: read by the
protocol's spec from its own events) and gives the verdict (``SchemaVerdict``:
``valid``, ``invalid`` with a JSON Pointer and the event's index, ``refused``,
``unchecked`` with why) at the event that carries a fault, and at the end.
No I/O, no clock, no asyncio; bounded by ``Bounds``.
"""

from gateway.schema.bounds import Bounds, admit, safe_pattern
from gateway.schema.check import StreamCheck
from gateway.schema.parts import ANY_JSON, Part, PartKind, Schemas
from gateway.schema.verdict import Kind, Result, SchemaVerdict, worst

__all__ = [
    "ANY_JSON",
    "Bounds",
    "Kind",
    "Part",
    "PartKind",
    "Result",
    "SchemaVerdict",
    "Schemas",
    "StreamCheck",
    "admit",
    "safe_pattern",
    "worst",
]
