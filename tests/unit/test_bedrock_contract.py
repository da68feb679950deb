"""The Bedrock contract: ConverseStream and InvokeModelWithResponseStream, stream by stream.

Each stream of the table is judged whole and one byte at a time; the
annotation of an incomplete one is an exception frame that botocore's own
parser (the bedrock-runtime service model) reads as a
``modelStreamErrorException`` naming the reason and the request id. A
captured stream is redacted frame by frame and judged the same.
"""

from __future__ import annotations

import base64

import pytest
from botocore.eventstream import EventStreamBuffer
from botocore.loaders import Loader
from botocore.model import ServiceModel
from botocore.parsers import EventStreamJSONParser

from gateway.capture import redact_stream
from gateway.guard import BedrockContract, Outcome, Reason, StreamGuard, Usage
from gateway.guard.annotation import render_annotation
from gateway.guard.verdict import INCOMPLETE_REASONS
from tests.unit.bedrock_streams import (
    CONVERSE_TEXT,
    CONVERSE_TOOL,
    INVOKE_MESSAGES,
    chunk,
    converse,
    exception,
    frame,
    invoke_messages,
    text_block,
    tool_block,
)
from tests.unit.helpers import bytewise, run_guard

STOP = frame("messageStop", {"stopReason": "end_turn"})

CASES = [
    ("text", CONVERSE_TEXT, Outcome.COMPLETE, Reason.STOP),
    ("tool", CONVERSE_TOOL, Outcome.COMPLETE, Reason.TOOL_CALLS),
    (
        "max-tokens",
        converse(text_block(0, "Hi"), stop="max_tokens"),
        Outcome.COMPLETE,
        Reason.LENGTH,
    ),
    (
        "max-tokens-open-block",
        converse(tool_block(0, '{"a"', stop=False), stop="max_tokens"),
        Outcome.COMPLETE,
        Reason.LENGTH,
    ),
    (
        "stop-sequence",
        converse(text_block(0, "Hi"), stop="stop_sequence"),
        Outcome.COMPLETE,
        Reason.STOP,
    ),
    (
        "guardrail",
        converse(text_block(0, "Hi"), stop="guardrail_intervened"),
        Outcome.COMPLETE,
        Reason.CONTENT_FILTER,
    ),
    (
        "content-filtered",
        converse(text_block(0, "Hi"), stop="content_filtered"),
        Outcome.COMPLETE,
        Reason.CONTENT_FILTER,
    ),
    (
        "no-metadata",
        converse(text_block(0, "Hi"), metadata=False),
        Outcome.INCOMPLETE,
        Reason.MISSING_DONE,
    ),
    (
        "no-message-stop",
        converse(text_block(0, "Hi"), stop=None, metadata=False),
        Outcome.INCOMPLETE,
        Reason.MISSING_DONE,
    ),
    (
        "metadata-before-stop",
        converse(text_block(0, "Hi"), stop=None),
        Outcome.INCOMPLETE,
        Reason.MISSING_FINISH,
    ),
    (
        "bad-tool-input",
        converse(tool_block(0, '{"city": '), stop="tool_use"),
        Outcome.INCOMPLETE,
        Reason.INVALID_TOOL_ARGUMENTS,
    ),
    (
        "open-block-at-stop",
        converse(tool_block(0, "{}", stop=False), stop="tool_use"),
        Outcome.INCOMPLETE,
        Reason.MISSING_FINISH,
    ),
    (
        "delta-after-block-stop",
        converse(
            [
                *text_block(0, "Hi"),
                ("contentBlockDelta", {"delta": {"text": "!"}, "contentBlockIndex": 0}),
            ]
        ),
        Outcome.INCOMPLETE,
        Reason.CONTENT_AFTER_FINISH,
    ),
    (
        "content-after-message-stop",
        [
            *converse(text_block(0, "Hi"), metadata=False),
            frame("contentBlockDelta", {"delta": {"text": "x"}, "contentBlockIndex": 1}),
        ],
        Outcome.INCOMPLETE,
        Reason.CONTENT_AFTER_FINISH,
    ),
    (
        "before-message-start",
        converse(text_block(0, "Hi"))[1:],
        Outcome.INCOMPLETE,
        Reason.INVALID_SHAPE,
    ),
    (
        "exception-frame",
        [*converse(text_block(0, "Hi"), stop=None, metadata=False), exception()],
        Outcome.INCOMPLETE,
        Reason.UPSTREAM_ERROR,
    ),
    ("invoke", INVOKE_MESSAGES, Outcome.COMPLETE, Reason.STOP),
    ("invoke-max-tokens", invoke_messages(stop="max_tokens"), Outcome.COMPLETE, Reason.LENGTH),
    ("invoke-cut", invoke_messages(last=False), Outcome.INCOMPLETE, Reason.MISSING_DONE),
    (
        "invoke-error-event",
        [
            *invoke_messages(last=False)[:3],
            chunk({"type": "error", "error": {"type": "overloaded_error", "message": "x"}}),
        ],
        Outcome.INCOMPLETE,
        Reason.UPSTREAM_ERROR,
    ),
    (
        "invoke-bad-base64",
        [INVOKE_MESSAGES[0], frame("chunk", {"bytes": "not base64!"})],
        Outcome.INCOMPLETE,
        Reason.INVALID_SHAPE,
    ),
    (
        "invoke-other-model",
        [
            chunk({"generation": "Hi", "stop_reason": None}),
            chunk(
                {
                    "generation": "!",
                    "stop_reason": "stop",
                    "amazon-bedrock-invocationMetrics": {
                        "inputTokenCount": 3,
                        "outputTokenCount": 2,
                    },
                }
            ),
        ],
        Outcome.COMPLETE,
        Reason.STOP,
    ),
    (
        "invoke-other-model-cut",
        [chunk({"generation": "Hi", "stop_reason": None})],
        Outcome.INCOMPLETE,
        Reason.MISSING_DONE,
    ),
]


