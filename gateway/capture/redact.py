"""Redaction of a captured stream: no text left, every byte offset kept.

Which rules apply is the protocol's (``ProtocolSpec.redaction``): SSE blocks
(``stream``), one JSON text per line (``lines``), or a framing of its own
that masks its events' JSON with ``json``.

The output has exactly the length of the input and its line ends in the same
places, so the original chunk boundaries still fall where they fell, and the
guard judges the redacted stream the way it judged the original. What stays
and what goes:

* SSE framing stays: field names, line ends, blank lines, a leading BOM,
  ``event:`` names that are bare identifiers and numeric ``retry:`` values.
  ``id:`` values and comment text become ``x``; a line that is no known field
  becomes ``x`` whole (the decoder ignores it either way).
* An event's data that is JSON keeps its structure: keys, numbers, booleans,
  nulls and punctuation. Every string value becomes a placeholder of the same
  byte length (``xxx0``, ``xxx1``: equal strings get equal placeholders, so
  ids that must match still match), except the protocol's own vocabulary: the
  value of a structural key (``type``, ``object``, ``role``, ``status``,
  ``reason`` and the finish/stop reasons) when it is a bare identifier
  (letters, ``_`` and ``.``), which is what the contracts judge by. A
  protocol's redaction may add its own keys (``Redactor.learn``).
* Tool-call arguments (``arguments``, ``partial_json`` and the Responses
  API's argument deltas) are JSON text inside a string, sent in pieces: they
  are masked by a small lexer that follows each call across its pieces, so
  every character inside their own strings becomes ``x`` and every non-zero
  digit ``1``, while their braces, quotes and literals stay: arguments that
  were valid JSON stay valid, invalid ones stay invalid (only a prefix of
  ``true``/``false``/``null`` that started the invalid part may show).
  Inside free-form objects (``args``, ``input``, ``metadata``) keys are
  content too and are masked like values, and so are the digits of numbers.
* Data that is not JSON is replaced whole, except the ``[DONE]`` terminator.
* Lines (``lines``: NDJSON): every line is one event's data, masked as
  above; line ends and blank lines stay.

Works on the bytes the upstream sent, so text cut mid-character or invalid
UTF-8 is handled like the guard handles it (as U+FFFD, never an error). The
cost is linear in the input, with a Python loop per line and per string.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from gateway.protocols import ANY_PATH, spec_for

__all__ = ["Redactor", "redact_stream"]

_BOM = b"\xef\xbb\xbf"
_LINE_END = re.compile(rb"\r\n|\r|\n")
_IDENTIFIER = re.compile(rb"[A-Za-z_][A-Za-z_.]{0,63}")
_DIGITS = re.compile(rb"[0-9]{1,10}")
_X = 0x78  # "x"

#: Keys whose bare-identifier values are protocol vocabulary, kept as they are.
STRUCTURAL_KEYS = frozenset(
    {
        "type",
        "object",
        "role",
        "status",
        "reason",
        "finish_reason",
        "stop_reason",
        "finishReason",
        "blockReason",
        "done_reason",  # Ollama
    }
)
#: Keys whose string values are JSON text sent in pieces (tool-call arguments).
ARGUMENT_KEYS = frozenset({"arguments", "partial_json"})
#: Members whose integer value tells which tool call a piece of arguments belongs to.
INDEX_KEYS = ("index", "output_index")
#: Responses API events whose ``delta`` string is a piece of tool-call arguments.
ARGUMENT_DELTA_EVENTS = frozenset({"response.function_call_arguments.delta"})
#: Objects whose keys are content (tool arguments as an object: Gemini's ``args``,
#: Ollama's ``arguments``; metadata).
FREEFORM_OBJECTS = frozenset({"args", "arguments", "input", "metadata"})

_ESCAPES = {
    ord('"'): '"',
    ord("\\"): "\\",
    ord("/"): "/",
    ord("b"): "\b",
    ord("f"): "\f",
    ord("n"): "\n",
    ord("r"): "\r",
    ord("t"): "\t",
}
_LITERALS = {"t": "true", "f": "false", "n": "null", "N": "NaN", "I": "Infinity"}


def redact_stream(data: bytes, protocol: str = ANY_PATH.name) -> bytes:
    """``data`` (an upstream's stream in ``protocol``) with every text replaced, same length."""
    return Redactor().redact(data, protocol)


@dataclass(slots=True)
class _Frame:
    """An open JSON object or array while scanning."""

    is_object: bool
    freeform: bool  # keys (and numbers) inside are content
    key: str | None = None  # the member being read (objects)
    expect_key: bool = True  # objects: the next string is a key
    position: int = 0  # arrays: the element being read


@dataclass(slots=True)
class _ArgumentsMask:
    """Masks the pieces of one tool call's JSON arguments, keeping them (in)valid."""

    in_string: bool = False
    escaped: bool = False
    in_number: bool = False
    literal: str | None = None
    matched: int = 0
    previous: str = ""
    broken: bool = False
    _out: bytearray = field(default_factory=bytearray)

    def feed(self, inner: bytes) -> bytes:
        """The masked form of one piece: the bytes between a JSON string's quotes."""
        out = self._out
        out.clear()
        i, n = 0, len(inner)
        while i < n:
            byte = inner[i]
            if byte == 0x5C and i + 1 < n:  # an escape of the outer string
                kind = inner[i + 1]
                if kind == 0x75:  # \uXXXX
                    unit = inner[i : i + 6]
                    try:
                        char = chr(int(unit[2:], 16))
                    except ValueError:
                        char = "\x00"
                else:
                    unit = inner[i : i + 2]
                    char = _ESCAPES.get(kind, "\x00")
            else:
                unit = inner[i : i + 1]
                char = chr(byte) if byte < 0x80 else "\x80"
            out += self._unit(unit, char)
            i += len(unit)
        return bytes(out)

    def _unit(self, unit: bytes, char: str) -> bytes:
        masked = b"x" * len(unit)
        if self.broken:
            return masked
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif char == "\\":
                self.escaped = True
            elif char == '"':
                self.in_string = False
                return unit
            return masked
        previous, self.previous = self.previous, char
        if char.isascii() and char.isalpha():
            if self.in_number and char in "eE":
                return unit
            if self.literal is None:
                starts = not self.in_number or (char == "I" and previous == "-")
                if starts and char in _LITERALS:
                    self.literal, self.matched, self.in_number = _LITERALS[char], 1, False
                    return unit
            elif self.matched < len(self.literal) and char == self.literal[self.matched]:
                self.matched += 1
                return unit
            self.broken = True  # not JSON from here on: keep it that way, show nothing
            return masked
        self.literal = None
        if "0" <= char <= "9":
            self.in_number = True
            digit = b"0" if char == "0" else b"1"
            return digit if len(unit) == 1 else b"\\u003" + digit
        if char in "-+.":
            self.in_number = True
            return unit
        self.in_number = False
        if char == '"':
            self.in_string = True
            return unit
        if char in " \t\r\n{}[],:":
            return unit
        self.broken = True
        return masked


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Redactor:
    """Redacts one stream; holds the placeholders and the per-call argument masks."""

    def __init__(self) -> None:
        self._placeholders: dict[bytes, bytes] = {}
        self._arguments: dict[tuple[object, ...], _ArgumentsMask] = {}
        self.structural_keys: frozenset[str] = STRUCTURAL_KEYS
        self.argument_keys: frozenset[str] = ARGUMENT_KEYS
        self.index_keys: tuple[str, ...] = INDEX_KEYS

    def learn(
        self,
        *,
        structural: frozenset[str] = frozenset(),
        arguments: frozenset[str] = frozenset(),
        indexes: tuple[str, ...] = (),
    ) -> None:
        """A protocol's own vocabulary on top of the common one (its spec's redaction
        says it): keys whose identifier values stay, keys whose strings are tool-call
        arguments in pieces, and members that index a tool call."""
        self.structural_keys = self.structural_keys | structural
        self.argument_keys = self.argument_keys | arguments
        self.index_keys = (*self.index_keys, *indexes)

    def redact(self, data: bytes, protocol: str) -> bytes:
        """``data`` redacted by the rules of its protocol (the registry's; SSE blocks for a
        name it does not know)."""
        try:
            redaction = spec_for(protocol).redaction
        except ValueError:
            return self.stream(data)
        return redaction(self)(data)

    # -- one JSON text per line (NDJSON) ---------------------------------------------

    def lines(self, data: bytes) -> bytes:
        out = bytearray(data)
        pos, size = 0, len(data)
        while pos < size:
            end = data.find(b"\n", pos)
            if end < 0:
                end = size  # a last line the stream never ended
            stop = end - 1 if end > pos and data[end - 1] == 0x0D else end
            if data[pos:stop].strip():
                self._block(data, out, [(pos, stop)])
            pos = end + 1
        return bytes(out)

    # -- SSE --------------------------------------------------------------------------

    def stream(self, data: bytes) -> bytes:
        out = bytearray(data)
        start = len(_BOM) if data.startswith(_BOM) else 0
        values: list[tuple[int, int]] = []  # the data-line values of the current block
        pos = start
        for match in _LINE_END.finditer(data, start):
            if match.start() == pos:
                self._block(data, out, values)
                values = []
            else:
                self._line(data, out, pos, match.start(), values)
            pos = match.end()
        if pos < len(data):  # a last line the stream never ended
            self._line(data, out, pos, len(data), values)
        self._block(data, out, values)
        return bytes(out)

    def _line(
        self, data: bytes, out: bytearray, start: int, end: int, values: list[tuple[int, int]]
    ) -> None:
        if data[start] == 0x3A:  # ":" a comment
            _fill(out, start + 1, end)
            return
        colon = data.find(b":", start, end)
        name = data[start:end] if colon < 0 else data[start:colon]
        value = end if colon < 0 else colon + 1
        if value < end and data[value] == 0x20:
            value += 1
        if name == b"data":
            values.append((value, end))
        elif name == b"event":
            if not _IDENTIFIER.fullmatch(data, value, end):
                _fill(out, value, end)
        elif name == b"retry":
            if not _DIGITS.fullmatch(data, value, end):
                _fill(out, value, end)
        elif name == b"id":
            _fill(out, value, end)
        else:
            _fill(out, start, end)

    def _block(self, data: bytes, out: bytearray, values: list[tuple[int, int]]) -> None:
        """One event's data lines, judged together as the guard joins them."""
        if not values:
            return
        raw = b"\n".join(data[s:e] for s, e in values)
        text = raw.decode("utf-8", "replace")
        if text.strip() == "[DONE]":
            return
        tree: object = None
        try:
            tree = json.loads(text)
        except RecursionError:
            pass  # nested deeper than json goes: keep the nesting, mask its strings
        except ValueError:
            for s, e in values:
                _fill(out, s, e)
            return
        masked = self.json(raw, tree)
        offset = 0
        for s, e in values:
            out[s:e] = masked[offset : offset + (e - s)]
            offset += e - s + 1

    # -- JSON -------------------------------------------------------------------------

    def json(self, raw: bytes, tree: object) -> bytes:
        """``raw`` (a JSON text, parsed as ``tree``) with its strings masked, same length."""
        out = bytearray(raw)
        frames: list[_Frame] = []
        top_type = tree.get("type") if isinstance(tree, dict) else None
        i, n = 0, len(raw)
        while i < n:
            byte = raw[i]
            if byte == 0x22:  # '"'
                end = _string_end(raw, i)
                frame = frames[-1] if frames else None
                if frame is not None and frame.is_object and frame.expect_key:
                    frame.key = json.loads(raw[i : end + 1].decode("utf-8", "replace"))
                    frame.expect_key = False
                    if frame.freeform:
                        self._placeholder(out, raw, i + 1, end)
                else:
                    self._value(out, raw, i + 1, end, frames, tree, top_type)
                i = end + 1
                continue
            if byte == 0x7B or byte == 0x5B:  # { [
                parent = frames[-1] if frames else None
                freeform = parent is not None and (
                    parent.freeform or (parent.is_object and parent.key in FREEFORM_OBJECTS)
                )
                frames.append(_Frame(is_object=byte == 0x7B, freeform=freeform))
            elif byte == 0x7D or byte == 0x5D:  # } ]
                if frames:
                    frames.pop()
            elif byte == 0x2C:  # ,
                if frames:
                    frame = frames[-1]
                    if frame.is_object:
                        frame.expect_key = True
                        frame.key = None
                    else:
                        frame.position += 1
            elif 0x31 <= byte <= 0x39 and frames and frames[-1].freeform:
                out[i] = 0x31  # a number inside free-form content: its digits go too
            i += 1
        return bytes(out)

    def _value(
        self,
        out: bytearray,
        raw: bytes,
        start: int,
        end: int,
        frames: list[_Frame],
        tree: object,
        top_type: object,
    ) -> None:
        frame = frames[-1] if frames else None
        key = frame.key if frame is not None and frame.is_object else None
        if frame is not None and frame.freeform:
            self._placeholder(out, raw, start, end)
        elif key in self.structural_keys and _IDENTIFIER.fullmatch(raw, start, end):
            return
        elif key in self.argument_keys or (
            key == "delta" and len(frames) == 1 and top_type in ARGUMENT_DELTA_EVENTS
        ):
            call = _call_key(frames, tree, self.index_keys)
            mask = self._arguments.setdefault(call, _ArgumentsMask())
            out[start:end] = mask.feed(raw[start:end])
        else:
            self._placeholder(out, raw, start, end)

    def _placeholder(self, out: bytearray, raw: bytes, start: int, end: int) -> None:
        length = end - start
        if length <= 0:
            return
        literal = raw[start:end]
        placeholder = self._placeholders.get(literal)
        if placeholder is None:
            tag = str(len(self._placeholders)).encode()
            placeholder = self._placeholders[literal] = (b"x" * length + tag)[-length:]
        out[start:end] = placeholder


def _fill(out: bytearray, start: int, end: int) -> None:
    if end > start:
        out[start:end] = bytes([_X]) * (end - start)


def _string_end(raw: bytes, start: int) -> int:
    """The offset of the quote that closes the JSON string opening at ``start``."""
    pos = start + 1
    while True:
        quote = raw.find(b'"', pos)
        if quote < 0:
            return len(raw) - 1  # not reached for valid JSON
        back = quote - 1
        while raw[back] == 0x5C:
            back -= 1
        if (quote - 1 - back) % 2 == 0:
            return quote
        pos = quote + 1


def _call_key(
    frames: list[_Frame], tree: object, index_keys: tuple[str, ...] = INDEX_KEYS
) -> tuple[object, ...]:
    """Which tool call a piece of arguments belongs to, the same across events.

    The path of keys down to the piece, where each object on the way adds its
    ``index``/``output_index`` and each array element its ``index`` (else its
    position): Chat's ``choices[].index`` and ``tool_calls[].index``, the
    Responses API's ``output_index``, Anthropic's content block ``index``.
    """
    parts: list[object] = []
    node = tree
    for frame in frames:
        if isinstance(node, dict):
            for name in index_keys:
                value = node.get(name)
                if _is_int(value):
                    parts.append((name, value))
        step: object
        if frame.is_object:
            step = frame.key
            node = node.get(frame.key) if isinstance(node, dict) and frame.key else None
        else:
            element = (
                node[frame.position]
                if isinstance(node, list) and frame.position < len(node)
                else None
            )
            index = element.get("index") if isinstance(element, dict) else None
            step = ("index", index) if _is_int(index) else frame.position
            node = element
        parts.append(step)
    return tuple(parts)
