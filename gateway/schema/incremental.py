"""The incremental check: one JSON document fed as text, judged as it arrives.

Fed each delta's decoded text (``feed``), it pushes the bytes through ijson's
push parser (its C backend, yajl2_c) and walks the parser's events beside a
stack of the schema nodes they fall under, so that a fault is found at the
delta that carries it:

- not JSON (prose before it, anything after it): ``invalid`` at once;
- a value of the wrong ``type``, a scalar outside its ``enum`` / ``const``, a
  number outside ``minimum`` / ``maximum`` / ``exclusive*``, a string outside
  ``minLength`` / ``maxLength`` / ``pattern``;
- a member ``additionalProperties: false`` forbids (``properties`` and
  ``patternProperties`` allow), more members than ``maxProperties``;
- array items against ``items`` / ``prefixItems``, more than ``maxItems``.

A keyword it does not know (``anyOf``, ``oneOf``, ``allOf``, ``not``,
``if``, ``required``, an object ``enum``, ...) is left to the end check
(``gateway.schema.final``), which judges the whole document with a
maintained validator; ``close`` says whether the document is whole.

Sans-IO, no clock. Memory: the parser's state plus one frame per open
container (at most ``Bounds.max_depth``, past which the answer is
``unchecked``); the text itself is kept only up to ``max_answer_bytes``,
for the end check.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import ijson

from gateway.schema.bounds import Bounds, only_ref, resolve

__all__ = ["Fault", "Incremental"]

Json = dict[str, Any]


class Fault(Exception):
    """The document broke its schema: where (JSON Pointer) and what failed."""

    def __init__(self, pointer: str, detail: str) -> None:
        super().__init__(detail)
        self.pointer = pointer
        self.detail = detail


class _Deep(Exception):
    """The document nests deeper than the bounds allow."""


_TYPES = {
    "string": (str,),
    "boolean": (bool,),
    "null": (type(None),),
    "object": (dict,),
    "array": (list,),
}

_PATTERNS: dict[str, re.Pattern[str]] = {}


def _pattern(text: str) -> re.Pattern[str]:
    compiled = _PATTERNS.get(text)
    if compiled is None:
        if len(_PATTERNS) > 256:
            _PATTERNS.clear()
        compiled = _PATTERNS[text] = re.compile(text)
    return compiled


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


class _Frame:
    """One open object or array: its schema (None: not checked), where it is, what it
    has seen."""

    __slots__ = ("child", "count", "is_object", "key", "pointer", "schema")

    def __init__(self, schema: Json | None, pointer: str, is_object: bool) -> None:
        self.schema = schema
        self.pointer = pointer
        self.is_object = is_object
        self.count = 0  # members or items so far
        self.key = ""  # an object's member being read
        #: The schema of that member's value (found once, at its key).
        self.child: Any = None


class Incremental:
    """Check one JSON document against ``schema`` as its text arrives."""

    def __init__(self, schema: Json | bool, bounds: Bounds) -> None:
        self.root: Json = schema if isinstance(schema, dict) else {}
        self._false = schema is False
        self.bounds = bounds
        self._most = bounds.max_answer_bytes
        self._events: Any = ijson.sendable_list()
        self._coro = ijson.basic_parse_coro(self._events, use_float=False)
        self._stack: list[_Frame] = []
        self._started = False
        self._ended = False
        self.text: list[str] = []
        self.size = 0  # bytes fed
        #: Past ``max_answer_bytes``: the text is no longer kept (the end check skips).
        self.oversize = False
        #: Past ``max_depth``: nothing under it is checked (the verdict is unchecked).
        self.too_deep = False

    @property
    def started(self) -> bool:
        return self._started

    def feed(self, text: str) -> None:
        """One delta of the document's text; raises ``Fault`` at the first fault."""
        # once per delta of a checked part: the fewest steps
        data = text.encode()
        size = self.size = self.size + len(data)
        if size <= self._most:
            self.text.append(text)
        elif not self.oversize:
            self.oversize = True
            self.text = []
        try:
            self._coro.send(data)
        except ijson.JSONError as exc:
            raise Fault(self._where(), f"not one JSON document: {_short(exc)}") from None
        if self._events:
            self._drain()

    def close(self) -> None:
        """The document's text ended: raises ``Fault`` when it is not whole."""
        try:
            self._coro.close()
        except ijson.JSONError as exc:
            raise Fault(self._where(), f"not one whole JSON document: {_short(exc)}") from None
        except ijson.IncompleteJSONError:  # pragma: no cover - a JSONError subclass
            raise
        self._drain()
        if not self._ended:
            raise Fault(self._where(), "the JSON document is not whole")

    def _where(self) -> str:
        if not self._stack:
            return ""
        top = self._stack[-1]
        if top.is_object and top.count:
            return f"{top.pointer}/{_escape(top.key)}"
        return top.pointer

    def _drain(self) -> None:
        # the common events inlined: a member's key, a scalar inside an open container
        events = self._events
        stack = self._stack
        try:
            for event, value in events:
                if event == "map_key":
                    frame = stack[-1]
                    frame.key = value
                    frame.count += 1
                    if frame.schema is not None:
                        self._member(frame, value)
                elif event in _SCALARS and stack:
                    self._scalar_fast(stack[-1], value)
                else:
                    self._event(event, value)
        finally:
            events.clear()

    def _event(self, event: str, value: Any) -> None:
        stack = self._stack
        if event == "end_map" or event == "end_array":
            stack.pop()
            if not stack:
                self._ended = True
            return
        schema, pointer = self._slot()
        if event == "start_map" or event == "start_array":
            if len(stack) >= self.bounds.max_depth:
                self.too_deep = True
                schema = None
            if schema is not None:
                kind = "object" if event == "start_map" else "array"
                wanted = schema.get("type")
                if wanted is not None and wanted != kind:
                    self._type(schema, pointer, kind, None)
            stack.append(_Frame(schema, pointer, event == "start_map"))
            return
        if schema is not None:
            self._scalar(schema, pointer, value)
        if not stack:
            self._ended = True

    def _scalar_fast(self, frame: _Frame, value: Any) -> None:
        """A scalar's event inside ``frame``, the common way: its schema found and
        judged, its pointer built only for a fault."""
        parent = frame.schema
        if frame.is_object:
            if parent is None:
                return
            sub = frame.child  # found at its key (``_member``)
        else:
            index = frame.count
            frame.count = index + 1
            if parent is None:
                return
            sub = self._item(parent, index, f"{frame.pointer}/{index}")
        schema = sub if type(sub) is dict and "$ref" not in sub else self._node(sub)
        if not schema:
            return
        try:
            self._scalar(schema, "", value)
        except Fault as fault:
            key = _escape(frame.key) if frame.is_object else str(frame.count - 1)
            raise Fault(f"{frame.pointer}/{key}", fault.detail) from None

    def _slot(self) -> tuple[Json | None, str]:
        """The schema and pointer of the value about to be read."""
        stack = self._stack
        if not stack:
            if self._started:  # pragma: no cover - the parser refuses a second value
                raise Fault("", "more than one JSON document")
            self._started = True
            if self._false:
                raise Fault("", "the schema allows nothing")
            return self._node(self.root), ""
        frame = stack[-1]
        schema = frame.schema
        if frame.is_object:
            pointer = f"{frame.pointer}/{_escape(frame.key)}"
            sub = None if schema is None else frame.child  # found at its key (``_member``)
            return self._node(sub), pointer
        index = frame.count
        frame.count += 1
        pointer = f"{frame.pointer}/{index}"
        if schema is None:
            return None, pointer
        return self._node(self._item(schema, index, pointer)), pointer

    def _node(self, schema: Any) -> Json | None:
        """A schema to check with (``$ref`` followed); None: nothing checked below."""
        hops = 0
        while isinstance(schema, dict) and "$ref" in schema:
            if not only_ref(schema):
                return None  # a ref beside other keywords: the end check's
            schema = resolve(schema["$ref"], self.root)
            hops += 1
            if hops > self.bounds.max_refs:
                return None
        if isinstance(schema, dict) and schema:
            return schema
        return None

    def _member(self, frame: _Frame, key: str) -> None:
        schema = frame.schema
        assert schema is not None
        most = schema.get("maxProperties")
        if isinstance(most, int) and frame.count > most:
            raise Fault(frame.pointer, f"more than {most} members")
        child = frame.child = self._child_of_object(schema, key)
        if child is False:
            raise Fault(f"{frame.pointer}/{_escape(key)}", f"member {key!r} is not allowed")

    def _child_of_object(self, schema: Json, key: str) -> Any:
        properties = schema.get("properties")
        if isinstance(properties, dict) and key in properties:
            return properties[key]
        patterns = schema.get("patternProperties")
        if isinstance(patterns, dict):
            for pattern, sub in patterns.items():
                if _pattern(pattern).search(key):
                    return sub
        return schema.get("additionalProperties", True)

    def _item(self, schema: Json, index: int, pointer: str) -> Any:
        most = schema.get("maxItems")
        if isinstance(most, int) and index >= most:
            raise Fault(pointer, f"more than {most} items")
        prefix = schema.get("prefixItems")
        if isinstance(prefix, list) and index < len(prefix):
            return prefix[index]
        items = schema.get("items", True)
        if items is False:
            raise Fault(pointer, "no more items are allowed")
        if isinstance(items, list):  # draft-07 tuples: the end check's
            return None
        return items

    def _type(self, schema: Json, pointer: str, name: str, value: Any) -> None:
        wanted = schema.get("type")
        if wanted is None:
            return
        names = wanted if isinstance(wanted, list) else [wanted]
        for want in names:
            if want == name:
                return
            if name == "number" and want == "integer" and _integral(value):
                return
            if name == "integer" and want == "number":
                return
        raise Fault(pointer, f"{name} where the schema wants {_names(names)}")

    def _scalar(self, schema: Json, pointer: str, value: Any) -> None:
        name = _NAMES.get(type(value), "number")
        wanted = schema.get("type")
        if wanted is not None and wanted != name:
            self._type(schema, pointer, name, value)
        if "enum" in schema or "const" in schema:
            self._enum(schema, pointer, value)
        if name == "string":
            if "maxLength" in schema or "minLength" in schema or "pattern" in schema:
                self._string(schema, pointer, value)
        elif name != "boolean" and name != "null" and not _BOUNDED.isdisjoint(schema):
            self._number(schema, pointer, value)

    def _enum(self, schema: Json, pointer: str, value: Any) -> None:
        options = schema.get("enum")
        if isinstance(options, list) and not any(_same(value, o) for o in options):
            raise Fault(pointer, "a value outside the enum")
        if "const" in schema and not _same(value, schema["const"]):
            raise Fault(pointer, "a value other than the const")

    def _string(self, schema: Json, pointer: str, value: str) -> None:
        least = schema.get("minLength")
        if isinstance(least, int) and len(value) < least:
            raise Fault(pointer, f"a string shorter than {least}")
        most = schema.get("maxLength")
        if isinstance(most, int) and len(value) > most:
            raise Fault(pointer, f"a string longer than {most}")
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and not _pattern(pattern).search(value):
            raise Fault(pointer, "a string that does not match the pattern")

    def _number(self, schema: Json, pointer: str, value: Any) -> None:
        for key, bad, words in _NUMERIC:
            limit = schema.get(key)
            if limit is None or not isinstance(limit, (int, float)) or isinstance(limit, bool):
                continue
            if type(value) is int and type(limit) is int:  # exact as they are: no Decimals
                failed = bad(value, limit)
            else:
                failed = bad(Decimal(value), Decimal(str(limit)))
            if failed:
                raise Fault(pointer, f"a number {words} {limit}")


