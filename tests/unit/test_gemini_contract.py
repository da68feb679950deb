"""GeminiContract driven through StreamGuard: verdicts, forwarded bytes, usage, the error event.

The fixtures are real Gemini API streams, from the public captures cited in
``tests/unit/gemini_captures.py``; the faults are built from them. Split
independence is proven once, by the hypothesis property at the end.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.guard import Outcome, Protocol, Reason, SSEDecoder, StreamGuard, Usage, Verdict
from gateway.guard.annotation import incomplete_message
from gateway.guard.gemini import (
    GEMINI_FINISH,
    GeminiContract,
    gemini_answer_usage,
    gemini_error_event,
    gemini_usage,
    gemini_wants_stream,
    google_status,
    is_gemini_path,
    normalize_gemini_finish,
)
from gateway.guard.verdict import COMPLETE_REASONS, INCOMPLETE_REASONS
from tests.unit.gemini_captures import (
    BLOCK_EVENT,
    BLOCKED,
    BLOCKED_FIRST,
    BLOCKED_TAIL,
    BLOCKED_USAGE,
    CALL,
    CODE,
    EMPTY_PARTS,
    GENAI_ERROR,
    GENAI_TEXT,
    JAPANESE,
    JAPANESE_TEXT,
    JAPANESE_USAGE,
    LEGACY,
    LONG,
    LONG_USAGE,
    OVERLOADED,
    RECITATION,
    SAFETY,
    SHORT,
    SHORT_USAGE,
    STARTED_SHORT,
    THINKING_CALL,
    ev,
    obj_ev,
)
from tests.unit.helpers import BlockCase as Case
from tests.unit.helpers import (
    case_ids,
    check_stops_before_the_rejected_event,
    check_verdict_and_forwarded,
    contract_of,
    driver,
    inserted,
    rejected,
    run_guard,
    whole,
)

# -- built events for the faults ----------------------------------------------------------------


def cand(
    *parts: dict[str, Any], finish: str | None = None, index: int | None = 0, **extra: Any
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": list(parts), "role": "model"}}
    if finish is not None:
        candidate["finishReason"] = finish
    if index is not None:
        candidate["index"] = index
    candidate.update(extra)
    return candidate


def chunk(*candidates: dict[str, Any], usage: dict[str, Any] | None = None, **extra: Any) -> bytes:
    payload: dict[str, Any] = {"candidates": list(candidates)}
    if usage is not None:
        payload["usageMetadata"] = usage
    payload["modelVersion"] = "gemini-2.5-flash"
    payload.update(extra)
    return obj_ev(payload)


def text(value: str, **kw: Any) -> dict[str, Any]:
    return {"text": value, **kw}


def call(name: str = "getWeather", args: Any = None, **kw: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, **kw}
    body["args"] = {"location": "Tokyo"} if args is None else args
    return {"functionCall": body}


def raw(data: str) -> bytes:
    return ev(data)


# -- the driver ---------------------------------------------------------------------------------


drive = driver(GeminiContract)


def bad_shape(name: str, event: bytes, reason: Reason = Reason.INVALID_SHAPE) -> Case:
    """SHORT with ``event`` inserted before its last event, and rejected there."""
    return rejected(name, inserted(SHORT, 2, event), 2, reason, usage=STARTED_SHORT)


FINISHED_FIRST = chunk(cand(text("Hi"), finish="STOP"), usage={"promptTokenCount": 3})


def _cases() -> list[Case]:
    cases = [
        # -- captured, complete ---------------------------------------------------------------
        whole(
            "louter_long",
            LONG,
            Reason.STOP,
            usage=LONG_USAGE,
            raw_finish={0: "STOP"},
            content_events=4,
        ),
        whole(
            "louter_function_call",
            CALL,
            Reason.TOOL_CALLS,
            raw_finish={0: "STOP"},
            usage=Usage(input_tokens=83, output_tokens=14, reasoning_tokens=104),
            content_events=1,
            tool_calls=1,
        ),
        whole("louter_japanese", JAPANESE, Reason.STOP, usage=JAPANESE_USAGE, content_events=2),
        whole(
            "firebase_short_no_index",
            SHORT,
            Reason.STOP,
            usage=SHORT_USAGE,
            raw_finish={0: "STOP"},
            content_events=3,
        ),
        whole(
            "firebase_recitation",
            RECITATION,
            Reason.CONTENT_FILTER,
            raw_finish={0: "RECITATION"},
            usage=Usage(input_tokens=9, output_tokens=261),
            content_events=2,
        ),
        whole(
            "firebase_safety",
            SAFETY,
            Reason.CONTENT_FILTER,
            raw_finish={0: "SAFETY"},
            usage=Usage(input_tokens=10, output_tokens=66),
            content_events=1,
        ),
        whole(
            "firebase_thinking_function_call",
            THINKING_CALL,
            Reason.TOOL_CALLS,
            usage=Usage(input_tokens=38, output_tokens=6, reasoning_tokens=168),
            content_events=3,
            tool_calls=1,
        ),
        whole(
            "firebase_code_execution",
            CODE,
            Reason.STOP,
            usage=Usage(input_tokens=21, output_tokens=126, reasoning_tokens=95),
            content_events=6,
        ),
        whole(
            "firebase_empty_parts_and_image",
            EMPTY_PARTS,
            Reason.STOP,
            usage=Usage(input_tokens=16, output_tokens=1307),
            content_events=6,
        ),
        whole(
            "firebase_prompt_blocked",
            [*BLOCKED, BLOCK_EVENT],
            Reason.CONTENT_FILTER,
            usage=BLOCKED_USAGE,
            content_events=3,
        ),
        whole("prompt_blocked_first", [BLOCKED_FIRST], Reason.CONTENT_FILTER, usage=BLOCKED_USAGE),
        whole(
            "crlf_framing",
            [ev(e.decode()[6:-2], "\r\n") for e in JAPANESE],
            Reason.STOP,
            usage=JAPANESE_USAGE,
        ),
        whole(
            "comments_between_events",
            [SHORT[0], b": keepalive\n\n", SHORT[1], b":\n", SHORT[2]],
            Reason.STOP,
            usage=SHORT_USAGE,
        ),
        # -- what may follow a finish ---------------------------------------------------------
        whole(
            "after_finish_usage_only",
            [
                *SHORT,
                obj_ev({"usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 11}}),
            ],
            Reason.STOP,
            usage=Usage(input_tokens=7, output_tokens=11),
        ),
        whole(
            "after_finish_empty_text_and_signature",
            [*SHORT, chunk(cand(text(""), {"thoughtSignature": "CiIBVKhc"}, finish="STOP"))],
            Reason.STOP,
            usage=SHORT_USAGE,
            content_events=3,
        ),
        whole(
            "after_finish_unspecified_is_still_finished",
            [*SHORT, chunk(cand(finish="FINISH_REASON_UNSPECIFIED"))],
            Reason.STOP,
            usage=SHORT_USAGE,
            raw_finish={0: "STOP"},
        ),
        # -- several candidates ---------------------------------------------------------------
        whole(
            "two_candidates_lowest_index_names_the_reason",
            [
                chunk(cand(text("a"), index=0), cand(text("b"), index=1)),
                chunk(cand(text("c"), finish="STOP", index=1)),
                chunk(cand(finish="MAX_TOKENS", index=0)),
            ],
            Reason.LENGTH,
            raw_finish={0: "MAX_TOKENS", 1: "STOP"},
            content_events=2,
        ),
        whole(
            "function_call_cut_by_max_tokens_is_length",
            [chunk(cand(call(), finish="MAX_TOKENS"))],
            Reason.LENGTH,
            content_events=1,
            tool_calls=1,
        ),
        whole(
            "malformed_function_call_is_other",
            [chunk(cand(finish="MALFORMED_FUNCTION_CALL", finishMessage="Malformed function"))],
            Reason.OTHER,
            raw_finish={0: "MALFORMED_FUNCTION_CALL"},
        ),
        whole(
            "two_function_calls",
            [chunk(cand(call("a", {}), call("b", {"x": [1, {"y": None}]}), finish="STOP"))],
            Reason.TOOL_CALLS,
            content_events=1,
            tool_calls=2,
        ),
        whole(
            "streamed_function_call_arguments",
            [
                chunk(cand({"functionCall": {"name": "get", "willContinue": True}})),
                chunk(
                    cand(
                        {"functionCall": {"partialArgs": [{"jsonPath": "$.q", "stringValue": "x"}]}}
                    )
                ),
                chunk(cand(finish="STOP")),
            ],
            Reason.TOOL_CALLS,
            content_events=2,
            tool_calls=1,
        ),
        # -- incomplete: the stream ended before the finish -----------------------------------
        rejected(
            "missing_done_mid_event",
            SHORT[:1],
            1,
            Reason.MISSING_DONE,
            tail=SHORT[1][: len(SHORT[1]) // 2],
            usage=STARTED_SHORT,
        ),
        rejected("missing_done_no_finish", SHORT[:2], 2, Reason.MISSING_DONE, usage=STARTED_SHORT),
        rejected("missing_done_empty", [], 0, Reason.MISSING_DONE),
        rejected(
            "missing_done_usage_only",
            [obj_ev({"usageMetadata": {"promptTokenCount": 7}})],
            1,
            Reason.MISSING_DONE,
            usage=STARTED_SHORT,
        ),
        rejected(
            "missing_done_unspecified_finish",
            [*SHORT[:2], chunk(cand(text("x"), finish="FINISH_REASON_UNSPECIFIED"))],
            3,
            Reason.MISSING_DONE,
            usage=STARTED_SHORT,
        ),
        rejected(
            "missing_done_one_candidate_unfinished",
            [chunk(cand(text("a"), index=0), cand(text("b"), finish="STOP", index=1))],
            1,
            Reason.MISSING_DONE,
            raw_finish={1: "STOP"},
        ),
        rejected(
            "missing_done_prompt_block_unterminated",
            BLOCKED,
            3,
            Reason.MISSING_DONE,
            tail=BLOCKED_TAIL,
            usage=BLOCKED_USAGE,
        ),
        # -- the upstream's own error ---------------------------------------------------------
        whole("upstream_error_genai_fixture", [GENAI_TEXT, GENAI_ERROR], Reason.UPSTREAM_ERROR),
        whole("upstream_error_first", [OVERLOADED], Reason.UPSTREAM_ERROR),
        whole(
            "upstream_error_after_text",
            [*SHORT[:2], OVERLOADED],
            Reason.UPSTREAM_ERROR,
            usage=STARTED_SHORT,
        ),
        rejected(
            "error_not_first_is_replaced",
            [SHORT[0], raw('{"candidates": [], "error": {"code": 500, "message": "x"}}')],
            1,
            Reason.UPSTREAM_ERROR,
            usage=STARTED_SHORT,
        ),
        rejected(
            "error_without_integer_code_is_replaced",
            [SHORT[0], raw('{"error": {"code": "500", "message": "x"}}')],
            1,
            Reason.UPSTREAM_ERROR,
            usage=STARTED_SHORT,
        ),
        rejected(
            "error_not_an_object_is_replaced",
            [raw('{"error": "Internal error"}')],
            0,
            Reason.UPSTREAM_ERROR,
        ),
        # -- invalid events -------------------------------------------------------------------
        rejected(
            "invalid_json_genai_fixture",
            [GENAI_TEXT, raw('{"error": bad_json}')],
            1,
            Reason.INVALID_JSON,
        ),
        bad_shape("invalid_json_cut", raw(SHORT[2].decode()[6:-4]), reason=Reason.INVALID_JSON),
        bad_shape("invalid_json_done", raw("[DONE]"), reason=Reason.INVALID_JSON),
        bad_shape("not_an_object", raw('["candidates"]')),
        bad_shape("candidates_not_a_list", raw('{"candidates": {"index": 0}}')),
        bad_shape("candidate_not_an_object", raw('{"candidates": ["text"]}')),
        bad_shape("index_negative", chunk(cand(text("x"), index=-1))),
        bad_shape("index_not_an_integer", chunk(cand(text("x"), index="0"))),
        bad_shape("index_bool", chunk(cand(text("x"), index=True))),
        bad_shape("content_not_an_object", raw('{"candidates": [{"content": "x"}]}')),
        bad_shape("parts_not_a_list", raw('{"candidates": [{"content": {"parts": {}}}]}')),
        bad_shape("part_not_an_object", raw('{"candidates": [{"content": {"parts": ["x"]}}]}')),
        bad_shape("text_not_a_string", chunk(cand({"text": 7}))),
        bad_shape("finish_not_a_string", chunk(cand(text("x"), finishReason=1))),
        bad_shape("usage_not_an_object", raw('{"candidates": [], "usageMetadata": 7}')),
        bad_shape("feedback_not_an_object", raw('{"promptFeedback": []}')),
        bad_shape("block_reason_not_a_string", raw('{"promptFeedback": {"blockReason": 2}}')),
        bad_shape("function_call_not_an_object", chunk(cand({"functionCall": "f()"}))),
        bad_shape("function_name_not_a_string", chunk(cand({"functionCall": {"name": 1}}))),
        bad_shape(
            "function_args_not_an_object",
            chunk(cand(call(args='{"location": "Tok'))),
            reason=Reason.INVALID_TOOL_ARGUMENTS,
        ),
        bad_shape(
            "function_args_a_list",
            chunk(cand(call(args=[1]))),
            reason=Reason.INVALID_TOOL_ARGUMENTS,
        ),
        # -- content after a finish -----------------------------------------------------------
        rejected(
            "text_after_finish",
            [*SHORT, chunk(cand(text("more")))],
            3,
            Reason.CONTENT_AFTER_FINISH,
            usage=SHORT_USAGE,
            raw_finish={0: "STOP"},
        ),
        rejected(
            "text_after_finish_no_index",
            [*SHORT, chunk(cand(text("more"), index=None))],
            3,
            Reason.CONTENT_AFTER_FINISH,
            usage=SHORT_USAGE,
        ),
        rejected(
            "call_after_finish",
            [*CALL, chunk(cand(call()))],
            1,
            Reason.CONTENT_AFTER_FINISH,
            usage=Usage(input_tokens=83, output_tokens=14, reasoning_tokens=104),
            tool_calls=1,
        ),
        rejected(
            "image_after_finish",
            [
                FINISHED_FIRST,
                chunk(cand({"inlineData": {"mimeType": "image/png", "data": "iVBO"}})),
            ],
            1,
            Reason.CONTENT_AFTER_FINISH,
            usage=Usage(input_tokens=3),
        ),
        rejected(
            "content_after_block",
            [BLOCKED_FIRST, *SHORT],
            1,
            Reason.CONTENT_AFTER_FINISH,
            usage=BLOCKED_USAGE,
        ),
        rejected(
            "gemini_pro_finish_on_every_chunk",
            LEGACY,
            1,
            Reason.CONTENT_AFTER_FINISH,
            raw_finish={0: "STOP"},
        ),
    ]
    return cases


CASES = _cases()


# -- the table ------------------------------------------------------------------------------


def test_case_names_are_unique() -> None:
    assert len(set(case_ids(CASES))) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_verdict_and_forwarded_bytes(case: Case) -> None:
    check_verdict_and_forwarded(case, drive)


#: Streams stopped at an event (the others end with the body: a cut is not a rejection).
REJECTED = [c for c in CASES if c.forwarded < len(c.blocks) and c.reason is not Reason.MISSING_DONE]
#: The upstream's own error events, forwarded.
UPSTREAM_ERRORS = [c for c in CASES if c.reason is Reason.UPSTREAM_ERROR and c not in REJECTED]


@pytest.mark.parametrize("case", REJECTED, ids=case_ids(REJECTED))
def test_the_rejected_event_is_never_forwarded(case: Case) -> None:
    check_stops_before_the_rejected_event(case, drive)


@pytest.mark.parametrize("case", UPSTREAM_ERRORS, ids=case_ids(UPSTREAM_ERRORS))
def test_the_upstream_error_event_is_forwarded_and_ends_the_stream(case: Case) -> None:
    out, verdict, guard = drive(case.stream + SHORT[0])  # nothing after the error is read
    assert out == case.stream
    assert verdict.error_forwarded
    assert guard.done


def test_missing_done_holds_back_an_unfinished_event() -> None:
    out, verdict, _ = drive(b"".join(BLOCKED) + BLOCKED_TAIL)
    assert verdict.reason is Reason.MISSING_DONE
    assert out == b"".join(BLOCKED)  # the unterminated block never reaches the client


# -- the finish table ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw_finish", "reason"),
    [
        ("STOP", Reason.STOP),
        ("MAX_TOKENS", Reason.LENGTH),
        ("SAFETY", Reason.CONTENT_FILTER),
        ("RECITATION", Reason.CONTENT_FILTER),
        ("BLOCKLIST", Reason.CONTENT_FILTER),
        ("PROHIBITED_CONTENT", Reason.CONTENT_FILTER),
        ("SPII", Reason.CONTENT_FILTER),
        ("IMAGE_SAFETY", Reason.CONTENT_FILTER),
        ("IMAGE_PROHIBITED_CONTENT", Reason.CONTENT_FILTER),
        ("LANGUAGE", Reason.OTHER),
        ("OTHER", Reason.OTHER),
        ("MALFORMED_FUNCTION_CALL", Reason.OTHER),
        ("UNEXPECTED_TOOL_CALL", Reason.OTHER),
        ("NO_IMAGE", Reason.OTHER),
        ("A_REASON_FROM_THE_FUTURE", Reason.OTHER),
        ("stop", Reason.STOP),
    ],
)
def test_finish_reasons(raw_finish: str, reason: Reason) -> None:
    assert normalize_gemini_finish(raw_finish) is reason
    _, verdict, _ = drive(chunk(cand(text("x"), finish=raw_finish)))
    assert (verdict.outcome, verdict.reason) == (Outcome.COMPLETE, reason)
    assert verdict.finish_reasons == {0: reason}
    assert verdict.raw_finish_reasons == {0: raw_finish}


def test_the_finish_table_speaks_the_bounded_vocabulary() -> None:
    assert set(GEMINI_FINISH.values()) <= COMPLETE_REASONS
    assert all(name == name.upper() for name in GEMINI_FINISH)


def test_only_stop_with_a_function_call_is_tool_calls() -> None:
    _, verdict, _ = drive(
        chunk(cand(call(), finish="STOP"), cand(text("x"), finish="STOP", index=1))
    )
    assert verdict.finish_reasons == {0: Reason.TOOL_CALLS, 1: Reason.STOP}
    assert verdict.reason is Reason.TOOL_CALLS


# -- usage, model, text -------------------------------------------------------------------------


def test_every_usage_report_replaces_the_last() -> None:
    first = {"promptTokenCount": 40, "cachedContentTokenCount": 32, "thoughtsTokenCount": 9}
    last = {"promptTokenCount": 40, "candidatesTokenCount": 5, "totalTokenCount": 45}
    _, verdict, _ = drive(
        chunk(cand(text("a")), usage=first) + chunk(cand(text("b"), finish="STOP"), usage=last)
    )
    assert verdict.usage == Usage(input_tokens=40, output_tokens=5)
    _, verdict, _ = drive(chunk(cand(text("a"), finish="STOP"), usage=first))
    assert verdict.usage == Usage(input_tokens=40, cached_input_tokens=32, reasoning_tokens=9)


def test_usage_never_reported_is_unknown() -> None:
    _, verdict, _ = drive(b"".join([GENAI_TEXT, chunk(cand(finish="STOP"))]))
    assert verdict.usage is None


def test_a_rejected_event_reports_no_usage() -> None:
    bad = chunk(cand(text("x"), index=-1), usage={"promptTokenCount": 99})
    _, verdict, _ = drive(SHORT[0] + bad)
    assert verdict.usage == STARTED_SHORT


def test_usage_readers() -> None:
    raw_usage = {
        "promptTokenCount": 10,
        "candidatesTokenCount": 4,
        "cachedContentTokenCount": 8,
        "thoughtsTokenCount": 3,
        "totalTokenCount": 17,
    }
    assert gemini_usage(raw_usage) == Usage(10, 4, 8, 3)
    assert gemini_usage({"promptTokenCount": -1, "candidatesTokenCount": True}) == Usage()
    assert gemini_usage([1]) is None
    assert gemini_answer_usage({"candidates": [], "usageMetadata": raw_usage}) == Usage(10, 4, 8, 3)
    assert gemini_answer_usage({"usage": {"prompt_tokens": 1}}) is None
    assert gemini_answer_usage([]) is None
    # streamGenerateContent without alt=sse: one JSON array, the last report counts
    array = [
        {"candidates": [], "usageMetadata": {"promptTokenCount": 10}},
        {"candidates": [], "usageMetadata": raw_usage},
        {"candidates": []},
        "junk",
    ]
    assert gemini_answer_usage(array) == Usage(10, 4, 8, 3)


def test_the_model_is_the_first_model_version() -> None:
    _, _, guard = drive(b"".join(THINKING_CALL))
    assert contract_of(guard, GeminiContract).model == "gemini-2.5-flash"
    _, _, guard = drive(b"".join(SHORT))
    assert contract_of(guard, GeminiContract).model == "gemini-3.1-flash-lite"
    _, _, guard = drive(b"".join([GENAI_TEXT, chunk(cand(finish="STOP"))]))
    assert contract_of(guard, GeminiContract).model == "gemini-2.5-flash"


def test_keep_text_leaves_thoughts_out_and_reads_function_calls() -> None:
    _, _, guard = drive(b"".join(JAPANESE), keep_text=True)
    assert contract_of(guard, GeminiContract).text() == JAPANESE_TEXT
    _, verdict, guard = drive(b"".join(THINKING_CALL), keep_text=True)
    contract = contract_of(guard, GeminiContract)
    assert contract.text() == ""
    assert contract.tool_call_arguments() == [("", "now", "{}")]
    assert verdict.content_chars > 500  # the thought summaries are output too
    _, _, guard = drive(b"".join(CALL))
    assert contract_of(guard, GeminiContract).tool_call_arguments() == [
        ("", "getWeather", '{"location": "Tokyo"}')
    ]
    assert contract_of(guard, GeminiContract).text(3) == ""
    assert contract_of(guard, GeminiContract).tool_call_arguments(3) == []
    _, _, guard = drive(chunk(cand(call(id="call_1"), finish="STOP")))
    assert contract_of(guard, GeminiContract).tool_call_arguments()[0][0] == "call_1"


def test_content_chars_count_text() -> None:
    _, verdict, _ = drive(b"".join(JAPANESE))
    assert verdict.content_chars == len(JAPANESE_TEXT)


def test_a_blocked_prompt_is_remembered() -> None:
    _, verdict, guard = drive(BLOCKED_FIRST)
    assert contract_of(guard, GeminiContract).block_reason == "SAFETY"
    assert verdict.finish_reasons == {}
    unblocked = obj_ev({"promptFeedback": {"blockReason": "BLOCKED_REASON_UNSPECIFIED"}})
    _, verdict, guard = drive(unblocked + b"".join(SHORT))
    assert contract_of(guard, GeminiContract).block_reason is None
    assert verdict.reason is Reason.STOP


# -- limits ---------------------------------------------------------------------------------------


def test_limit_exceeded_by_event_budget() -> None:
    big = chunk(cand(text("x" * 5000)))
    stream = SHORT[0] + big + SHORT[2]
    out, verdict, _ = drive(stream, decoder=SSEDecoder(max_event_bytes=1024))
    assert verdict.reason is Reason.LIMIT_EXCEEDED
    assert out == SHORT[0]


def test_limit_exceeded_by_stream_budget() -> None:
    guard = StreamGuard(GeminiContract(), max_stream_bytes=len(SHORT[0]) + 5)
    out = b"".join(guard.feed(e) for e in SHORT)
    assert guard.verdict is not None
    assert guard.verdict.reason is Reason.LIMIT_EXCEEDED
    assert out == SHORT[0]


# -- requests and the error event ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "gemini", "stream"),
    [
        ("/v1beta/models/gemini-2.5-flash:streamGenerateContent", True, True),
        ("/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse", True, True),
        ("/gemini/v1beta/models/gemini-2.5-flash:generateContent", True, False),
        ("/v1/models/gemini-pro:generateContent/", True, False),
        ("/v1beta/tunedModels/my-model:streamGenerateContent?alt=sse", True, True),
        ("/v1beta/models/gemini-2.5-flash:countTokens", False, False),
        ("/v1beta/models/gemini-2.5-flash:batchGenerateContent", False, False),
        ("/v1/chat/completions", False, False),
        ("/v1/models?x=:streamGenerateContent", False, False),
    ],
)
def test_request_recognition(path: str, gemini: bool, stream: bool) -> None:
    assert is_gemini_path(path) is gemini
    assert gemini_wants_stream(path) is stream


@pytest.mark.parametrize("reason", sorted(INCOMPLETE_REASONS), ids=str)
def test_error_event_is_googles_error_object(reason: Reason) -> None:
    message = incomplete_message(Protocol.GEMINI, reason, "req-7")
    event = gemini_error_event(reason, message, "req-7")
    assert event.startswith(b'data: {"error":{')
    assert event.endswith(b"}}\n\n")
    assert event.count(b"\n") == 2  # one data line, one blank line
    body = json.loads(event[len(b"data: ") :])
    error = body["error"]
    assert list(body) == ["error"]
    code, status = google_status(reason)
    assert error["code"] == code
    assert type(error["code"]) is int
    assert 400 <= code < 600
    assert error["status"] == status
    assert error["message"] == message
    info, request = error["details"]
    assert info == {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": str(reason).upper(),
        "domain": "gateway",
        "metadata": {"reason": str(reason)},
    }
    assert request == {"@type": "type.googleapis.com/google.rpc.RequestInfo", "requestId": "req-7"}


def test_error_statuses() -> None:
    assert google_status(Reason.MISSING_DONE) == (503, "UNAVAILABLE")
    assert google_status(Reason.IDLE_TIMEOUT) == (504, "DEADLINE_EXCEEDED")
    assert google_status(Reason.INVALID_JSON) == (500, "INTERNAL")
    assert google_status(Reason.LIMIT_EXCEEDED) == (429, "RESOURCE_EXHAUSTED")
    assert google_status(Reason.CLIENT_DISCONNECT) == (499, "CANCELLED")


def test_a_rejected_event_leaves_the_error_to_the_gateway() -> None:
    """An error the SDK would not raise on is withheld: the gateway's own takes its place."""
    stream = SHORT[0] + raw('{"candidates": [], "error": {"code": 500}}')
    out, verdict, _ = drive(stream)
    assert out == SHORT[0]
    assert not verdict.error_forwarded