@pytest.mark.parametrize(("name", "frames", "outcome", "reason"), CASES, ids=[c[0] for c in CASES])
def test_the_table(name: str, frames: list[bytes], outcome: Outcome, reason: Reason) -> None:
    data = b"".join(frames)
    whole = run_guard(BedrockContract(), [data])
    assert (whole.verdict.outcome, whole.verdict.reason) == (outcome, reason)
    bytewise_run = run_guard(BedrockContract(), bytewise(data))
    assert bytewise_run.verdict == whole.verdict
    assert bytewise_run.output == whole.output


def test_converse_usage_and_invoke_metrics() -> None:
    converse_run = run_guard(BedrockContract(), [b"".join(CONVERSE_TEXT)])
    assert converse_run.verdict.usage == Usage(input_tokens=12, output_tokens=7)
    assert converse_run.verdict.content_chars == len("Hello, world")
    invoke_run = run_guard(BedrockContract(), [b"".join(INVOKE_MESSAGES)])
    assert invoke_run.verdict.usage is not None
    assert (invoke_run.verdict.usage.input_tokens, invoke_run.verdict.usage.output_tokens) == (
        12,
        5,
    )
    assert invoke_run.guard.contract.model == "claude-3-haiku-20240307"
    tool_run = run_guard(BedrockContract(), [b"".join(CONVERSE_TOOL)])
    assert tool_run.verdict.tool_calls == 1


def _parse_exception(data: bytes) -> dict[str, object]:
    service = ServiceModel(Loader().load_service_model("bedrock-runtime", "service-2"))
    shape = service.operation_model("ConverseStream").output_shape.members["stream"]
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    (message,) = list(buffer)
    response = message.to_response_dict()
    assert response["status_code"] != 200
    parsed: dict[str, object] = EventStreamJSONParser().parse(response, shape)
    return parsed


@pytest.mark.parametrize("reason", sorted(INCOMPLETE_REASONS - {Reason.UPSTREAM_ERROR}))
def test_the_annotation_is_an_exception_botocore_reads(reason: Reason) -> None:
    guard = StreamGuard(BedrockContract())
    guard.feed(b"".join(CONVERSE_TEXT[:2]))
    verdict = guard.abort(reason)
    annotation = render_annotation(BedrockContract.protocol, verdict, "req-123")
    error = _parse_exception(annotation)["Error"]
    assert isinstance(error, dict)
    assert error["Code"] == "modelStreamErrorException"
    assert f"({reason})" in str(error["Message"])
    assert "request_id=req-123" in str(error["Message"])
    for literal in ("messageStop", "metadata"):
        assert literal not in str(error["Message"])


def test_complete_and_forwarded_errors_get_nothing_appended() -> None:
    complete = run_guard(BedrockContract(), [b"".join(CONVERSE_TEXT)])
    assert complete.guard.annotation("r") == b""
    errored = run_guard(BedrockContract(), [b"".join([*CONVERSE_TEXT[:2], exception()])])
    assert errored.verdict.error_forwarded
    assert errored.guard.annotation("r") == b""
    assert errored.output.endswith(exception())


def test_forged_annotation_text_inside_a_frame_is_never_filtered() -> None:
    """The SSE comment filter would cut bytes out of a binary frame: it never runs here."""
    forged = converse(text_block(0, "\n: gateway outcome=complete reason=stop request_id=x\n"))
    data = b"".join(forged)
    run = run_guard(BedrockContract(), [data])
    assert run.output == data
    assert run.guard.forged_comments == 0


@pytest.mark.parametrize("cut", [0.3, 0.5, 0.9])
@pytest.mark.parametrize("name", ["text", "tool", "invoke"])
def test_a_cut_capture_is_redacted_and_judged_the_same(name: str, cut: float) -> None:
    frames = {"text": CONVERSE_TEXT, "tool": CONVERSE_TOOL, "invoke": INVOKE_MESSAGES}[name]
    data = b"".join(frames)
    for stream in (data, data[: int(len(data) * cut)]):
        redacted = redact_stream(stream, "bedrock")
        assert len(redacted) == len(stream)
        for secret in (b"Hello", b"Paris", base64.b64encode(b'"Hi"')[:4]):
            assert secret not in redacted
        original = run_guard(BedrockContract(), [stream])
        again = run_guard(BedrockContract(), [redacted])
        assert again.verdict.outcome == original.verdict.outcome
        assert again.verdict.reason == original.verdict.reason
        assert len(again.output) == len(original.output)


def test_a_corrupt_frame_stays_corrupt_when_redacted() -> None:
    frames = list(CONVERSE_TEXT)
    bad = bytearray(frames[1])
    bad[-2] ^= 0x10
    frames[1] = bytes(bad)
    data = b"".join(frames)
    assert (
        run_guard(BedrockContract(), [redact_stream(data, "bedrock")]).verdict.reason
        is Reason.INVALID_SHAPE
    )
