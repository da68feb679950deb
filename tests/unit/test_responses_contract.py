"""ResponsesContract driven through StreamGuard: verdicts, forwarded bytes, annotation.

Fixtures follow the event shapes of openai-python's
``src/openai/types/responses/*_event.py`` and the API reference "Streaming
events": ``event: <type>`` plus one compact ``data:`` line whose ``type``
repeats it and whose ``sequence_number`` counts up from 0.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.guard import (
    Outcome,
    Reason,
    SSEDecoder,
    StreamGuard,
    Usage,
)
from gateway.guard.responses import ResponsesContract
from tests.unit.helpers import BlockCase as Case
from tests.unit.helpers import (
    case_ids,
    check_every_partition,
    check_random_partition,
    check_stops_before_the_rejected_event,
    check_verdict_and_forwarded,
    contract_of,
    cut,
    driver,
    inserted,
    raw_block,
    rejected_cases,
    upstream_error_cases,
)

RESP_ID = "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b"
MSG_ID = "msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b"
RS_ID = "rs_67ccd2bf1b8c8190a5b9f7f5d1e9c3a60bb6a6b452d3795b"
FC_ID = "fc_67ccd3c6e3a48190a6b2f1f3a8e1c2d40bb6a6b452d3795b"
CALL_ID = "call_12xJ8HLdH9fP7Kb3ebOzsF4u"

USAGE = {
    "input_tokens": 37,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 11,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 48,
}


# -- fixture builders ------------------------------------------------------------


def response_obj(
    status: str,
    output: Iterable[dict[str, Any]] = (),
    usage: dict[str, Any] | None = None,
    incomplete_details: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": RESP_ID,
        "object": "response",
        "created_at": 1741484430,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": incomplete_details,
        "instructions": None,
        "max_output_tokens": None,
        "model": "gpt-4.1-2025-04-14",
        "output": list(output),
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": True,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": {},
    }


def block(event: str | None, payload: dict[str, Any]) -> bytes:
    return raw_block(event, json.dumps(payload, separators=(",", ":")))


class Seq:
    """Builds typed events with consecutive sequence numbers."""

    def __init__(self, start: int = 0, *, numbered: bool = True) -> None:
        self.n = start
        self.numbered = numbered

    def __call__(self, kind: str, **fields: Any) -> bytes:
        payload: dict[str, Any] = {"type": kind, **fields}
        if self.numbered:
            payload["sequence_number"] = self.n
            self.n += 1
        return block(kind, payload)


def message_item(status: str, text: str | None = None) -> dict[str, Any]:
    content = (
        []
        if text is None
        else [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}]
    )
    return {
        "id": MSG_ID,
        "type": "message",
        "status": status,
        "content": content,
        "role": "assistant",
    }


def function_item(status: str, arguments: str) -> dict[str, Any]:
    return {
        "id": FC_ID,
        "type": "function_call",
        "status": status,
        "arguments": arguments,
        "call_id": CALL_ID,
        "name": "get_weather",
    }


def head(s: Seq) -> list[bytes]:
    return [
        s("response.created", response=response_obj("in_progress")),
        s("response.in_progress", response=response_obj("in_progress")),
    ]


def text_events(s: Seq, pieces: Iterable[str], index: int = 0) -> list[bytes]:
    pieces = list(pieces)
    text = "".join(pieces)
    where = {"item_id": MSG_ID, "output_index": index, "content_index": 0}
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
    return [
        s("response.output_item.added", output_index=index, item=message_item("in_progress")),
        s("response.content_part.added", **where, part=part),
        *[s("response.output_text.delta", **where, delta=p, logprobs=[]) for p in pieces],
        s("response.output_text.done", **where, text=text, logprobs=[]),
        s("response.content_part.done", **where, part={**part, "text": text}),
        s("response.output_item.done", output_index=index, item=message_item("completed", text)),
    ]


def text_stream(s: Seq | None = None) -> list[bytes]:
    s = s or Seq()
    return [
        *head(s),
        *text_events(s, ["Hi", " there", "!"]),
        s(
            "response.completed",
            response=response_obj(
                "completed", [message_item("completed", "Hi there!")], usage=USAGE
            ),
        ),
    ]


def reasoning_stream() -> list[bytes]:
    s = Seq()
    summary = {"item_id": RS_ID, "output_index": 0, "summary_index": 0}
    rs_item = {"id": RS_ID, "type": "reasoning", "summary": []}
    done_item = {
        "id": RS_ID,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "**Greeting** The user says hi."}],
    }
    usage = {
        "input_tokens": 2048,
        "input_tokens_details": {"cached_tokens": 1024},
        "output_tokens": 200,
        "output_tokens_details": {"reasoning_tokens": 128},
        "total_tokens": 2248,
    }
    return [
        *head(s),
        s("response.output_item.added", output_index=0, item=rs_item),
        s(
            "response.reasoning_summary_part.added",
            **summary,
            part={"type": "summary_text", "text": ""},
        ),
        s("response.reasoning_summary_text.delta", **summary, delta="**Greeting** "),
        s("response.reasoning_summary_text.delta", **summary, delta="The user says hi."),
        s("response.reasoning_summary_text.done", **summary, text="**Greeting** The user says hi."),
        s(
            "response.reasoning_summary_part.done",
            **summary,
            part={"type": "summary_text", "text": "x"},
        ),
        s("response.output_item.done", output_index=0, item=done_item),
        *text_events(s, ["Hello!"], index=1),
        s(
            "response.completed",
            response=response_obj(
                "completed", [done_item, message_item("completed", "Hello!")], usage=usage
            ),
        ),
    ]


def function_events(s: Seq, pieces: Iterable[str], *, done: str | None = None) -> list[bytes]:
    pieces = list(pieces)
    arguments = "".join(pieces) if done is None else done
    where = {"item_id": FC_ID, "output_index": 0}
    return [
        s("response.output_item.added", output_index=0, item=function_item("in_progress", "")),
        *[s("response.function_call_arguments.delta", **where, delta=p) for p in pieces],
        s("response.function_call_arguments.done", **where, arguments=arguments),
        s("response.output_item.done", output_index=0, item=function_item("completed", arguments)),
    ]


ARG_PIECES = ['{"', "location", '":"', "Paris", ', France"}']


def function_stream() -> list[bytes]:
    s = Seq()
    args = "".join(ARG_PIECES)
    return [
        *head(s),
        *function_events(s, ARG_PIECES),
        s(
            "response.completed",
            response=response_obj("completed", [function_item("completed", args)], usage=USAGE),
        ),
    ]


def refusal_stream() -> list[bytes]:
    s = Seq()
    where = {"item_id": MSG_ID, "output_index": 0, "content_index": 0}
    refusal = "I can't help with that."
    item = {**message_item("completed"), "content": [{"type": "refusal", "refusal": refusal}]}
    return [
        *head(s),
        s("response.output_item.added", output_index=0, item=message_item("in_progress")),
        s("response.content_part.added", **where, part={"type": "refusal", "refusal": ""}),
        s("response.refusal.delta", **where, delta="I can't help"),
        s("response.refusal.delta", **where, delta=" with that."),
        s("response.refusal.done", **where, refusal=refusal),
        s("response.content_part.done", **where, part={"type": "refusal", "refusal": refusal}),
        s("response.output_item.done", output_index=0, item=item),
        s("response.completed", response=response_obj("completed", [item], usage=USAGE)),
    ]


def incomplete_stream(details: dict[str, Any] | None) -> list[bytes]:
    s = Seq()
    events = [*head(s), *text_events(s, ["Once upon", " a time"])]
    text_item = message_item("incomplete", "Once upon a time")
    events.append(
        s(
            "response.incomplete",
            response=response_obj(
                "incomplete", [text_item], usage=USAGE, incomplete_details=details
            ),
        )
    )
    return events


def unknown_type_stream() -> list[bytes]:
    """A type this contract does not know (the API adds new ones) is relayed and ignored."""
    s = Seq()
    prefix = head(s)
    future = s("response.future_feature.progress", item_id="ff_1", output_index=0, hint="x")
    return [*prefix, future, *text_stream(Seq(s.n))[2:]]


def unnumbered_stream() -> list[bytes]:
    """An OpenAI-compatible server that sends no sequence numbers (allowed)."""
    return text_stream(Seq(numbered=False))


def commented_stream() -> list[bytes]:
    """A proxy in between adds SSE comments; they are relayed as they are."""
    events = text_stream()
    return [events[0], b": OPENROUTER PROCESSING\n\n", *events[1:4], b": keepalive\n", *events[4:]]


def failed_stream() -> list[bytes]:
    s = Seq()
    error = {"code": "server_error", "message": "The model produced invalid content."}
    usage = {**USAGE, "output_tokens": 3}
    return [
        *head(s),
        *text_events(s, ["Partial"])[:3],
        s("response.failed", response=response_obj("failed", usage=usage, error=error)),
    ]


def error_nested_stream() -> list[bytes]:
    s = Seq()
    events = [*head(s), *text_events(s, ["Par"])[:3]]
    error = {
        "type": "insufficient_quota",
        "code": "credit_balance_exhausted",
        "message": "You have no credits remaining.",
        "param": None,
    }
    return [*events, block("error", {"type": "error", "error": error, "sequence_number": s.n})]


def error_flat_stream() -> list[bytes]:
    s = Seq()
    events = [*head(s), *text_events(s, ["Par"])[:3]]
    return [
        *events,
        s("error", code="ERR_SOMETHING", message="Something went wrong", param=None),
    ]


# -- the driver --------------------------------------------------------------------


drive = driver(ResponsesContract)


def _cases() -> list[Case]:
    usage = Usage(input_tokens=37, output_tokens=11, cached_input_tokens=0, reasoning_tokens=0)
    text = text_stream()
    n_text = len(text)
    cases = [
        Case(
            "text", text, n_text, Reason.STOP, usage=usage, raw_finish={0: "stop"}, content_events=3
        ),
        Case(
            "reasoning",
            reasoning_stream(),
            len(reasoning_stream()),
            Reason.STOP,
            usage=Usage(2048, 200, 1024, 128),
            raw_finish={0: "stop"},
            content_events=3,
        ),
        Case(
            "function_call",
            function_stream(),
            len(function_stream()),
            Reason.TOOL_CALLS,
            usage=usage,
            raw_finish={0: "tool_calls"},
            content_events=5,
            tool_calls=1,
        ),
        Case(
            "refusal",
            refusal_stream(),
            len(refusal_stream()),
            Reason.STOP,
            usage=usage,
            raw_finish={0: "stop"},
            content_events=2,
        ),
        Case(
            "incomplete_length",
            incomplete_stream({"reason": "max_output_tokens"}),
            len(incomplete_stream(None)),
            Reason.LENGTH,
            usage=usage,
            raw_finish={0: "max_output_tokens"},
        ),
        Case(
            "incomplete_content_filter",
            incomplete_stream({"reason": "content_filter"}),
            len(incomplete_stream(None)),
            Reason.CONTENT_FILTER,
            usage=usage,
            raw_finish={0: "content_filter"},
        ),
        Case(
            "incomplete_other",
            incomplete_stream({"reason": "steered"}),
            len(incomplete_stream(None)),
            Reason.OTHER,
            usage=usage,
            raw_finish={0: "steered"},
        ),
        Case(
            "incomplete_no_details",
            incomplete_stream(None),
            len(incomplete_stream(None)),
            Reason.OTHER,
            usage=usage,
            raw_finish={0: "incomplete"},
        ),
        Case(
            "unknown_type",
            unknown_type_stream(),
            len(unknown_type_stream()),
            Reason.STOP,
            usage=usage,
        ),
        Case("unnumbered", unnumbered_stream(), n_text, Reason.STOP, usage=usage),
        Case("comments", commented_stream(), len(commented_stream()), Reason.STOP, usage=usage),
        # -- incomplete -----------------------------------------------------------------
        Case("missing_done", text[:6], 6, Reason.MISSING_DONE, tail=text[6][: len(text[6]) // 2]),
        Case("missing_done_after_item", text[:-1], n_text - 1, Reason.MISSING_DONE),
        Case("missing_done_empty", [], 0, Reason.MISSING_DONE),
        Case(
            "done_sentinel",
            [*text[:-1], raw_block(None, "[DONE]")],
            n_text - 1,
            Reason.MISSING_DONE,
        ),
        Case(
            "upstream_failed",
            failed_stream(),
            len(failed_stream()),
            Reason.UPSTREAM_ERROR,
            usage=Usage(37, 3, 0, 0),
        ),
        Case(
            "upstream_error_nested",
            error_nested_stream(),
            len(error_nested_stream()),
            Reason.UPSTREAM_ERROR,
        ),
        Case(
            "upstream_error_flat",
            error_flat_stream(),
            len(error_flat_stream()),
            Reason.UPSTREAM_ERROR,
        ),
        Case(
            "upstream_error_not_json",
            [*text[:4], raw_block("error", "overloaded")],
            5,
            Reason.UPSTREAM_ERROR,
        ),
        Case(
            "invalid_json",
            [
                *text[:5],
                raw_block(
                    "response.output_text.delta",
                    '{"type":"response.output_text.delta","delta":"x","sequence_number":5',
                ),
                *text[5:],
            ],
            5,
            Reason.INVALID_JSON,
        ),
        Case(
            "not_an_object",
            inserted(text, 5, raw_block("response.output_text.delta", "[1]")),
            5,
            Reason.INVALID_SHAPE,
        ),
        Case(
            "no_type",
            inserted(
                text, 5, block("response.output_text.delta", {"delta": "x", "sequence_number": 5})
            ),
            5,
            Reason.INVALID_SHAPE,
        ),
        Case(
            "name_mismatch",
            inserted(
                text,
                5,
                block(
                    "response.refusal.delta",
                    {"type": "response.output_text.delta", "delta": "x", "sequence_number": 99},
                ),
            ),
            5,
            Reason.INVALID_SHAPE,
        ),
        Case(
            "sequence_repeated",
            inserted(
                text,
                5,
                block(
                    "response.output_text.delta",
                    {
                        "type": "response.output_text.delta",
                        "delta": "x",
                        "output_index": 0,
                        "sequence_number": 4,
                    },
                ),
            ),
            5,
            Reason.INVALID_SHAPE,
        ),
        Case(
            "sequence_decreasing",
            inserted(
                text,
                5,
                block(
                    "response.output_text.delta",
                    {
                        "type": "response.output_text.delta",
                        "delta": "x",
                        "output_index": 0,
                        "sequence_number": 1,
                    },
                ),
            ),
            5,
            Reason.INVALID_SHAPE,
        ),
        Case(
            "sequence_not_int",
            inserted(
                text,
                5,
                block(
                    "response.output_text.delta",
                    {
                        "type": "response.output_text.delta",
                        "delta": "x",
                        "output_index": 0,
                        "sequence_number": "5",
                    },
                ),
            ),
            5,
            Reason.INVALID_SHAPE,
        ),
        Case(
            "delta_not_string",
            inserted(
                text,
                5,
                block(
                    "response.output_text.delta",
                    {
                        "type": "response.output_text.delta",
                        "delta": None,
                        "output_index": 0,
                        "sequence_number": 99,
                    },
                ),
            ),
            5,
            Reason.INVALID_SHAPE,
        ),
        Case(
            "completed_not_object",
            [
                *text[:-1],
                block(
                    "response.completed",
                    {"type": "response.completed", "response": "done", "sequence_number": 99},
                ),
            ],
            n_text - 1,
            Reason.INVALID_SHAPE,
        ),
        Case(
            "usage_not_object",
            [
                *text[:-1],
                block(
                    "response.completed",
                    {
                        "type": "response.completed",
                        "sequence_number": 99,
                        "response": response_obj("completed", usage=None) | {"usage": 48},
                    },
                ),
            ],
            n_text - 1,
            Reason.INVALID_SHAPE,
        ),
        Case(
            "item_not_object",
            inserted(
                text,
                2,
                block(
                    "response.output_item.added",
                    {
                        "type": "response.output_item.added",
                        "output_index": 0,
                        "item": None,
                        "sequence_number": 2,
                    },
                ),
            ),
            2,
            Reason.INVALID_SHAPE,
        ),
        # text for output item 0 after its response.output_item.done (sequence 10)
        Case(
            "text_after_item_done",
            [
                *text[:-1],
                block(
                    "response.output_text.delta",
                    {
                        "type": "response.output_text.delta",
                        "item_id": MSG_ID,
                        "output_index": 0,
                        "content_index": 0,
                        "delta": "more",
                        "logprobs": [],
                        "sequence_number": 11,
                    },
                ),
                text[-1],
            ],
            n_text - 1,
            Reason.CONTENT_AFTER_FINISH,
        ),
    ]
    cases += _tool_cases()
    return cases


def _tool_cases() -> list[Case]:
    s = Seq()
    events = [*head(s), *function_events(s, ARG_PIECES)]
    # arguments after response.function_call_arguments.done (events[8], sequence 8)
    late = block(
        "response.function_call_arguments.delta",
        {
            "type": "response.function_call_arguments.delta",
            "item_id": FC_ID,
            "output_index": 0,
            "delta": "x",
            "sequence_number": 9,
        },
    )
    after_done = [*events[:9], late]

    s = Seq()
    truncated = ['{"location":', '"Par']
    bad_done = [*head(s), *function_events(s, truncated)]

    # no .done event; the assembled deltas are checked at response.completed
    s = Seq()
    no_done = [
        *head(s),
        s("response.output_item.added", output_index=0, item=function_item("in_progress", "")),
        *[
            s("response.function_call_arguments.delta", item_id=FC_ID, output_index=0, delta=p)
            for p in truncated
        ],
        s("response.completed", response=response_obj("completed", usage=USAGE)),
    ]

    # the item's own arguments at response.output_item.done are checked
    s = Seq()
    bad_item = [
        *head(s),
        s("response.output_item.added", output_index=0, item=function_item("in_progress", "")),
        s("response.output_item.done", output_index=0, item=function_item("completed", '{"a"')),
    ]

    # the output of response.completed names a call whose arguments are not JSON
    s = Seq()
    bad_output = [
        *head(s),
        s(
            "response.completed",
            response=response_obj("completed", [function_item("completed", "{")], usage=USAGE),
        ),
    ]
    return [
        Case("arguments_after_done", after_done, 9, Reason.CONTENT_AFTER_FINISH, tool_calls=1),
        Case(
            "tool_arguments_at_done",
            bad_done,
            len(bad_done) - 2,
            Reason.INVALID_TOOL_ARGUMENTS,
            tool_calls=1,
        ),
        Case(
            "tool_arguments_at_completed",
            no_done,
            len(no_done) - 1,
            Reason.INVALID_TOOL_ARGUMENTS,
            tool_calls=1,
        ),
        Case(
            "tool_arguments_at_item_done",
            bad_item,
            len(bad_item) - 1,
            Reason.INVALID_TOOL_ARGUMENTS,
            tool_calls=1,
        ),
        Case(
            "tool_arguments_in_output",
            bad_output,
            len(bad_output) - 1,
            Reason.INVALID_TOOL_ARGUMENTS,
        ),
    ]


CASES = _cases()


# -- table test ----------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_verdict_and_forwarded_bytes(case: Case) -> None:
    check_verdict_and_forwarded(case, drive)


@pytest.mark.parametrize("case", rejected_cases(CASES), ids=lambda c: c.name)
def test_the_rejected_event_is_never_forwarded(case: Case) -> None:
    check_stops_before_the_rejected_event(case, drive)


@pytest.mark.parametrize("case", upstream_error_cases(CASES), ids=lambda c: c.name)
def test_the_upstream_error_event_is_forwarded(case: Case) -> None:
    out, _, _ = drive(case.stream)
    assert out.endswith(case.blocks[-1])


# -- every partition -----------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_one_chunk_and_byte_at_a_time_give_the_same_result(case: Case) -> None:
    check_every_partition(
        case.stream,
        drive,
        also=lambda guard: contract_of(guard, ResponsesContract).last_sequence_number,
    )


@given(data=st.data())
def test_any_partition_of_any_case_gives_the_same_result(data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(CASES), "case")
    check_random_partition(
        data,
        case.stream,
        drive,
        also=lambda guard: contract_of(guard, ResponsesContract).last_sequence_number,
    )


# -- limits --------------------------------------------------------------------------


def _big_delta_stream() -> tuple[list[bytes], int]:
    s = Seq()
    events = [*head(s), *text_events(s, ["a", "b" * 6000, "c"])]
    return events, 5  # events[5] is the oversized delta


def test_limit_exceeded_by_event_budget() -> None:
    events, big = _big_delta_stream()
    stream = b"".join(events)
    before = b"".join(events[:big])
    budget = max(len(e) for e in events[:big]) + 64
    assert len(events[big]) > budget

    def decoder() -> SSEDecoder:
        return SSEDecoder(max_event_bytes=budget)

    # byte at a time: every event before the oversized one was already relayed
    out, verdict, guard = drive(
        stream, [stream[i : i + 1] for i in range(len(stream))], decoder=decoder()
    )
    assert verdict.reason is Reason.LIMIT_EXCEEDED
    assert verdict.outcome is Outcome.INCOMPLETE
    assert out == before
    annotation = guard.annotation("req-1")
    body = _error_body(annotation)
    assert body["code"] == "limit_exceeded"
    assert body["sequence_number"] == big  # events 0..big-1 relayed
    # any partition: the same verdict, and only whole events from that prefix
    rng = random.Random(11)  # a fixed sample of the two-chunk splits, and any pair of cuts
    for _ in range(200):
        chunks = cut(stream, *sorted(rng.sample(range(len(stream) + 1), 2)))
        got, got_verdict, _ = drive(stream, chunks, decoder=decoder())
        assert got_verdict.reason is Reason.LIMIT_EXCEEDED
        assert before.startswith(got)
        assert got in {b"".join(events[:k]) for k in range(big + 1)}


def test_limit_exceeded_by_stream_budget() -> None:
    events = text_stream()
    stream = b"".join(events)
    limit = len(b"".join(events[:4])) + 10
    guard = StreamGuard(ResponsesContract(), max_stream_bytes=limit)
    out = b"".join(guard.feed(e) for e in events)
    assert guard.verdict is not None
    assert guard.verdict.reason is Reason.LIMIT_EXCEEDED
    assert out == b"".join(events[:4])
    assert len(stream) > limit


# -- annotation ----------------------------------------------------------------------


def _error_body(annotation: bytes) -> dict[str, Any]:
    event, comment = annotation.split(b"\n\n")
    lines = event.split(b"\n")
    assert lines[0] == b"event: error"
    assert lines[1].startswith(b"data: ")
    assert len(lines) == 2
    body = json.loads(lines[1][len(b"data: ") :])
    assert isinstance(body, dict)
    assert comment.startswith(b": gateway outcome=incomplete reason=")
    return body


@pytest.mark.parametrize(
    ("blocks", "reason", "sequence"),
    [
        (text_stream()[:6], Reason.MISSING_DONE, 6),
        (
            [*text_stream()[:5], raw_block("response.output_text.delta", "{")],
            Reason.INVALID_JSON,
            5,
        ),
        (_tool_cases()[1].blocks, Reason.INVALID_TOOL_ARGUMENTS, 5),
        (unnumbered_stream()[:3], Reason.MISSING_DONE, 0),
        ([], Reason.MISSING_DONE, 0),
    ],
    ids=["missing_done", "invalid_json", "invalid_tool_arguments", "unnumbered", "empty"],
)
def test_incomplete_annotation(blocks: list[bytes], reason: Reason, sequence: int) -> None:
    _, verdict, guard = drive(b"".join(blocks))
    assert verdict.reason is reason
    annotation = guard.annotation("req-42")
    body = _error_body(annotation)
    message = body["message"]
    assert body == {
        "type": "error",
        "code": str(reason),
        "message": message,
        "param": None,
        "sequence_number": sequence,
        "error": {"type": "stream_incomplete", "code": str(reason), "message": message},
    }
    assert "req-42" in message
    assert annotation.endswith(
        f"\n\n: gateway outcome=incomplete reason={reason} request_id=req-42\n".encode()
    )


def test_complete_annotation_is_one_comment_line() -> None:
    _, verdict, guard = drive(b"".join(function_stream()))
    assert verdict.reason is Reason.TOOL_CALLS
    assert (
        guard.annotation("abc") == b": gateway outcome=complete reason=tool_calls request_id=abc\n"
    )


@pytest.mark.parametrize("blocks", [failed_stream(), error_nested_stream(), error_flat_stream()])
def test_upstream_error_annotation_adds_no_second_error(blocks: list[bytes]) -> None:
    _, _, guard = drive(b"".join(blocks))
    assert guard.annotation("r") == (
        b": gateway outcome=incomplete reason=upstream_error request_id=r\n"
    )


# -- accessors -----------------------------------------------------------------------


def test_last_sequence_number_is_the_highest_relayed() -> None:
    _, _, guard = drive(b"".join(text_stream()))
    assert contract_of(guard, ResponsesContract).last_sequence_number == len(text_stream()) - 1
    _, _, guard = drive(b"".join(CASES[case_ids(CASES).index("sequence_repeated")].blocks))
    assert contract_of(guard, ResponsesContract).last_sequence_number == 4


def test_keep_text_and_tool_call_arguments() -> None:
    _, _, guard = drive(b"".join(reasoning_stream()), keep_text=True)
    assert contract_of(guard, ResponsesContract).text() == "Hello!"
    _, _, guard = drive(b"".join(text_stream()))
    assert contract_of(guard, ResponsesContract).text() == ""
    _, _, guard = drive(b"".join(function_stream()))
    contract = contract_of(guard, ResponsesContract)
    assert contract.tool_call_arguments() == [
        (CALL_ID, "get_weather", '{"location":"Paris, France"}')
    ]
    assert contract.tool_calls == 1
    assert contract.content_chars == len('{"location":"Paris, France"}')


def test_done_arguments_replace_the_deltas() -> None:
    s = Seq()
    blocks = [
        *head(s),
        *function_events(s, ['{"a":', "1}"], done='{"a": 1}'),
        s("response.completed", response=response_obj("completed", usage=USAGE)),
    ]
    _, verdict, guard = drive(b"".join(blocks))
    assert verdict.reason is Reason.TOOL_CALLS
    assert contract_of(guard, ResponsesContract).tool_call_arguments() == [
        (CALL_ID, "get_weather", '{"a": 1}')
    ]


def test_call_without_deltas_is_judged_by_the_completed_output() -> None:
    s = Seq()
    blocks = [
        *head(s),
        s("response.output_item.added", output_index=0, item=function_item("in_progress", "")),
        s("response.output_item.done", output_index=0, item={"type": "function_call"}),
        s(
            "response.completed",
            response=response_obj("completed", [function_item("completed", "{}")], usage=USAGE),
        ),
    ]
    _, verdict, _ = drive(b"".join(blocks))
    assert verdict.reason is Reason.TOOL_CALLS
    assert verdict.tool_calls == 1


def _completed_after(events: list[bytes], s: Seq, output: list[dict[str, Any]]) -> list[bytes]:
    return [*events, s("response.completed", response=response_obj("completed", output))]


def test_an_item_added_and_never_done_is_missing_finish_and_completed_is_withheld() -> None:
    s = Seq()
    events = [*head(s), *text_events(s, ["Hi"])[:-1]]  # no response.output_item.done
    blocks = _completed_after(events, s, [message_item("completed", "Hi")])
    out, verdict, _ = drive(b"".join(blocks))
    assert verdict.reason is Reason.MISSING_FINISH
    assert b"response.completed" not in out
    assert out == b"".join(blocks[:-1])


@pytest.mark.parametrize("status", ["in_progress", "incomplete"])
def test_a_model_item_the_completed_response_lists_unfinished_is_missing_finish(
    status: str,
) -> None:
    s = Seq()
    blocks = _completed_after([*head(s), *text_events(s, ["Hi"])], s, [message_item(status, "Hi")])
    _, verdict, _ = drive(b"".join(blocks))
    assert verdict.reason is Reason.MISSING_FINISH


def test_hosted_tool_statuses_and_statusless_reasoning_are_complete() -> None:
    """Shapes of real streams: an image generation whose items stay ``generating``
    (output_item.done and response.completed alike), a web search that ``failed``, a
    reasoning item with a null status: the response completed, and so did the stream."""
    s = Seq()
    image = {"id": "ig_1", "type": "image_generation_call", "status": "generating"}
    search = {"id": "ws_1", "type": "web_search_call", "status": "failed"}
    reasoning = {"id": RS_ID, "type": "reasoning", "status": None, "summary": []}
    blocks = [
        *head(s),
        s("response.output_item.added", output_index=0, item={**image, "status": "in_progress"}),
        s("response.output_item.done", output_index=0, item={**image, "result": "iVBORw0KGgo="}),
        s("response.output_item.added", output_index=1, item={**search, "status": "in_progress"}),
        s("response.output_item.done", output_index=1, item=search),
        s("response.output_item.added", output_index=2, item=reasoning),
        s("response.output_item.done", output_index=2, item=reasoning),
        *text_events(s, ["Here it is."], index=3),
    ]
    output = [image, search, reasoning, message_item("completed", "Here it is.")]
    _, verdict, _ = drive(b"".join(_completed_after(blocks, s, output)))
    assert verdict.outcome is Outcome.COMPLETE
    assert verdict.reason is Reason.STOP


def test_custom_tool_call_finishes_with_tool_calls() -> None:
    s = Seq()
    item = {
        "id": "ctc_1",
        "type": "custom_tool_call",
        "call_id": "call_x",
        "name": "grep",
        "input": "",
    }
    where = {"item_id": "ctc_1", "output_index": 0}
    blocks = [
        *head(s),
        s("response.output_item.added", output_index=0, item=item),
        s("response.custom_tool_call_input.delta", **where, delta="not json"),
        s("response.custom_tool_call_input.done", **where, input="not json"),
        s("response.output_item.done", output_index=0, item={**item, "input": "not json"}),
        s(
            "response.completed",
            response=response_obj("completed", [{**item, "input": "not json"}], usage=USAGE),
        ),
    ]
    _, verdict, guard = drive(b"".join(blocks))
    assert verdict.reason is Reason.TOOL_CALLS
    assert verdict.tool_calls == 1
    assert guard.content_events == 1


def test_contract_refuses_events_after_its_verdict() -> None:
    contract = ResponsesContract()
    guard = StreamGuard(contract)
    guard.feed(b"".join(text_stream()))
    assert guard.done
    assert guard.feed(b"event: x\ndata: {}\n\n") == b""
    with pytest.raises(RuntimeError):
        contract.on_event(next(iter(SSEDecoder().feed(text_stream()[0]))))