# -- same bytes, any partition, same verdict ----------------------------------------------------


_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), max_codepoint=0x1F9FF), max_size=8
)
_PIECES = st.one_of(
    _TEXT.map(lambda t: chunk(cand(text(t)))),
    _TEXT.map(lambda t: chunk(cand(text(t), index=1))),
    _TEXT.map(lambda t: chunk(cand(text(t, thought=True)))),
    st.sampled_from(
        [
            *SHORT,
            *JAPANESE,
            *CALL,
            RECITATION[-1],
            BLOCKED_FIRST,
            GENAI_ERROR,
            OVERLOADED,
            chunk(cand(finish="STOP")),
            chunk(cand(finish="MAX_TOKENS", index=1)),
            chunk(cand(call(), finish="STOP")),
            chunk(cand(call(args="x"))),
            chunk(cand(text("x"), index="0")),
            obj_ev({"usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 2}}),
            raw('{"candidates": [], "error": {"code": 500}}'),
            raw('{"candidates": [{"content": {"parts": [{"text": "cut'),
            raw("[DONE]"),
            b": keep-alive\n\n",
        ]
    ),
)


@st.composite
def gemini_streams(draw: st.DrawFn) -> bytes:
    stream = b"".join(draw(st.lists(_PIECES, min_size=1, max_size=8)))
    if draw(st.booleans()):
        stream = stream[: draw(st.integers(0, len(stream)))]  # the upstream was cut
    if draw(st.booleans()):
        stream = stream.replace(b"\n", b"\r\n")  # Google frames with CRLF
    return stream


@st.composite
def partitions(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def _result(chunks: list[bytes], limit: int | None) -> tuple[bytes, Verdict]:
    run = run_guard(GeminiContract(), chunks, max_stream_bytes=limit)
    return run.output, run.verdict


@given(
    data=st.data(),
    stream=gemini_streams(),
    limit=st.one_of(st.none(), st.integers(0, 2000)),
)
def test_the_verdict_does_not_depend_on_how_the_bytes_were_split(
    data: st.DataObject, stream: bytes, limit: int | None
) -> None:
    whole_result = _result([stream], limit)
    assert _result(data.draw(partitions(stream)), limit) == whole_result
    assert _result([bytes([b]) for b in stream], limit) == whole_result
    output, verdict = whole_result
    assert stream.startswith(output)
    assert verdict.reason in (COMPLETE_REASONS if verdict.complete else INCOMPLETE_REASONS)