#: (keyword, the test a value fails it by, words): ``operator`` compares two Decimals.
_NUMERIC: tuple[tuple[str, Callable[[Any, Any], bool], str], ...] = (
    ("minimum", operator.lt, "below"),
    ("maximum", operator.gt, "above"),
    ("exclusiveMinimum", operator.le, "at or below"),
    ("exclusiveMaximum", operator.ge, "at or above"),
)


#: ijson's scalar events (each a value of its own).
_SCALARS = frozenset(("string", "number", "boolean", "null"))
#: A scalar's JSON type by its Python type (ijson: int, Decimal, str, bool, None).
_NAMES: dict[type, str] = {
    bool: "boolean",
    type(None): "null",
    str: "string",
    int: "integer",
    Decimal: "number",
}
_BOUNDED = frozenset(key for key, _, _ in _NUMERIC)


def _integral(value: Any) -> bool:
    return isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value()


def _same(value: Any, option: Any) -> bool:
    """JSON equality of a scalar and an enum member (1 == 1.0; True is not 1)."""
    if isinstance(value, bool) or isinstance(option, bool):
        return isinstance(value, bool) and isinstance(option, bool) and value is option
    if isinstance(value, (int, Decimal)) and isinstance(option, (int, float)):
        try:
            return Decimal(value) == Decimal(str(option))
        except ArithmeticError:  # pragma: no cover
            return False
    if isinstance(option, (dict, list)):
        return False
    return bool(value == option) and type(value) is type(option)


def _names(names: list[Any]) -> str:
    return " or ".join(str(n) for n in names)


def _short(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:120]
