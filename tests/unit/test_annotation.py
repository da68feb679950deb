"""The incomplete-stream error event of every protocol: where the reason is, and the wording.

docs/wire-contract.md ("Incomplete stream") promises that every client can read the
reason from a machine-readable field of the error its SDK raises, and that each
protocol's message speaks that protocol's terms. These tests hold the guard's
renderer to it for every protocol and every incomplete reason.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.guard import Outcome, Protocol, Reason, Verdict, render_annotation
from gateway.guard.annotation import error_event, incomplete_message
from gateway.guard.eventstream import EventStreamDecoder
from gateway.guard.verdict import COMPLETE_REASONS, INCOMPLETE_REASONS

RENDERED = sorted(INCOMPLETE_REASONS)

#: Words that belong to another protocol's stream and must not appear in this one's messages.
FOREIGN: dict[Protocol, tuple[str, ...]] = {
    Protocol.CHAT: ("content block", "output item", "stop reason"),
    Protocol.COMPLETIONS: ("content block", "output item", "stop reason"),
    Protocol.RESPONSES: ("choice", "finish reason", "content block"),
    Protocol.MESSAGES: ("choice", "finish reason", "output item"),
    Protocol.GEMINI: ("choice", "output item", "content block", "stop reason"),
    Protocol.OLLAMA: ("choice", "output item", "content block", "stop reason", "event"),
    Protocol.SSE: ("choice", "finish reason", "output item", "content block"),
    Protocol.BEDROCK: ("choice", "finish reason", "output item"),
}
#: A client that looks for its terminator by substring must not find one in our error.
TERMINATORS = (
    "[DONE]",
    "message_stop",
    "response.completed",
    "response.incomplete",
    '"done"',
)


def parse(event: bytes) -> tuple[str | None, dict[str, Any]]:
    """(event name or None, JSON payload) of one rendered error event (SSE, NDJSON or one
    event stream frame: its exception type)."""
    if event[:1] == b"\x00":  # a binary frame: exactly one
        (frame,) = EventStreamDecoder().feed(event)
        assert frame.end == len(event)
        assert frame.id == "exception"
        payload = json.loads(frame.data)
        assert isinstance(payload, dict)
        return frame.event, payload
    if not event.startswith((b"data: ", b"event: ")):  # NDJSON: exactly one line
        assert event.endswith(b"\n")
        assert event.count(b"\n") == 1
        line = json.loads(event)
        assert isinstance(line, dict)
        return None, line
    assert event.endswith(b"\n\n")
    lines = event[:-2].split(b"\n")
    name = None
    if lines[0].startswith(b"event: "):
        name = lines.pop(0)[len(b"event: ") :].decode()
    (data,) = lines  # exactly one data line
    assert data.startswith(b"data: ")
    payload = json.loads(data[len(b"data: ") :])
    assert isinstance(payload, dict)
    return name, payload


def machine_reason(protocol: Protocol, payload: dict[str, Any]) -> set[str]:
    """Every place the payload carries the reason for a program to read."""
    if protocol is Protocol.MESSAGES:
        return {payload["error"]["details"]["error_code"]}
    if protocol is Protocol.RESPONSES:
        return {payload["code"], payload["error"]["code"]}
    if protocol is Protocol.GEMINI:  # google.rpc.ErrorInfo, as Google APIs carry a reason
        (info,) = (d for d in payload["error"]["details"] if d["@type"].endswith("ErrorInfo"))
        return {info["metadata"]["reason"], info["reason"].lower()}
    if protocol in (Protocol.OLLAMA, Protocol.BEDROCK):
        return {payload["gateway"]["reason"]}
    return {payload["error"]["code"]}


def shown_message(protocol: Protocol, payload: dict[str, Any]) -> str:
    """The human-readable message the client's SDK raises with."""
    # the ollama client raises ResponseError(line["error"]); botocore an EventStreamError
    # with the exception's message
    if protocol is Protocol.BEDROCK:
        message = payload["message"]
    else:
        message = payload["error"] if protocol is Protocol.OLLAMA else payload["error"]["message"]
    assert isinstance(message, str)
    return message


def test_client_stalled_is_an_incomplete_reason() -> None:
    assert Reason("client_stalled") is Reason.CLIENT_STALLED
    assert Reason.CLIENT_STALLED in INCOMPLETE_REASONS
    assert Reason.CLIENT_STALLED not in COMPLETE_REASONS


