"""Redaction of captured streams: same bytes offsets, no text, the guard's verdict unchanged.

Pure functions, no I/O: streams are built here, redacted, and compared (byte
by byte for the framing, through the guard for the verdict).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gateway.capture import redact_stream
from gateway.guard import SSEDecoder, StreamGuard
from gateway.protocols import ContractOptions, spec_for

SECRETS = ("Pssst-PROMPT-4711", "Sekret-COMPLETION-0815", "sk-live-KEY-1234567890")


def _data(obj: Any, event: str | None = None, nl: bytes = b"\n") -> bytes:
    head = b"event: " + event.encode() + nl if event else b""
    return head + b"data: " + json.dumps(obj, ensure_ascii=False).encode() + nl + nl


def _verdict(protocol: str, stream: bytes, chunks: list[int] | None = None) -> tuple[str, str]:
    guard = StreamGuard(spec_for(protocol).new_contract(ContractOptions()))
    pieces = [stream] if chunks is None else _split(stream, chunks)
    for piece in pieces:
        guard.feed(piece)
        if guard.done:
            break
    verdict = guard.verdict if guard.done else guard.eof()
    assert verdict is not None
    return str(verdict.outcome), str(verdict.reason)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def _lines(data: bytes) -> list[int]:
    """The offsets of every CR and LF: redaction never moves them."""
    return [i for i, byte in enumerate(data) if byte in (0x0A, 0x0D)]


def _chat_chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> bytes:
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    return _data(
        {"id": "chatcmpl-abc", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
    )


def test_lengths_line_ends_and_framing_are_kept() -> None:
    stream = (
        b"\xef\xbb\xbf: heartbeat with words\r\n"
        b"retry: 3000\r\n"
        b"id: opaque-id-42\r\n"
        b"event: message\r\n"
        b'data: {"a": "multi",\r\n'
        b'data:  "b": ["line", 1, true, null]}\r\n\r\n'
        b"x-unknown: field\rdata: not json at all\r\r"
        b"data: [DONE]\n\n"
        b'data: {"cut": "mid'
    )
    redacted = redact_stream(stream)
    assert len(redacted) == len(stream)
    assert _lines(redacted) == _lines(stream)
    assert redacted.startswith(b"\xef\xbb\xbf:")
    for kept in (b"retry: 3000", b"event: message", b"data: [DONE]\n\n", b'"a": "', b'"b": ['):
        assert kept in redacted
    assert b"1, true, null]}" in redacted
    for gone in (b"heartbeat", b"opaque", b"multi", b"line", b"unknown", b"not json", b"mid"):
        assert gone not in redacted
    decoder = SSEDecoder()
    before, after = decoder.feed(stream), SSEDecoder().feed(redacted)
    assert [(e.event, e.start, e.end) for e in before] == [(e.event, e.start, e.end) for e in after]
    assert json.loads(after[0].data) == {"a": "xxxx0", "b": ["xxx1", 1, True, None]}


def test_strings_become_placeholders_equal_for_equal_strings() -> None:
    stream = _data({"id": "call_1", "other": "call_2", "again": "call_1", "empty": ""})
    obj = json.loads(SSEDecoder().feed(redact_stream(stream))[0].data)
    assert obj["id"] == obj["again"] != obj["other"]
    assert len(obj["id"]) == len("call_1")
    assert obj["empty"] == ""
    assert set(obj["id"] + obj["other"]) <= set("x0123456789")


def test_the_protocols_vocabulary_stays_and_content_goes() -> None:
    stream = _data(
        {
            "type": "response.output_text.delta",
            "object": "chat.completion.chunk",
            "role": "assistant",
            "status": "in_progress",
            "finish_reason": "tool_calls",
            "finishReason": "MAX_TOKENS",
            "stop_reason": "end_turn",
            "text": "stop",  # the same word as content: not vocabulary here
            "reason": "two words",  # not an identifier
            "args": {"type": "celsius", "city": "Paris", "days": 42},
        }
    )
    obj = json.loads(SSEDecoder().feed(redact_stream(stream))[0].data)
    assert obj["type"] == "response.output_text.delta"
    assert obj["object"] == "chat.completion.chunk"
    assert (obj["role"], obj["status"]) == ("assistant", "in_progress")
    assert (obj["finish_reason"], obj["finishReason"], obj["stop_reason"]) == (
        "tool_calls",
        "MAX_TOKENS",
        "end_turn",
    )
    assert obj["text"] != "stop"
    assert obj["reason"] != "two words"
    # Inside free-form objects, keys and numbers are content too.
    assert "city" not in obj["args"]
    assert "type" not in obj["args"]
    assert 42 not in obj["args"].values()
    assert 11 in obj["args"].values()


def _stream_with_secrets(protocol: str) -> bytes:
    prompt, completion, key = SECRETS
    url = "https://upstream.example/v1?api-key=" + key
    if protocol == "chat":
        return (
            b": " + url.encode() + b"\n\n"
            + b"id: " + key.encode() + b"\n"
            + _chat_chunk({"role": "assistant", "content": completion})
            + _chat_chunk({"tool_calls": [{"index": 0, "id": key, "function": {"name": prompt, "arguments": '{"q": "' + completion}}]})  # noqa: E501
            + _chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '", "n": 4711}'}}]})  # noqa: E501
            + _data({"error": {"message": f"key {key} at {url} for {prompt}", "type": "x"}})
        )  # fmt: skip
    if protocol == "responses":
        created = {
            "type": "response.created",
            "sequence_number": 0,
            "response": {
                "id": "resp_1",
                "status": "in_progress",
                "instructions": prompt,
                "model": "m",
            },
        }
        delta = {
            "type": "response.output_text.delta",
            "sequence_number": 1,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": completion,
        }
        return (
            _data(created, "response.created") + _data(delta, "response.output_text.delta")
            + b"data: " + url.encode() + b"\n\n"
        )  # fmt: skip
    if protocol == "messages":
        start = {
            "type": "message_start",
            "message": {
                "id": "msg",
                "content": [{"type": "text", "text": prompt}],
                "model": "m",
                "role": "assistant",
            },
        }
        block = {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": key, "name": "t", "input": {}},
        }
        delta = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": '{"x": "' + completion},
        }
        error = {"type": "error", "error": {"type": "api_error", "message": "see " + url}}
        return (
            _data(start, "message_start") + _data(block, "content_block_start")
            + _data(delta, "content_block_delta") + _data(error, "error")
        )  # fmt: skip
    candidate = {
        "content": {
            "role": "model",
            "parts": [{"text": completion}, {"functionCall": {"name": "f", "args": {prompt: key}}}],
        }
    }
    return _data({"candidates": [candidate], "modelVersion": url})


def test_no_prompt_completion_key_or_url_survives() -> None:
    for protocol in ("chat", "responses", "messages", "gemini"):
        stream = _stream_with_secrets(protocol)
        redacted = redact_stream(stream)
        assert len(redacted) == len(stream)
        for secret in (*SECRETS, "upstream.example"):
            assert secret in stream.decode()
            for word in secret.replace("-", " ").replace(".", " ").split():
                if len(word) >= 4:
                    assert word.encode() not in redacted, (protocol, word)


def test_the_verdict_of_a_redacted_stream_is_the_original_ones() -> None:
    args = json.dumps({"city": 'Zürich "old" town', "days": [1, 2.5e3], "ok": True, "n": None})
    valid = _tool_stream(args, list(range(5, len(args), 5)))
    broken = _tool_stream(args.replace('"days"', "days"), list(range(5, len(args), 5)))
    missing = valid.replace(b"data: [DONE]\n\n", b"")
    for stream, expected in (
        (valid, ("complete", "tool_calls")),
        (broken, ("incomplete", "invalid_tool_arguments")),
        (missing, ("incomplete", "missing_done")),
    ):
        assert _verdict("chat", stream) == expected
        assert _verdict("chat", redact_stream(stream)) == expected
    whole = _tool_stream(args, [])
    assert b"town" in whole
    assert b"city" in whole
    assert b"town" not in redact_stream(whole)
    assert b"city" not in redact_stream(whole)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def _tool_stream(arguments: str, cuts: list[int]) -> bytes:
    points = sorted({c % (len(arguments) + 1) for c in cuts})
    pieces = [arguments[a:b] for a, b in zip([0, *points], [*points, len(arguments)], strict=True)]
    head = {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}]}
    body = b"".join(
        _chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in pieces
    )
    return _chat_chunk(head) + body + _chat_chunk({}, "tool_calls") + b"data: [DONE]\n\n"


@given(value=_json_values, cuts=st.lists(st.integers(0, 400), max_size=6), ascii=st.booleans())
def test_valid_tool_arguments_stay_valid_in_any_pieces(
    value: object, cuts: list[int], ascii: bool
) -> None:
    stream = _tool_stream(json.dumps(value, ensure_ascii=ascii), cuts)
    assert _verdict("chat", redact_stream(stream)) == ("complete", "tool_calls")


@given(text=st.text(max_size=40), cuts=st.lists(st.integers(0, 400), max_size=6))
def test_invalid_tool_arguments_stay_invalid_in_any_pieces(text: str, cuts: list[int]) -> None:
    try:
        json.loads(text)
    except ValueError:
        pass
    else:
        return  # valid JSON is the other test's
    if not text.strip():
        return  # no arguments at all is valid for the guard
    stream = _tool_stream(text, cuts)
    expected = _verdict("chat", stream)
    assert expected == ("incomplete", "invalid_tool_arguments")
    assert _verdict("chat", redact_stream(stream)) == expected


@given(cuts=st.lists(st.integers(0, 2000), max_size=8))
def test_redaction_does_not_depend_on_how_the_stream_was_split(cuts: list[int]) -> None:
    """Redaction runs on the whole stream, so chunk boundaries never change it, and the
    guard judges the redacted chunks (at the original boundaries) as it judged the original."""
    stream = _stream_with_secrets("chat") + _chat_chunk({}, "stop")
    redacted = redact_stream(stream)
    assert _verdict("chat", redacted, cuts) == _verdict("chat", stream, cuts)


# -- NDJSON (Ollama) ------------------------------------------------------------------


def _line(obj: Any, nl: bytes = b"\n") -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + nl


def test_an_ndjson_stream_keeps_its_lines_and_verdict_and_loses_its_text() -> None:
    call = {"function": {"name": "lookup", "arguments": {SECRETS[0]: SECRETS[1]}}}
    stream = (
        _line({"model": "llama3.2", "message": {"role": "assistant", "content": SECRETS[1]}})
        + b"\n"
        + _line({"message": {"role": "assistant", "content": "", "tool_calls": [call]}}, b"\r\n")
        + _line({"done": True, "done_reason": "stop", "eval_count": 12})
    )
    redacted = redact_stream(stream, "ollama")
    assert len(redacted) == len(stream)
    assert [i for i, b in enumerate(redacted) if b in b"\r\n"] == [
        i for i, b in enumerate(stream) if b in b"\r\n"
    ]
    for secret in SECRETS[:2]:
        assert secret.encode() not in redacted
    lines = [json.loads(line) for line in redacted.splitlines() if line.strip()]
    assert lines[0]["message"]["role"] == "assistant"
    assert lines[2] == {"done": True, "done_reason": "stop", "eval_count": 12}
    assert _verdict("ollama", redacted) == _verdict("ollama", stream) == ("complete", "tool_calls")


def test_a_line_that_is_not_json_is_replaced_whole() -> None:
    stream = b'{"message": {"content": "' + SECRETS[1].encode() + b'"\n'
    redacted = redact_stream(stream, "ollama")
    assert len(redacted) == len(stream)
    assert SECRETS[1].encode() not in redacted
    assert redacted.endswith(b"\n")
