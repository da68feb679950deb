"""The guard's JSON parser accepts and returns what ``json.loads`` does (big integers aside).

orjson takes the fast path; whatever it refuses goes to the standard library,
so no upstream event or request body is judged differently because of it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.guard.jsonparse import loads

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)  # beyond: see the test below
    | st.floats(allow_nan=False)
    | st.text()
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=20,
)


def _same(a: Any, b: Any) -> bool:
    """``a`` (ours) is ``b`` (json.loads's), but for the documented big-integer case."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(b, int) and not -(2**63) <= b < 2**64 and isinstance(a, float):
        return a == float(b)  # beyond 64 bits: a float (see the test below)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _outcome(parse: Any, data: str | bytes) -> tuple[str, Any]:
    try:
        return "ok", parse(data)
    except ValueError:
        return "error", "ValueError"
    except RecursionError:
        return "error", "RecursionError"


@given(_values, st.booleans())
def test_any_json_document_parses_as_the_standard_library_does(value: Any, as_bytes: bool) -> None:
    text = json.dumps(value, ensure_ascii=False)
    data: str | bytes = text.encode("utf-8", "surrogatepass") if as_bytes else text
    expected = _outcome(json.loads, data)
    assert _outcome(loads, data)[0] == expected[0]
    if expected[0] == "ok":
        assert loads(data) == json.loads(data)


@given(st.text(max_size=40) | st.binary(max_size=40))
def test_any_input_is_accepted_or_refused_as_the_standard_library_does(data: str | bytes) -> None:
    kind, expected = _outcome(json.loads, data)
    got_kind, got = _outcome(loads, data)
    assert got_kind == kind
    if kind == "ok":
        assert _same(got, expected)


@pytest.mark.parametrize(
    "data",
    [
        '{"x": NaN}',  # not JSON, but json.loads takes it
        '{"x": Infinity, "y": -Infinity}',
        '{"x": 1e400}',  # beyond a double: json.loads says inf
        '{"s": "\\ud800"}',  # a lone surrogate escape
        b'\xef\xbb\xbf{"bom": 1}',  # a UTF-8 byte-order mark on bytes
    ],
)
def test_what_orjson_refuses_still_parses_like_json_loads(data: str | bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(data)
    assert repr(loads(data)) == repr(json.loads(data))


def test_duplicate_keys_keep_the_last_value() -> None:
    assert loads('{"a": "x", "a": "y"}') == json.loads('{"a": "x", "a": "y"}') == {"a": "y"}


def test_integers_beyond_64_bits_come_back_as_floats() -> None:
    """The one documented difference: orjson reads such an integer as a double.

    No count, index or sequence number of a real stream is that large; the
    guard then sees a float where it wants an integer (not a count, or an
    invalid shape), never a crash.
    """
    assert loads("18446744073709551615") == 2**64 - 1
    assert loads("-9223372036854775808") == -(2**63)
    big = loads('{"n": 123456789012345678901234567890}')["n"]
    assert isinstance(big, float)
    assert big == float(123456789012345678901234567890)


def test_nesting_too_deep_is_the_standard_librarys_call() -> None:
    deep_ok = "[" * 500 + "]" * 500
    assert loads(deep_ok) == json.loads(deep_ok)
    # Deeper than json.loads goes but within orjson's 1,024: still json.loads's verdict.
    for deep in ("[" * 1000 + "]" * 1000, '{"a":' * 1000 + "1" + "}" * 1000):
        with pytest.raises(RecursionError):
            json.loads(deep)
        with pytest.raises(RecursionError):
            loads(deep)
        with pytest.raises(RecursionError):
            loads(deep.encode())
    too_deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(RecursionError):
        loads(too_deep)


@pytest.mark.parametrize("data", ["", "{", '{"a": 1,}', "[1, 2", "nul", b"\xff\xfe"])
def test_invalid_json_fails_with_the_standard_librarys_error(data: str | bytes) -> None:
    try:
        json.loads(data)
    except ValueError as exc:
        expected = exc
    with pytest.raises(type(expected), match=re.escape(str(expected))):
        loads(data)
