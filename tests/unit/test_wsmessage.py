"""The WebSocket message framing of the Responses contract (gateway.guard.wsmessage)."""

from __future__ import annotations

import json

from gateway.guard import Action, Outcome, Reason, ResponsesContract
from gateway.guard.wsmessage import MessageGuard


def _event(kind: str, sequence: int, **fields: object) -> str:
    return json.dumps({"type": kind, "sequence_number": sequence, **fields})


def _completed(sequence: int) -> str:
    usage = {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}
    response = {"id": "r", "model": "m", "output": [], "usage": usage}
    return _event("response.completed", sequence, response=response)


def _guard(limit: int | None = None) -> MessageGuard:
    return MessageGuard(ResponsesContract(), max_message_bytes=limit)


def test_a_whole_response_is_complete_with_usage_and_no_annotation() -> None:
    guard = _guard()
    created = _event("response.created", 0, response={"id": "r", "model": "m"})
    assert guard.feed(created) is Action.FORWARD
    delta = _event("response.output_text.delta", 1, output_index=0, delta="hi")
    assert guard.feed(delta) is Action.FORWARD
    assert guard.feed(_completed(2)) is Action.FINISH
    assert guard.verdict is not None
    assert (guard.verdict.outcome, guard.verdict.reason) == (Outcome.COMPLETE, Reason.STOP)
    assert guard.verdict.usage is not None
    assert guard.verdict.usage.output_tokens == 2
    assert guard.error_message("rid") is None


def test_invalid_json_is_rejected_and_annotated_in_the_websocket_error_shape() -> None:
    guard = _guard()
    guard.feed(_event("response.created", 4, response={}))
    assert guard.feed('{"type": "response.output_text.delta", "delta": "x') is Action.REJECT
    text = guard.error_message("rid-1")
    assert text is not None
    error = json.loads(text)
    assert error["type"] == "error"
    assert error["error"]["code"] == "invalid_json"
    assert error["error"]["type"] == "stream_incomplete"
    assert error["sequence_number"] == 5
    assert "rid-1" in error["error"]["message"]


def test_a_message_over_the_limit_is_rejected_before_it_is_parsed() -> None:
    guard = _guard(limit=100)
    assert guard.feed("{" + " " * 200 + "}") is Action.REJECT
    assert guard.verdict is not None
    assert guard.verdict.reason is Reason.LIMIT_EXCEEDED


def test_a_non_ascii_message_is_measured_in_utf8_bytes() -> None:
    guard = _guard(limit=100)
    text = '{"type":"response.output_text.delta","delta":"' + "数" * 20 + '"}'
    assert len(text) <= 100 < len(text.encode())
    assert guard.feed(text) is Action.REJECT
    assert guard.verdict is not None
    assert guard.verdict.reason is Reason.LIMIT_EXCEEDED


def test_the_upstreams_own_error_is_forwarded_and_not_annotated_again() -> None:
    guard = _guard()
    error = json.dumps({"type": "error", "error": {"code": "server_error", "message": "x"}})
    assert guard.feed(error) is Action.FINISH
    assert guard.verdict is not None
    assert guard.verdict.reason is Reason.UPSTREAM_ERROR
    assert guard.error_message("rid") is None


def test_a_cut_between_messages_is_missing_done() -> None:
    guard = _guard()
    guard.feed(_event("response.created", 0, response={}))
    assert guard.eof().reason is Reason.MISSING_DONE
    assert json.loads(guard.error_message("r") or "")["error"]["code"] == "missing_done"
