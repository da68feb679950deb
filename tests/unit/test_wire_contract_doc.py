"""docs/wire-contract.md stays true to the code: its example trailers are the bytes the
guard renders, and it (and the README) name every reason of the vocabulary."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.guard import Outcome, Protocol, Reason, Verdict, render_annotation

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "wire-contract.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "protocol", [Protocol.CHAT, Protocol.RESPONSES, Protocol.MESSAGES, Protocol.OLLAMA]
)
def test_the_documented_incomplete_trailer_is_what_the_guard_renders(protocol: Protocol) -> None:
    verdict = Verdict(outcome=Outcome.INCOMPLETE, reason=Reason.MISSING_DONE)
    rendered = render_annotation(protocol, verdict, "req-7f3a", last_sequence_number=41)
    assert rendered.decode() in DOC


def test_the_documented_complete_trailer_is_what_the_guard_renders() -> None:
    verdict = Verdict(outcome=Outcome.COMPLETE, reason=Reason.STOP)
    rendered = render_annotation(Protocol.CHAT, verdict, "7f3a2c9e")
    assert rendered.decode() in DOC


def test_the_documented_websocket_error_is_what_the_guard_renders() -> None:
    from gateway.guard.annotation import incomplete_message
    from gateway.guard.wsmessage import error_message

    message = incomplete_message(Protocol.RESPONSES, Reason.MISSING_DONE, "req-7f3a")
    rendered = error_message(
        Reason.MISSING_DONE, message, request_id="req-7f3a", last_sequence_number=41
    )
    assert rendered in DOC


def _outcome_section(text: str) -> str:
    match = re.search(r"^#+ Outcomes.*?(?=^## )", text, flags=re.M | re.S)
    assert match is not None
    return match.group(0)


@pytest.mark.parametrize("reason", sorted(Reason))
def test_every_reason_is_documented(reason: Reason) -> None:
    assert f"`{reason}`" in _outcome_section(DOC), f"docs/wire-contract.md lacks {reason}"
    assert f"`{reason}`" in _outcome_section(README), f"README's Outcomes lacks {reason}"


def test_the_documented_continued_trailer_is_what_the_guard_renders() -> None:
    verdict = Verdict(outcome=Outcome.COMPLETE, reason=Reason.STOP)
    rendered = render_annotation(Protocol.CHAT, verdict, "7f3a2c9e", continued=1)
    assert rendered.decode() in DOC
    assert b"continued" not in render_annotation(Protocol.CHAT, verdict, "7f3a2c9e")


def test_the_documented_bedrock_exception_payload_is_what_the_guard_renders() -> None:
    from gateway.guard.eventstream import EventStreamDecoder

    verdict = Verdict(outcome=Outcome.INCOMPLETE, reason=Reason.MISSING_DONE)
    (frame,) = EventStreamDecoder().feed(render_annotation(Protocol.BEDROCK, verdict, "req-7f3a"))
    assert (frame.id, frame.event) == ("exception", "modelStreamErrorException")
    assert frame.data in DOC


def test_the_documented_schema_trailers_are_what_the_guard_renders() -> None:
    from gateway.schema import Kind, Result, SchemaVerdict

    verdict = Verdict(outcome=Outcome.COMPLETE, reason=Reason.STOP)
    for schema in (
        SchemaVerdict(Result.VALID),
        SchemaVerdict(Result.INVALID, Kind.ANSWER, "/age", 3, "string where"),
    ):
        rendered = render_annotation(Protocol.CHAT, verdict, "7f3a2c9e", words=schema.trailer())
        assert rendered.decode() in DOC
