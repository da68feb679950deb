"""The input estimate's fast walk equals the plain one over any JSON document."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gateway.policy.quota import (
    _INPUT_FIELDS,
    MESSAGE_OVERHEAD,
    REQUEST_OVERHEAD,
    _text_bytes,
    _tokens,
    estimate_input,
)


def _plain_text_bytes(value: object) -> int:
    """The walk as it was: one type dispatch per item."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            text: str = item  # type: ignore[assignment]
            total += len(text) if text.isascii() else len(text.encode("utf-8", "replace"))
        elif kind is dict:
            stack.extend(item.values())  # type: ignore[attr-defined]
        elif kind is list:
            stack.extend(item)  # type: ignore[arg-type]
    return total


def _plain_estimate(request: dict[str, Any] | None, body_size: int) -> int:
    """The estimate as it is defined: its text's bytes, 4 a token, and the overheads."""
    if request is None:
        return _tokens(body_size) + MESSAGE_OVERHEAD + REQUEST_OVERHEAD
    size = 0
    messages = 0
    for name in _INPUT_FIELDS:
        value = request.get(name)
        if value is not None:
            size += _plain_text_bytes(value)
        if name in ("messages", "contents", "input"):
            if isinstance(value, str):
                messages += 1
            elif isinstance(value, list):
                messages += len(value)
    return _tokens(size) + MESSAGE_OVERHEAD * messages + REQUEST_OVERHEAD


_TEXT = st.text() | st.text(alphabet=st.characters(codec="ascii")) | st.just("\ud83d\ude00x")
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(_TEXT, children, max_size=5),
    max_leaves=40,
)
_REQUEST = st.dictionaries(st.sampled_from(_INPUT_FIELDS) | _TEXT, _JSON, max_size=8)


@given(_JSON)
def test_the_walk_counts_what_the_plain_walk_counts(value: object) -> None:
    assert _text_bytes(value) == _plain_text_bytes(value)


@given(_REQUEST, st.integers(min_value=0, max_value=10**6))
def test_the_estimate_is_the_plain_estimate(request: dict[str, Any], size: int) -> None:
    assert estimate_input(request, size) == _plain_estimate(request, size)
    parsed = json.loads(json.dumps(request))  # as the gateway gets it
    assert estimate_input(parsed, size) == _plain_estimate(parsed, size)


def test_lone_surrogates_count_as_one_byte_each_joined_or_not() -> None:
    message = {"role": "user", "content": "\ud83d", "name": "\ude00é"}
    assert _text_bytes(message) == _plain_text_bytes(message) == 4 + 1 + 1 + 2
