"""Ollama's native API contract: when an NDJSON stream is complete, and what it reports.

Each case is a stream of lines and the verdict the contract must reach, with
what the client receives (the forwarded lines, then the trailer: nothing on a
complete stream, one error line on an incomplete one, nothing after
Ollama's own error line). The protocol's spec is held to the paths and the
``stream`` default of Ollama's API.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.guard import OllamaContract, Outcome, Reason, Usage
from gateway.protocols import detect, spec_for
from tests.unit.helpers import run_guard


def line(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def chat(content: str = "hi", *, tool_calls: object = None, **extra: Any) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return line({"model": "llama3.2", "message": message, **extra})


def done(reason: str | None = "stop", **extra: Any) -> bytes:
    fields: dict[str, Any] = {"done": True, "prompt_eval_count": 26, "eval_count": 4, **extra}
    if reason is not None:
        fields["done_reason"] = reason
    return chat("", **fields)


TOOL_CALL = chat(
    "",
    tool_calls=[{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    done=False,
)
GENERATE = line({"model": "llama3.2", "response": "The", "done": False})

FORGED = {"outcome": "incomplete", "reason": "idle_timeout", "request_id": "FAKE"}

CASES: list[tuple[str, bytes, Reason, bool]] = [
    # (id, stream, reason, every byte forwarded)
    ("chat-stop", chat(done=False) + chat(" there", done=False) + done(), Reason.STOP, True),
    (
        "generate-length",
        GENERATE + line({"response": "", "done": True, "done_reason": "length"}),
        Reason.LENGTH,
        True,
    ),
    ("tool-call", TOOL_CALL + done(), Reason.TOOL_CALLS, True),
    ("load-is-other", done("load"), Reason.OTHER, True),
    ("cut", chat(done=False) + chat(done=False), Reason.MISSING_DONE, True),
    ("done-without-reason", chat(done=False) + done(None), Reason.MISSING_FINISH, False),
    (
        "error-line",
        chat(done=False) + line({"error": "model overloaded"}),
        Reason.UPSTREAM_ERROR,
        True,
    ),
    ("error-object", chat(done=False) + line({"error": {"x": 1}}), Reason.INVALID_SHAPE, False),
    ("invalid-json", chat(done=False) + b'{"message":\n' + done(), Reason.INVALID_JSON, False),
    ("not-an-object", b"[1]\n" + done(), Reason.INVALID_SHAPE, False),
    ("message-not-object", line({"message": "x"}) + done(), Reason.INVALID_SHAPE, False),
    ("content-not-string", line({"message": {"content": 1}}) + done(), Reason.INVALID_SHAPE, False),
    ("response-not-string", line({"response": [1]}) + done(), Reason.INVALID_SHAPE, False),
    ("done-not-boolean", chat(done="yes"), Reason.INVALID_SHAPE, False),
    ("done-reason-not-string", chat(done=True, done_reason=1), Reason.INVALID_SHAPE, False),
    (
        "tool-arguments-string",
        chat("", tool_calls=[{"function": {"name": "f", "arguments": "{}"}}]) + done(),
        Reason.INVALID_TOOL_ARGUMENTS,
        False,
    ),
    (
        "tool-call-without-name",
        chat("", tool_calls=[{"function": {"arguments": {}}}]) + done(),
        Reason.INVALID_SHAPE,
        False,
    ),
    ("tool-calls-not-list", chat("", tool_calls={}) + done(), Reason.INVALID_SHAPE, False),
    # A line carrying the key of the gateway's own error line poses as its verdict.
    (
        "forged-error-line",
        chat(done=False) + line({"error": "boom", "gateway": FORGED}),
        Reason.INVALID_SHAPE,
        False,
    ),
    ("forged-done-line", chat(done=False) + done(gateway=FORGED), Reason.INVALID_SHAPE, False),
    ("forged-content-line", chat(gateway=FORGED) + done(), Reason.INVALID_SHAPE, False),
]


@pytest.mark.parametrize(
    ("stream", "reason", "whole"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_stream_gets_its_verdict_and_trailer(
    stream: bytes, reason: Reason, whole: bool
) -> None:
    run = run_guard(OllamaContract(), [stream])
    assert run.verdict.reason is reason, run.verdict.detail
    if whole:
        assert run.output == stream
    else:  # the line at which the contract failed is withheld
        assert stream.startswith(run.output)
        assert len(run.output) < len(stream)
    trailer = run.annotated("r-1")[len(run.output) :]
    if run.verdict.outcome is Outcome.COMPLETE or reason is Reason.UPSTREAM_ERROR:
        assert trailer == b""  # a complete stream, or Ollama's own error line: nothing added
        return
    error = json.loads(trailer)
    assert trailer.count(b"\n") == 1
    assert error["gateway"] == {"outcome": "incomplete", "reason": str(reason), "request_id": "r-1"}
    assert f"({reason})" in error["error"]
    assert "request_id=r-1" in error["error"]


def test_usage_model_and_tool_calls_are_read() -> None:
    run = run_guard(OllamaContract(), [TOOL_CALL + done()])
    verdict = run.verdict
    assert verdict.usage == Usage(input_tokens=26, output_tokens=4)
    assert verdict.tool_calls == 1
    assert verdict.raw_finish_reasons == {0: "stop"}
    assert run.guard.contract.model == "llama3.2"
    assert run.guard.content_events == 1


def test_a_route_may_accept_a_done_line_without_its_reason() -> None:
    run = run_guard(OllamaContract(require_finish_reason=False), [chat(done=False) + done(None)])
    assert run.verdict.outcome is Outcome.COMPLETE
    assert run.verdict.reason is Reason.OTHER


def test_reading_stops_at_the_done_line() -> None:
    stream = done() + chat("after", done=False)
    run = run_guard(OllamaContract(), [stream])
    assert run.verdict.reason is Reason.STOP
    assert run.output == done()


@pytest.mark.parametrize(
    ("path", "body", "streams"),
    [
        ("/api/chat", {"model": "m"}, True),
        ("/api/chat", {"model": "m", "stream": True}, True),
        ("/api/chat", {"model": "m", "stream": False}, False),
        ("/api/generate", None, True),
        ("/api/generate/", {"stream": False}, False),
        ("/ollama/api/chat", {}, True),
        ("/chat", {}, True),  # below a route whose prefix is /api
        ("/generate?x=1", {"stream": False}, False),
        ("/api/tags", None, False),
        ("/api/pull", {"model": "m"}, False),
    ],
)
def test_the_spec_knows_which_requests_stream(
    path: str, body: dict[str, Any] | None, streams: bool
) -> None:
    spec = spec_for("ollama")
    assert spec.wants_stream(path, body) is streams
    assert (detect(path) is spec) is path.rstrip("/").endswith(("/api/chat", "/api/generate"))


def test_the_spec_names_the_ndjson_framing() -> None:
    framing = spec_for("ollama").framing
    assert framing.media_type == "application/x-ndjson"
    assert framing.is_stream("application/x-ndjson; charset=utf-8")
    assert not framing.comments
    assert framing.announced_only
    assert spec_for("ollama").answer_usage({"prompt_eval_count": 3, "eval_count": 9}) == Usage(
        input_tokens=3, output_tokens=9
    )
    assert spec_for("chat").framing.media_type == "text/event-stream"
