"""StreamCheck: one stream's answer and tool calls judged against what the request asked.

Fed the parts of each event in order (``feed(parts, index)``), it runs one
``Incremental`` for the answer's text and one per open tool call, and
returns the fault at the event that carries it; ``finish`` judges what only
the end can show (each part whole, then the end check) and gives the
verdicts, one per judged part. A part already ``invalid`` is not judged
again; a schema out of bounds gives ``unchecked`` with its reason at once
and costs nothing more. A call to a tool the request never declared is
``invalid``. Sans-IO: no clock, no I/O.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.schema.bounds import Bounds, admit
from gateway.schema.final import EndCheck, Unusable, cached, end_check
from gateway.schema.incremental import Fault, Incremental
from gateway.schema.parts import Part, PartKind, Schemas
from gateway.schema.verdict import Kind, Result, SchemaVerdict, worst

__all__ = ["StreamCheck"]


class _Doc:
    """One judged document (the answer, or one call's arguments)."""

    __slots__ = ("done", "end", "incremental", "kind", "schema", "tool", "verdict")

    def __init__(
        self, kind: Kind, tool: str, schema: Any, bounds: Bounds, end: EndCheck | str | None
    ) -> None:
        self.kind = kind
        self.tool = tool
        self.schema = schema
        self.end = end
        self.verdict: SchemaVerdict | None = None
        self.done = False
        self.incremental: Incremental | None = None
        reason = end if isinstance(end, str) else admit(schema, bounds) if end is None else None
        if reason is not None:
            self.verdict = SchemaVerdict(Result.UNCHECKED, kind, detail=reason, tool=tool)
        else:
            self.incremental = Incremental(schema, bounds)

    def fail(self, pointer: str, event: int, detail: str) -> SchemaVerdict:
        self.verdict = SchemaVerdict(Result.INVALID, self.kind, pointer, event, detail, self.tool)
        self.incremental = None
        return self.verdict


class StreamCheck:
    """Judge one stream's structured parts."""

    def __init__(self, schemas: Schemas, bounds: Bounds | None = None) -> None:
        self.schemas = schemas
        self.bounds = bounds or Bounds()
        self._answer: _Doc | None = None
        self._calls: dict[str, _Doc] = {}
        self._closed: list[_Doc] = []
        self._refused = False
        self._last_event = -1
        #: The answer finished (its END part came): every part it opened is judged.
        self.ended = False
        #: Each schema's end check, compiled by ``prepare`` (by the schema's id).
        self._ends: dict[int, EndCheck | str] = {}

    def prepare(self, *, cached_only: bool = False) -> bool:
        """Judge each schema's bounds and compile its end check now (the validator's
        compile is slow: about 0.35 ms a schema node; a caller with a loop runs this in
        a thread, before the stream). ``cached_only``: only what is known already
        (cheap, on the loop); False when a compile is still needed."""
        schemas = [self.schemas.answer, *self.schemas.tools.values()]
        for schema in schemas:
            if schema is None or id(schema) in self._ends:
                continue
            reason = admit(schema, self.bounds)
            if reason is not None:
                self._ends[id(schema)] = reason
                continue
            if cached_only:
                known = cached(schema)
                if known is None:
                    return False
                self._ends[id(schema)] = known
                continue
            try:
                self._ends[id(schema)] = end_check(schema)
            except Unusable as exc:
                self._ends[id(schema)] = str(exc)
        return True

    def fresh(self) -> StreamCheck:
        """A check of another answer to the same request (a retry's): nothing judged yet,
        the compiled end checks shared."""
        check = StreamCheck(self.schemas, self.bounds)
        check._ends = self._ends
        return check

    def judges(self) -> bool:
        """Whether any schema can be judged (``prepare``d: one is in bounds and compiled)."""
        return any(not isinstance(end, str) for end in self._ends.values())

    def _doc(self, kind: Kind, tool: str, schema: Any) -> _Doc:
        return _Doc(kind, tool, schema, self.bounds, self._ends.get(id(schema)))

    def feed(self, parts: list[Part], index: int) -> SchemaVerdict | None:
        """The parts of event ``index``; the first ``invalid`` verdict they give, or None."""
        self._last_event = index
        if len(parts) == 1:
            part = parts[0]
            answer = self._answer
            if part.kind is _TEXT and answer is not None:  # the common event: text
                return _feed(answer, part.text, index)
            return self._part(part, index)
        fault: SchemaVerdict | None = None
        for part in parts:
            verdict = self._part(part, index)
            if verdict is not None and fault is None:
                fault = verdict
        return fault

    def text(self, text: str, index: int) -> SchemaVerdict | None:
        """A delta of the answer's text, the only part of event ``index`` (the common
        event, the fast way): the ``invalid`` verdict it gives, or None."""
        self._last_event = index
        answer = self._answer
        if answer is None:
            return self._part(Part(_TEXT, "", text), index) if text else None
        incremental = answer.incremental  # None once judged whole, or failed
        if incremental is not None and text:
            try:
                incremental.feed(text)
            except Fault as fault:
                return answer.fail(fault.pointer, index, fault.detail)
        return None

    def _part(self, part: Part, index: int) -> SchemaVerdict | None:
        kind = part.kind
        if kind is PartKind.TEXT:
            if self.schemas.answer is None or not part.text:
                return None
            if self._answer is None:
                self._answer = self._doc(Kind.ANSWER, "", self.schemas.answer)
            return _feed(self._answer, part.text, index)
        if kind is PartKind.TOOL_ARGS:
            doc = self._calls.get(part.key)
            return None if doc is None else _feed(doc, part.text, index)
        if kind is PartKind.TOOL_NAME:
            return self._open(part.key, part.text, index)
        if kind is PartKind.TOOL_DONE:
            return self._close_calls(part.key, index)
        if kind is PartKind.REFUSAL:
            self._refused = True
            return None
        if kind is PartKind.END:
            self.ended = True
            fault = self._close_calls("", index)
            if self._answer is not None and not self._answer.done:
                answer_fault = _close(self._answer, index)
                fault = fault or answer_fault
            return fault
        return None  # pragma: no cover

    def _open(self, key: str, name: str, index: int) -> SchemaVerdict | None:
        if key in self._calls:
            return None
        schema = self.schemas.tools.get(name)
        if schema is None:
            doc = _Doc(Kind.TOOL, name, True, self.bounds, None)
            self._calls[key] = doc
            return doc.fail("", index, f"a call to {name!r}, a tool the request never declared")
        self._calls[key] = self._doc(Kind.TOOL, name, schema)
        return None

    def _close_calls(self, key: str, index: int) -> SchemaVerdict | None:
        fault: SchemaVerdict | None = None
        keys = [key] if key else list(self._calls)
        for name in keys:
            doc = self._calls.pop(name, None)
            if doc is None:
                continue
            self._closed.append(doc)
            if doc.incremental is not None and not doc.incremental.started:
                _feed(doc, "{}", index)  # no arguments: a call with an empty object
            verdict = _close(doc, index)
            fault = fault or verdict
        return fault

    def finish(self) -> list[SchemaVerdict]:
        """The verdict of each judged part (the stream ended: each must be whole)."""
        index = self._last_event
        docs = [*self._closed, *self._calls.values()]
        if self._answer is not None:
            docs.insert(0, self._answer)
        out: list[SchemaVerdict] = []
        for doc in docs:
            if not doc.done and doc.verdict is None:
                _close(doc, index)
            assert doc.verdict is not None
            out.append(doc.verdict)
        if self._refused and (
            self._answer is None
            or self._answer.verdict is None
            or self._answer.verdict.result is not Result.INVALID
        ):
            out = [v for v in out if v.kind is not Kind.ANSWER]
            out.insert(0, SchemaVerdict(Result.REFUSED, Kind.ANSWER))
        elif (
            self._answer is None
            and self.schemas.answer is not None
            and not self._calls
            and not self._closed
        ):
            out.append(SchemaVerdict(Result.INVALID, Kind.ANSWER, "", index, "no answer came"))
        return out

    def verdict(self) -> SchemaVerdict | None:
        """The one verdict that speaks for the stream (the worst of ``finish``)."""
        return worst(self.finish())


_TEXT = PartKind.TEXT


def _feed(doc: _Doc, text: str, index: int) -> SchemaVerdict | None:
    incremental = doc.incremental  # None once judged whole, or failed
    if incremental is None:
        return None
    try:
        incremental.feed(text)
    except Fault as fault:
        return doc.fail(fault.pointer, index, fault.detail)
    return None


def _close(doc: _Doc, index: int) -> SchemaVerdict | None:
    """The part is whole (or the stream ended): the end check, once."""
    if doc.done:
        return doc.verdict if doc.verdict and doc.verdict.result is Result.INVALID else None
    doc.done = True
    incremental = doc.incremental
    doc.incremental = None  # nothing more is fed
    if incremental is None:
        return doc.verdict if doc.verdict and doc.verdict.result is Result.INVALID else None
    try:
        incremental.close()
    except Fault as fault:
        return doc.fail(fault.pointer, index, fault.detail)
    if incremental.too_deep:
        doc.verdict = _unchecked(doc, f"the answer nests over {incremental.bounds.max_depth} deep")
        return None
    if incremental.oversize:
        doc.verdict = _unchecked(
            doc, f"the part is over {incremental.bounds.max_answer_bytes} bytes"
        )
        return None
    return _end(doc, incremental, index)


def _end(doc: _Doc, incremental: Incremental, index: int) -> SchemaVerdict | None:
    try:
        document = orjson.loads("".join(incremental.text))
    except orjson.JSONDecodeError:  # the push parser took it: beyond orjson's bounds
        doc.verdict = _unchecked(doc, "the end check cannot read the document")
        return None
    try:
        end = doc.end if isinstance(doc.end, EndCheck) else end_check(doc.schema)
        fault = end.check(document)
    except Unusable as exc:
        doc.verdict = _unchecked(doc, str(exc))
        return None
    if fault is not None:
        return doc.fail(fault[0], index, fault[1])
    doc.verdict = SchemaVerdict(Result.VALID, doc.kind, tool=doc.tool)
    return None


def _unchecked(doc: _Doc, reason: str) -> SchemaVerdict:
    return SchemaVerdict(Result.UNCHECKED, doc.kind, detail=reason, tool=doc.tool)
