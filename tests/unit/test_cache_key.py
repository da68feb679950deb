"""The response cache's pure parts: the key, the request controls, the plain answers'
finish readers, and the settings' refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.cache.key import body_digest, controls_of, key_of
from gateway.guard import Reason
from gateway.protocols import spec_for
from gateway.settings import Settings

scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
documents = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=6), documents, max_size=6), st.randoms())
def test_the_digest_reads_the_document_not_its_spelling(doc: dict[str, Any], rng: Any) -> None:
    items = list(doc.items())
    rng.shuffle(items)
    spelled = json.dumps(
        dict(items), indent=rng.choice([None, 1, 4]), ensure_ascii=rng.random() < 0.5
    )
    assert body_digest(spelled.encode()) == body_digest(json.dumps(doc).encode())


def test_a_different_document_has_a_different_digest() -> None:
    assert body_digest(b'{"a": 1}') != body_digest(b'{"a": 2}')
    assert body_digest(b'{"a": [1, 2]}') != body_digest(b'{"a": [2, 1]}')
    assert body_digest(b'\xef\xbb\xbf{"a": 1}') == body_digest(b'{"a":1}')


@pytest.mark.parametrize("body", [b"", b"not json", b"[1, 2]", b'"text"', b'{"a": ', b"\xff"])
def test_a_body_that_is_not_a_json_object_has_no_digest(body: bytes) -> None:
    assert body_digest(body) is None


@given(st.lists(st.text(max_size=5), max_size=5), st.lists(st.text(max_size=5), max_size=5))
def test_keys_of_different_part_lists_differ(a: list[str], b: list[str]) -> None:
    assert (key_of(a) == key_of(b)) == (a == b)


def test_the_key_is_64_hex_digits() -> None:
    key = key_of(["chat", "route"])
    assert len(key) == 64
    assert int(key, 16) >= 0


def test_request_controls() -> None:
    assert controls_of(None, None).reads
    assert controls_of(None, None).stores
    off = controls_of(None, b"off")
    assert not off.reads
    assert not off.stores
    assert controls_of(None, b"OFF ").off
    assert not controls_of(None, b"on").off
    nostore = controls_of(b"no-store", None)
    assert nostore.reads
    assert not nostore.stores
    nocache = controls_of(b"No-Cache, max-age=5", None)
    assert not nocache.reads
    assert nocache.stores
    assert nocache.max_age == 5
    assert controls_of(b'max-age="30"', None).max_age == 30
    assert controls_of(b"public", None).max_age is None


FINISHES: list[tuple[str, dict[str, Any], Reason | None]] = [
    ("chat", {"choices": [{"index": 0, "finish_reason": "stop"}]}, Reason.STOP),
    ("chat", {"choices": [{"index": 0, "finish_reason": "length"}]}, Reason.LENGTH),
    ("chat", {"choices": [{"index": 0, "finish_reason": None}]}, None),
    (
        "chat",
        {
            "choices": [
                {"index": 1, "finish_reason": "length"},
                {"index": 0, "finish_reason": "stop"},
            ]
        },
        Reason.STOP,
    ),
    ("chat", {"choices": [{"index": 0, "finish_reason": "stop"}, {"index": 1}]}, None),
    ("chat", {"choices": []}, None),
    ("completions", {"choices": [{"index": 0, "finish_reason": "stop"}]}, Reason.STOP),
    ("responses", {"status": "completed", "output": [{"type": "message"}]}, Reason.STOP),
    (
        "responses",
        {"status": "completed", "output": [{"type": "function_call"}]},
        Reason.TOOL_CALLS,
    ),
    (
        "responses",
        {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}},
        Reason.LENGTH,
    ),
    ("responses", {"status": "in_progress"}, None),
    ("messages", {"stop_reason": "end_turn"}, Reason.STOP),
    ("messages", {"stop_reason": "tool_use"}, Reason.TOOL_CALLS),
    ("messages", {"stop_reason": "max_tokens"}, Reason.LENGTH),
    ("messages", {"stop_reason": None}, None),
    (
        "gemini",
        {"candidates": [{"finishReason": "STOP", "content": {"parts": [{"text": "a"}]}}]},
        Reason.STOP,
    ),
    (
        "gemini",
        {"candidates": [{"finishReason": "STOP", "content": {"parts": [{"functionCall": {}}]}}]},
        Reason.TOOL_CALLS,
    ),
    ("gemini", {"candidates": [{"finishReason": "MAX_TOKENS"}]}, Reason.LENGTH),
    ("gemini", {"candidates": [{"content": {}}]}, None),
    ("ollama", {"done": True, "done_reason": "stop"}, Reason.STOP),
    ("ollama", {"done": True, "done_reason": "length"}, Reason.LENGTH),
    ("ollama", {"done": True, "message": {"tool_calls": [{}]}}, Reason.TOOL_CALLS),
    ("ollama", {"done": False}, None),
]


@pytest.mark.parametrize(("protocol", "body", "reason"), FINISHES)
def test_a_plain_answer_says_how_it_finished(
    protocol: str, body: dict[str, Any], reason: Reason | None
) -> None:
    finish = spec_for(protocol).answer_finish
    assert finish is not None
    assert finish(body) == reason


def test_the_protocols_name_the_headers_that_change_an_answer() -> None:
    assert spec_for("messages").answer_headers == (b"anthropic-version", b"anthropic-beta")
    assert b"openai-beta" in spec_for("chat").answer_headers
    assert spec_for("sse").answer_finish is None


@pytest.mark.parametrize("reason", ["length", "content_filter", "missing_done", "other"])
def test_a_cache_reason_that_is_not_a_whole_answer_is_refused(reason: str) -> None:
    with pytest.raises(ValidationError, match="cache_reasons"):
        Settings(
            routes=[{"upstream": "http://x", "cache": True, "cache_reasons": ["stop", reason]}]
        )


def test_a_redis_stream_store_needs_redis_url() -> None:
    with pytest.raises(ValidationError, match="stream_store"):
        Settings(upstream_url="http://x", stream_store="redis")
    ok = Settings(upstream_url="http://x", stream_store="redis", redis_url="redis://127.0.0.1/0")
    assert ok.stream_store == "redis"


def test_a_plain_answer_is_decoded_to_read_its_finish_within_a_bound() -> None:
    import gzip
    import zlib

    from gateway.cache.judge import decoded

    text = b'{"choices": []}' * 10
    assert decoded(text, None, 1000) == text
    assert decoded(gzip.compress(text), b"gzip", 1000) == text
    assert decoded(zlib.compress(text), b"deflate", 1000) == text
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert decoded(raw.compress(text) + raw.flush(), b"Deflate", 1000) == text
    assert decoded(gzip.compress(b"0" * 100_000), b"gzip", 1000) is None  # past the bound
    assert decoded(gzip.compress(text)[:-4], b"gzip", 1000) is None  # cut
    assert decoded(b"not gzip", b"gzip", 1000) is None
    assert decoded(text, b"br", 1000) is None


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (b'{"seed": 18446744073709551617}', b'{"seed": 18446744073709551618}'),
        (b'{"t": 1e400}', b'{"t": 1e500}'),
        (b'{"t": -1e400}', b'{"t": -1e401}'),
        (b'{"t": 0.1}', b'{"t": 0.10000000000000000001}'),
        (b'{"t": 1e-400}', b'{"t": 1e-401}'),
        (b'{"t": 15}', b'{"t": 15.0}'),
        (b'{"t": 1e400}', b'{"t": Infinity}'),
        (b'{"t": 1e400}', b'{"t": "1E+400"}'),
    ],
)
def test_every_json_number_is_keyed_exactly(a: bytes, b: bytes) -> None:
    """Issue 45 item 6: the key is what the upstream reads, number for number (orjson
    turned integers past 64 bits into floats, and 1e400 and 1e500 into one infinity)."""
    assert body_digest(a) is not None
    assert body_digest(b) is not None
    assert body_digest(a) != body_digest(b)


def test_the_same_number_spelled_twice_shares_a_key() -> None:
    assert body_digest(b'{"t": 1e400, "u": 0.5}') == body_digest(b'{"u":5E-1,"t":10e399}')
    assert body_digest(b'{"t": 0.5}') == body_digest(b'{"t":5e-1}')


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages": [1], "messages": [2]}',
        b'{"a": {"b": 1, "b": 1}}',
        b'{"a": [{"x": 1}, {"x": 2, "x": 3}]}',
        b'{"a\\u0062": 1, "ab": 2}',
    ],
)
def test_a_body_with_duplicate_keys_has_no_digest(body: bytes) -> None:
    """Issue 45 item 6: the key took the last of two duplicate members while the upstream
    may read the first, a way to poison a ``route``-scoped entry: never cached."""
    assert body_digest(body) is None
