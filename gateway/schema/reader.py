"""The schema check's reader of a stream's whole events (a ``gateway.guard`` consumer).

Registered with a response's ``WholeEvents`` by the schema stage, it is
asked about each whole event before the relay sends it (``check``) and
feeds the event's parts to its ``StreamCheck``: the common event, a delta
of the answer's text alone, as its contract reads it (``delta_text``); any
other event through the protocol's spec (``parts``). A fault on a route that ends or holds
refuses the event (``schema_mismatch``). It only checks: it takes nothing.

Sans-IO, and compiled with the guard (setup.py): it runs on every event of
a checked stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from gateway.guard import Event, Reason, Refusal, WholeEvents
from gateway.schema.check import StreamCheck
from gateway.schema.parts import Part, Schemas
from gateway.schema.verdict import Kind, Result, SchemaVerdict, worst

__all__ = ["Reader"]

#: A protocol's reader of an event's parts (its spec's ``structured.parts``).
Parts = Callable[[Event, Any], list[Part]]


def _no_parts(event: Event, parsed: Any) -> list[Part]:
    return []


class Reader:
    """A reader of the stream's whole events that feeds their parts to the check."""

    #: It only checks: ``WholeEvents`` never hands it what it accepted.
    takes: ClassVar[bool] = False

    def __init__(
        self,
        check: StreamCheck,
        parts: Parts | None = None,
        *,
        ends: bool,
        whole: WholeEvents | None = None,
    ) -> None:
        self._check = check
        #: The stream's readers, whose ``parsed`` is the offered event's JSON value.
        self._whole = whole if whole is not None else WholeEvents()
        self._parts: Parts = parts if parts is not None else _no_parts
        self._ends = ends
        self._index = 0
        self._verdicts: list[SchemaVerdict] | None = None
        #: A part broke its schema (the stream ends there, or a held answer is retried).
        self.faulted = False

    @classmethod
    def unchecked(cls, reason: str) -> Reader:
        """A reader of a request whose schemas cannot be read: its verdict is
        ``unchecked`` with ``reason``, whatever the answer."""
        reader = cls(StreamCheck(Schemas()), ends=False)
        reader._verdicts = [SchemaVerdict(Result.UNCHECKED, Kind.ANSWER, detail=reason)]
        return reader

    def restart(self) -> None:
        """Another answer to the same request comes (a held answer's retry)."""
        self._check = self._check.fresh()
        self._index = 0
        self._verdicts = None
        self.faulted = False

    def judges(self) -> bool:
        """Whether the request's schemas can be judged at all (else: nothing to hold)."""
        return self._verdicts is None and self._check.judges()

    @property
    def ended(self) -> bool:
        """The answer finished, every part judged (and none broke its schema)."""
        return self._check.ended and not self.faulted

    def check(self, piece: bytes, event: Event) -> Refusal | None:
        # once per event of a checked stream: the common event first, the fewest steps
        whole = self._whole
        text = whole.delta_text()  # the contract's word, where it gives it
        if text is None:
            return self.judge(event, whole.parsed)
        index = self._index
        self._index = index + 1
        if self._verdicts is None:
            fault = self._check.text(text, index)
            if fault is not None and self._ends:
                return self._refuse(fault)
        return None

    def judge(self, event: Event, parsed: Any) -> Refusal | None:
        """One event (``parsed``: its JSON value as its contract parsed it, or None): a
        refusal when it breaks the schema on a route that ends or holds, else None."""
        index = self._index
        self._index = index + 1
        parts = self._parts(event, parsed)
        if not parts or self._verdicts is not None:
            return None
        fault = self._check.feed(parts, index)
        if fault is not None and self._ends:
            return self._refuse(fault)
        return None

    def _refuse(self, fault: SchemaVerdict) -> Refusal:
        self.faulted = True
        return Refusal(
            Reason.SCHEMA_MISMATCH, f"{fault.kind} at {fault.pointer or '/'}: {fault.detail}"
        )

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