@pytest.mark.parametrize("protocol", list(Protocol))
@pytest.mark.parametrize("reason", RENDERED)
def test_every_error_event_carries_the_reason_in_a_field(
    protocol: Protocol, reason: Reason
) -> None:
    name, payload = parse(error_event(protocol, reason, "rid-1", last_sequence_number=4))
    assert machine_reason(protocol, payload) == {str(reason)}
    if protocol is Protocol.MESSAGES:
        assert name == "error"
        assert payload["type"] == "error"
        assert payload["error"]["type"] == "api_error"
    elif protocol is Protocol.RESPONSES:
        assert name == "error"
        assert payload["type"] == "error"
        assert payload["sequence_number"] == 5
    elif protocol is Protocol.GEMINI:
        assert name is None  # google-genai reads only data: lines
        assert isinstance(payload["error"]["code"], int)  # it raises only on an integer code
        assert next(iter(payload)) == "error"  # ... of an event that starts with "error"
    elif protocol is Protocol.BEDROCK:
        assert name == "modelStreamErrorException"  # botocore raises EventStreamError on it
        assert payload["request_id"] == "rid-1"
    elif protocol is Protocol.OLLAMA:
        assert isinstance(payload["error"], str)  # ollama raises ResponseError on it
        assert payload["gateway"]["outcome"] == "incomplete"
        assert payload["gateway"]["request_id"] == "rid-1"
    else:
        assert name is None  # openai-python 1.0-1.13 ignores named events
        assert payload["error"]["type"] == "stream_incomplete"


@pytest.mark.parametrize("protocol", list(Protocol))
@pytest.mark.parametrize("reason", RENDERED)
def test_every_message_is_in_the_protocols_own_terms(protocol: Protocol, reason: Reason) -> None:
    message = incomplete_message(protocol, reason, "rid-2")
    assert message.startswith("Stream incomplete: the ")
    assert "the stream did not finish" not in message  # every reason has its own words
    assert f"({reason})" in message
    assert message.endswith(". request_id=rid-2")
    for word in FOREIGN[protocol]:
        assert word not in message, f"{protocol} message speaks another protocol: {message!r}"
    for word in TERMINATORS:
        assert word not in message, f"{protocol} message names a terminator: {message!r}"
    _, payload = parse(error_event(protocol, reason, "rid-2"))
    assert shown_message(protocol, payload) == message


@pytest.mark.parametrize(
    ("protocol", "reason", "term"),
    [
        (Protocol.CHAT, Reason.MISSING_FINISH, "choice had no finish reason"),
        (Protocol.COMPLETIONS, Reason.CONTENT_AFTER_FINISH, "after a choice had finished"),
        (Protocol.CHAT, Reason.INVALID_TOOL_ARGUMENTS, "tool call arguments"),
        (Protocol.RESPONSES, Reason.MISSING_DONE, "before the response was done"),
        (Protocol.RESPONSES, Reason.MISSING_FINISH, "output item"),
        (Protocol.RESPONSES, Reason.CONTENT_AFTER_FINISH, "output item"),
        (Protocol.RESPONSES, Reason.INVALID_TOOL_ARGUMENTS, "function call arguments"),
        (Protocol.MESSAGES, Reason.MISSING_DONE, "before the message stopped"),
        (Protocol.MESSAGES, Reason.MISSING_FINISH, "content block"),
        (Protocol.MESSAGES, Reason.CONTENT_AFTER_FINISH, "content block"),
        (Protocol.MESSAGES, Reason.INVALID_TOOL_ARGUMENTS, "tool input"),
    ],
)
def test_the_protocol_words_where_they_matter(
    protocol: Protocol, reason: Reason, term: str
) -> None:
    assert term in incomplete_message(protocol, reason, "r")


@pytest.mark.parametrize("protocol", list(Protocol))
def test_client_stalled_reads_the_same_everywhere(protocol: Protocol) -> None:
    assert incomplete_message(protocol, Reason.CLIENT_STALLED, "r") == (
        "Stream incomplete: the client stopped reading past the send timeout "
        "(client_stalled). request_id=r"
    )


@pytest.mark.parametrize("protocol", list(Protocol))
def test_the_annotation_is_the_error_event_then_the_comment(protocol: Protocol) -> None:
    verdict = Verdict(outcome=Outcome.INCOMPLETE, reason=Reason.CLIENT_STALLED)
    trailer = render_annotation(protocol, verdict, "q-1", last_sequence_number=None)
    event = error_event(protocol, Reason.CLIENT_STALLED, "q-1")
    if protocol in (Protocol.OLLAMA, Protocol.BEDROCK):  # no comment line: the error alone
        assert trailer == event
        return
    assert trailer == event + b": gateway outcome=incomplete reason=client_stalled request_id=q-1\n"


@pytest.mark.parametrize("protocol", list(Protocol))
def test_a_complete_stream_gets_the_comment_unless_its_sdk_rejects_comments(
    protocol: Protocol,
) -> None:
    verdict = Verdict(outcome=Outcome.COMPLETE, reason=Reason.STOP)
    trailer = render_annotation(protocol, verdict, "q-2")
    # google-genai raises on any line that is not data:, and NDJSON (ollama) has no comment
    if protocol in (Protocol.GEMINI, Protocol.OLLAMA, Protocol.BEDROCK):
        assert trailer == b""
    else:
        assert trailer == b": gateway outcome=complete reason=stop request_id=q-2\n"
