"""MessagesContract driven through StreamGuard: verdicts, forwarded bytes, annotation.

Fixtures follow the Anthropic "Streaming messages" documentation and
anthropic-sdk-python's ``RawMessageStreamEvent`` types: every block is
``event: <type>`` plus one ``data:`` line whose ``type`` repeats it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.guard import Outcome, Reason, SSEDecoder, StreamGuard, Usage
from gateway.guard.messages import MessagesContract
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
    rejected,
    rejected_cases,
    upstream_error_cases,
    whole,
)

MSG_ID = "msg_01XFDUDYJgAACzvnptvVoYEL"
TOOL_ID = "toolu_01T1x1fJ34qAmk2tNTrN7Up6"
SRV_ID = "srvtoolu_014hJH82Qum7Td6UV8gDXThB"
MODEL = "claude-sonnet-4-5-20250929"

# -- fixture builders ------------------------------------------------------------


def ev(payload: dict[str, Any], event: str | None = None) -> bytes:
    name = payload.get("type") if event is None else event
    return raw_block(str(name), json.dumps(payload, separators=(",", ":")))


def message_start(input_tokens: int = 472, cache_read: int = 0, output_tokens: int = 2) -> bytes:
    return ev(
        {
            "type": "message_start",
            "message": {
                "id": MSG_ID,
                "type": "message",
                "role": "assistant",
                "model": MODEL,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": input_tokens,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": cache_read,
                    "cache_creation": {
                        "ephemeral_5m_input_tokens": 0,
                        "ephemeral_1h_input_tokens": 0,
                    },
                    "output_tokens": output_tokens,
                    "service_tier": "standard",
                },
            },
        }
    )


PING = ev({"type": "ping"})
MESSAGE_STOP = ev({"type": "message_stop"})


def block_start(index: int, block: dict[str, Any]) -> bytes:
    return ev({"type": "content_block_start", "index": index, "content_block": block})


def delta(index: int, body: dict[str, Any]) -> bytes:
    return ev({"type": "content_block_delta", "index": index, "delta": body})


def text_delta(index: int, text: str) -> bytes:
    return delta(index, {"type": "text_delta", "text": text})


def json_delta(index: int, partial: str) -> bytes:
    return delta(index, {"type": "input_json_delta", "partial_json": partial})


def block_stop(index: int) -> bytes:
    return ev({"type": "content_block_stop", "index": index})


def message_delta(stop_reason: str | None, output_tokens: int = 15, **usage: Any) -> bytes:
    return ev(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens, **usage},
        }
    )


def text_block(index: int, pieces: Iterable[str]) -> list[bytes]:
    return [
        block_start(index, {"type": "text", "text": ""}),
        *[text_delta(index, p) for p in pieces],
        block_stop(index),
    ]


def tool_block(index: int, pieces: Iterable[str], name: str = "get_weather") -> list[bytes]:
    return [
        block_start(index, {"type": "tool_use", "id": TOOL_ID, "name": name, "input": {}}),
        *[json_delta(index, p) for p in pieces],
        block_stop(index),
    ]


def text_stream(stop_reason: str = "end_turn") -> list[bytes]:
    return [
        message_start(),
        block_start(0, {"type": "text", "text": ""}),
        PING,
        text_delta(0, "Hello"),
        text_delta(0, "!"),
        block_stop(0),
        message_delta(stop_reason),
        MESSAGE_STOP,
    ]


TOOL_PIECES = ["", '{"location": "San Fra', 'ncisco, CA", "unit": "fah', 'renheit"}']


def tool_stream() -> list[bytes]:
    return [
        message_start(),
        *text_block(0, ["Okay, let's check the weather for San Francisco, CA:"]),
        *tool_block(1, TOOL_PIECES),
        message_delta("tool_use", 89),
        MESSAGE_STOP,
    ]


def no_arg_tool_stream() -> list[bytes]:
    return [
        message_start(),
        *tool_block(0, [""], name="get_time"),
        *tool_block(1, [], name="get_date"),
        message_delta("tool_use", 40),
        MESSAGE_STOP,
    ]


def thinking_stream() -> list[bytes]:
    return [
        message_start(input_tokens=20, cache_read=4096, output_tokens=1),
        block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, {"type": "thinking_delta", "thinking": "Let me solve this step by step:\n\n"}),
        delta(0, {"type": "thinking_delta", "thinking": "1. First break down 27 * 453"}),
        delta(0, {"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3h"}),
        block_stop(0),
        *text_block(1, ["27 * 453 = 12,231"]),
        message_delta(
            "end_turn",
            260,
            input_tokens=20,
            cache_read_input_tokens=4096,
            output_tokens_details={"thinking_tokens": 212},
        ),
        MESSAGE_STOP,
    ]


def web_search_stream() -> list[bytes]:
    citation = {
        "type": "web_search_result_location",
        "cited_text": "Claude Shannon was born on April 30, 1916",
        "url": "https://en.wikipedia.org/wiki/Claude_Shannon",
        "title": "Claude Shannon - Wikipedia",
        "encrypted_index": "Eo8BCioIAhgBIiQyYjQ0OWJmZi1lNm",
    }
    result = {
        "type": "web_search_tool_result",
        "tool_use_id": SRV_ID,
        "content": [
            {
                "type": "web_search_result",
                "title": "Claude Shannon - Wikipedia",
                "url": "https://en.wikipedia.org/wiki/Claude_Shannon",
                "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5",
                "page_age": "April 30, 2025",
            }
        ],
    }
    server = {"type": "server_tool_use", "id": SRV_ID, "name": "web_search", "input": {}}
    return [
        message_start(),
        *text_block(0, ["I'll search for when Claude Shannon was born."]),
        block_start(1, server),
        json_delta(1, ""),
        json_delta(1, '{"query": "claude shannon birth date"}'),
        block_stop(1),
        block_start(2, result),
        block_stop(2),
        block_start(3, {"type": "text", "text": "", "citations": []}),
        delta(3, {"type": "citations_delta", "citation": citation}),
        text_delta(3, "Claude Shannon was born on April 30, 1916."),
        delta(3, {"type": "future_delta", "payload": [1, 2, 3]}),
        block_stop(3),
        ev({"type": "message_future_info", "detail": "x"}),
        message_delta("pause_turn", 510),
        MESSAGE_STOP,
    ]


OVERLOADED = ev({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})


# -- the driver --------------------------------------------------------------------


drive = driver(MessagesContract)


#: ``max_tokens`` ends the message while its last content block is still open: no
#: ``content_block_stop`` ever comes for it.
MAX_TOKENS_OPEN_TEXT = [
    message_start(),
    block_start(0, {"type": "text", "text": ""}),
    text_delta(0, "Hello"),
    text_delta(0, " wor"),
    message_delta("max_tokens"),
    MESSAGE_STOP,
]
#: Fine-grained tool streaming cut mid-parameter: the tool block's partial JSON is
#: not valid JSON and the block is never stopped.
MAX_TOKENS_OPEN_TOOL = [
    message_start(),
    *text_block(0, ["Let me check."]),
    block_start(1, {"type": "tool_use", "id": TOOL_ID, "name": "get_weather", "input": {}}),
    json_delta(1, '{"location": "San Fra'),
    json_delta(1, 'ncisco, CA", "unit": "fah'),
    message_delta("max_tokens", 30),
    MESSAGE_STOP,
]
BASIC = Usage(input_tokens=472, output_tokens=15, cached_input_tokens=0, cache_write_tokens=0)
STARTED = Usage(input_tokens=472, output_tokens=2, cached_input_tokens=0, cache_write_tokens=0)
TEXT = text_stream()


def _cases() -> list[Case]:
    finish = [
        ("end_turn", Reason.STOP),
        ("stop_sequence", Reason.STOP),
        ("max_tokens", Reason.LENGTH),
        ("model_context_window_exceeded", Reason.LENGTH),
        ("refusal", Reason.CONTENT_FILTER),
        ("pause_turn", Reason.OTHER),
        ("some_future_reason", Reason.OTHER),
    ]
    cases = [
        whole(
            f"stop_{raw}",
            text_stream(raw),
            reason,
            usage=BASIC,
            raw_finish={0: raw},
            content_events=2,
        )
        for raw, reason in finish
    ]
    cases += [
        whole(
            "tool_use",
            tool_stream(),
            Reason.TOOL_CALLS,
            raw_finish={0: "tool_use"},
            usage=Usage(472, 89, 0, None, 0),
            content_events=4,
            tool_calls=1,
        ),
        whole(
            "tool_use_no_arguments",
            no_arg_tool_stream(),
            Reason.TOOL_CALLS,
            usage=Usage(472, 40, 0, None, 0),
            content_events=0,
            tool_calls=2,
        ),
        whole(
            "thinking",
            thinking_stream(),
            Reason.STOP,
            usage=Usage(20, 260, 4096, 212, 0),
            content_events=3,
        ),
        whole(
            "web_search_pause_turn",
            web_search_stream(),
            Reason.OTHER,
            raw_finish={0: "pause_turn"},
            usage=Usage(472, 510, 0, None, 0),
            content_events=3,
        ),
        whole("ping_first", [PING, *TEXT], Reason.STOP, usage=BASIC),
        whole(
            "comments",
            [TEXT[0], b": keepalive\n\n", *TEXT[1:3], b":\n", *TEXT[3:]],
            Reason.STOP,
            usage=BASIC,
        ),
        # -- incomplete ------------------------------------------------------------------
        rejected(
            "missing_done",
            TEXT[:4],
            4,
            Reason.MISSING_DONE,
            tail=TEXT[4][: len(TEXT[4]) // 2],
            usage=STARTED,
        ),
        rejected(
            "missing_done_after_delta",
            TEXT[:-1],
            7,
            Reason.MISSING_DONE,
            usage=BASIC,
            raw_finish={0: "end_turn"},
        ),
        rejected("missing_done_empty", [], 0, Reason.MISSING_DONE),
        rejected(
            "missing_finish_no_delta",
            [*TEXT[:6], MESSAGE_STOP],
            6,
            Reason.MISSING_FINISH,
            usage=STARTED,
        ),
        rejected(
            "missing_finish_null_reason",
            [*TEXT[:6], message_delta(None), MESSAGE_STOP],
            7,
            Reason.MISSING_FINISH,
            usage=BASIC,
        ),
        rejected(
            "missing_finish_open_block",
            [*TEXT[:5], message_delta("end_turn"), MESSAGE_STOP],
            6,
            Reason.MISSING_FINISH,
            usage=BASIC,
        ),
        whole("upstream_error", [*TEXT[:4], OVERLOADED], Reason.UPSTREAM_ERROR, usage=STARTED),
        whole("upstream_error_first", [OVERLOADED], Reason.UPSTREAM_ERROR),
        whole("upstream_error_after_ping", [PING, OVERLOADED], Reason.UPSTREAM_ERROR),
        whole(
            "upstream_error_not_json",
            [*TEXT[:2], raw_block("error", "Internal error")],
            Reason.UPSTREAM_ERROR,
            usage=STARTED,
        ),
        rejected(
            "invalid_json",
            inserted(
                TEXT,
                3,
                raw_block(
                    "content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type"'
                ),
            ),
            3,
            Reason.INVALID_JSON,
            usage=STARTED,
        ),
        rejected(
            "not_an_object",
            inserted(TEXT, 3, raw_block("content_block_delta", '"hi"')),
            3,
            Reason.INVALID_SHAPE,
            usage=STARTED,
        ),
        rejected(
            "no_type",
            inserted(TEXT, 3, raw_block("content_block_delta", '{"index":0}')),
            3,
            Reason.INVALID_SHAPE,
            usage=STARTED,
        ),
        rejected(
            "name_mismatch",
            inserted(
                TEXT,
                3,
                text_delta(0, "x").replace(
                    b"event: content_block_delta", b"event: content_block_stop"
                ),
            ),
            3,
            Reason.INVALID_SHAPE,
            usage=STARTED,
        ),
        rejected("before_message_start", TEXT[1:], 0, Reason.INVALID_SHAPE),
        rejected(
            "unknown_before_message_start",
            [PING, ev({"type": "future"}), *TEXT],
            1,
            Reason.INVALID_SHAPE,
        ),
        rejected(
            "message_start_twice",
            inserted(TEXT, 2, message_start()),
            2,
            Reason.INVALID_SHAPE,
            usage=STARTED,
        ),
        rejected(
            "message_not_object",
            [ev({"type": "message_start", "message": []}), *TEXT[1:]],
            0,
            Reason.INVALID_SHAPE,
        ),
        rejected(
            "delta_unstarted_block",
            inserted(TEXT, 3, text_delta(1, "x")),
            3,
            Reason.INVALID_SHAPE,
            usage=STARTED,
        ),
        rejected(
            "stop_unstarted_block",
            inserted(TEXT, 3, block_stop(4)),
            3,
            Reason.INVALID_SHAPE,
            usage=STARTED,
        ),
        rejected(
            "stop_twice", inserted(TEXT, 6, block_stop(0)), 6, Reason.INVALID_SHAPE, usage=STARTED
        ),
        rejected(
            "block_started_twice",
            inserted(TEXT, 3, block_start(0, {"type": "text", "text": ""})),
            3,
            Reason.INVALID_SHAPE,
            usage=STARTED,
        ),
        rejected(
            "block_not_typed",
            inserted(TEXT, 1, block_start(0, {"text": ""})),
            1,
            Reason.INVALID_SHAPE,
            usage=STARTED,
        ),
        rejected(
            "index_not_int",
            inserted(
                TEXT,
                3,
                ev(
                    {
                        "type": "content_block_delta",
                        "index": "0",
                        "delta": {"type": "text_delta", "text": "x"},
                    }
                ),
            ),
            3,
            Reason.INVALID_SHAPE,
            usage=STARTED,
        ),
        rejected(
            "text_not_string",
            inserted(TEXT, 3, delta(0, {"type": "text_delta", "text": 7})),
            3,
            Reason.INVALID_SHAPE,
            usage=STARTED,
        ),
        rejected(
            "delta_not_typed",
            inserted(TEXT, 3, delta(0, {"text": "x"})),
            3,
            Reason.INVALID_SHAPE,
            usage=STARTED,
        ),
        rejected(
            "message_delta_not_object",
            [*TEXT[:6], ev({"type": "message_delta", "delta": None}), MESSAGE_STOP],
            6,
            Reason.INVALID_SHAPE,
            usage=STARTED,
        ),
        rejected(
            "stop_reason_not_string",
            [
                *TEXT[:6],
                ev(
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": 1},
                        "usage": {"output_tokens": 3},
                    }
                ),
                MESSAGE_STOP,
            ],
            6,
            Reason.INVALID_SHAPE,
            usage=STARTED,
        ),
        rejected(
            "usage_not_object",
            [
                *TEXT[:6],
                ev({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": 15}),
                MESSAGE_STOP,
            ],
            6,
            Reason.INVALID_SHAPE,
            usage=STARTED,
        ),
        rejected(
            "delta_after_block_stop",
            inserted(TEXT, 6, text_delta(0, "late")),
            6,
            Reason.CONTENT_AFTER_FINISH,
            usage=STARTED,
        ),
        rejected(
            "block_after_stop_reason",
            [*TEXT[:7], *text_block(1, ["more"]), MESSAGE_STOP],
            7,
            Reason.CONTENT_AFTER_FINISH,
            usage=BASIC,
            raw_finish={0: "end_turn"},
        ),
        rejected(
            "delta_after_stop_reason",
            [*TEXT[:5], message_delta("end_turn"), text_delta(0, "more"), *TEXT[5:]],
            6,
            Reason.CONTENT_AFTER_FINISH,
            usage=BASIC,
            raw_finish={0: "end_turn"},
        ),
        # broken tool input is judged at the stop reason: the message_delta is withheld
        rejected(
            "tool_arguments",
            [message_start(), *tool_block(0, ['{"location": "San']), message_delta("tool_use")],
            4,
            Reason.INVALID_TOOL_ARGUMENTS,
            usage=STARTED,
            tool_calls=1,
        ),
        rejected(
            "server_tool_arguments",
            [
                *web_search_stream()[:5],
                json_delta(1, ', "more"}'),
                block_stop(1),
                message_delta("end_turn"),
            ],
            7,
            Reason.INVALID_TOOL_ARGUMENTS,
            usage=STARTED,
        ),
        # -- a length stop may leave the last started block open ------------------------
        whole(
            "max_tokens_open_text_block",
            MAX_TOKENS_OPEN_TEXT,
            Reason.LENGTH,
            usage=BASIC,
            raw_finish={0: "max_tokens"},
            content_events=2,
        ),
        whole(
            "max_tokens_open_tool_block_cut_json",
            MAX_TOKENS_OPEN_TOOL,
            Reason.LENGTH,
            usage=Usage(472, 30, 0, None, 0),
            raw_finish={0: "max_tokens"},
            content_events=3,
            tool_calls=1,
        ),
        whole(
            "context_window_open_tool_block",
            [
                *MAX_TOKENS_OPEN_TOOL[:-2],
                message_delta("model_context_window_exceeded", 30),
                MESSAGE_STOP,
            ],
            Reason.LENGTH,
            usage=Usage(472, 30, 0, None, 0),
            raw_finish={0: "model_context_window_exceeded"},
            tool_calls=1,
        ),
        rejected(
            "end_turn_open_tool_block",
            [*MAX_TOKENS_OPEN_TOOL[:-2], message_delta("end_turn", 30), MESSAGE_STOP],
            8,
            Reason.MISSING_FINISH,
            usage=Usage(472, 30, 0, None, 0),
            raw_finish={0: "end_turn"},
            tool_calls=1,
        ),
        rejected(
            "max_tokens_earlier_block_open",
            [
                message_start(),
                block_start(0, {"type": "text", "text": ""}),
                text_delta(0, "Hello"),
                block_start(1, {"type": "tool_use", "id": TOOL_ID, "name": "f", "input": {}}),
                json_delta(1, '{"a": 1'),
                message_delta("max_tokens", 30),
                MESSAGE_STOP,
            ],
            6,
            Reason.MISSING_FINISH,
            usage=Usage(472, 30, 0, None, 0),
            raw_finish={0: "max_tokens"},
            tool_calls=1,
        ),
        rejected(
            "open_block_without_message_delta",
            [*MAX_TOKENS_OPEN_TEXT[:-2], MESSAGE_STOP],
            4,
            Reason.MISSING_FINISH,
            usage=STARTED,
        ),
        rejected(
            "max_tokens_open_block_without_message_stop",
            MAX_TOKENS_OPEN_TEXT[:-1],
            5,
            Reason.MISSING_DONE,
            usage=BASIC,
            raw_finish={0: "max_tokens"},
        ),
        rejected(
            "tool_arguments_two_values",
            [message_start(), *tool_block(0, ["{}", "{}"]), message_delta("tool_use")],
            5,
            Reason.INVALID_TOOL_ARGUMENTS,
            usage=STARTED,
            tool_calls=1,
        ),
    ]
    return cases


CASES = _cases()


# -- table test ----------------------------------------------------------------------


def test_case_names_are_unique() -> None:
    assert len(set(case_ids(CASES))) == len(CASES)


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
    check_every_partition(case.stream, drive)


@given(data=st.data())
def test_any_partition_of_any_case_gives_the_same_result(data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(CASES), "case")
    check_random_partition(data, case.stream, drive)


# -- limits --------------------------------------------------------------------------


def test_limit_exceeded_by_event_budget() -> None:
    events = [
        message_start(),
        block_start(0, {"type": "text", "text": ""}),
        text_delta(0, "a"),
        text_delta(0, "b" * 5000),
        text_delta(0, "c"),
        block_stop(0),
        message_delta("end_turn"),
        MESSAGE_STOP,
    ]
    big = 3
    stream = b"".join(events)
    before = b"".join(events[:big])
    budget = 1024
    assert max(len(e) for e in events[:big]) < budget < len(events[big])

    def decoder() -> SSEDecoder:
        return SSEDecoder(max_event_bytes=budget)

    out, verdict, guard = drive(
        stream, [stream[i : i + 1] for i in range(len(stream))], decoder=decoder()
    )
    assert verdict.outcome is Outcome.INCOMPLETE
    assert verdict.reason is Reason.LIMIT_EXCEEDED
    assert out == before
    assert guard.annotation("r").startswith(b"event: error\ndata: ")
    rng = random.Random(11)  # a fixed sample of the two-chunk splits, and any pair of cuts
    for _ in range(200):
        chunks = cut(stream, *sorted(rng.sample(range(len(stream) + 1), 2)))
        got, got_verdict, _ = drive(stream, chunks, decoder=decoder())
        assert got_verdict.reason is Reason.LIMIT_EXCEEDED
        assert got in {b"".join(events[:k]) for k in range(big + 1)}


def test_limit_exceeded_by_stream_budget() -> None:
    limit = len(b"".join(TEXT[:3])) + 5
    guard = StreamGuard(MessagesContract(), max_stream_bytes=limit)
    out = b"".join(guard.feed(e) for e in TEXT)
    assert guard.verdict is not None
    assert guard.verdict.reason is Reason.LIMIT_EXCEEDED
    assert out == b"".join(TEXT[:3])


# -- annotation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("blocks", "reason"),
    [
        (TEXT[:4], Reason.MISSING_DONE),
        ([*TEXT[:6], MESSAGE_STOP], Reason.MISSING_FINISH),
        (
            [message_start(), *tool_block(0, ['{"a']), message_delta("tool_use")],
            Reason.INVALID_TOOL_ARGUMENTS,
        ),
        (inserted(TEXT, 6, text_delta(0, "late")), Reason.CONTENT_AFTER_FINISH),
    ],
    ids=lambda v: str(v) if isinstance(v, Reason) else "",
)
def test_incomplete_annotation(blocks: list[bytes], reason: Reason) -> None:
    _, verdict, guard = drive(b"".join(blocks))
    assert verdict.reason is reason
    annotation = guard.annotation("req-7")
    event, comment = annotation.split(b"\n\n")
    name, data = event.split(b"\n")
    assert name == b"event: error"
    assert data.startswith(b"data: ")
    body = json.loads(data[len(b"data: ") :])
    message = body["error"]["message"]
    assert body == {
        "type": "error",
        "error": {
            "type": "api_error",
            "message": message,
            # the machine-readable reason, where the anthropic SDKs read a cause code
            "details": {"error_code": str(reason)},
        },
    }
    assert str(reason) in message
    assert "req-7" in message
    # worded in Messages terms, never Chat's or Responses'
    assert "choice" not in message
    assert "finish reason" not in message
    assert "output item" not in message
    assert comment == f": gateway outcome=incomplete reason={reason} request_id=req-7\n".encode()


def test_complete_annotation_is_one_comment_line() -> None:
    _, _, guard = drive(b"".join(tool_stream()))
    assert guard.annotation("x") == b": gateway outcome=complete reason=tool_calls request_id=x\n"


def test_upstream_error_annotation_adds_no_second_error() -> None:
    _, _, guard = drive(b"".join([*TEXT[:4], OVERLOADED]))
    assert guard.annotation("x") == (
        b": gateway outcome=incomplete reason=upstream_error request_id=x\n"
    )


# -- accessors -----------------------------------------------------------------------


def test_keep_text_and_tool_call_arguments() -> None:
    _, _, guard = drive(b"".join(tool_stream()), keep_text=True)
    contract = contract_of(guard, MessagesContract)
    assert contract.text() == "Okay, let's check the weather for San Francisco, CA:"
    assert contract.tool_call_arguments() == [
        (TOOL_ID, "get_weather", '{"location": "San Francisco, CA", "unit": "fahrenheit"}')
    ]
    assert contract.last_sequence_number is None
    _, _, guard = drive(b"".join(thinking_stream()))
    assert contract_of(guard, MessagesContract).text() == ""
    _, _, guard = drive(b"".join(no_arg_tool_stream()))
    assert [a for _, _, a in contract_of(guard, MessagesContract).tool_call_arguments()] == ["", ""]


def test_content_chars_count_text_thinking_and_tool_input() -> None:
    _, verdict, _ = drive(b"".join(thinking_stream()))
    thinking = "Let me solve this step by step:\n\n" + "1. First break down 27 * 453"
    assert verdict.content_chars == len(thinking) + len("27 * 453 = 12,231")
    _, verdict, _ = drive(b"".join(tool_stream()))
    assert verdict.content_chars == len(
        "Okay, let's check the weather for San Francisco, CA:"
    ) + len("".join(TOOL_PIECES))


def test_tool_input_cut_by_max_tokens_is_a_complete_length_stream() -> None:
    blocks = [
        message_start(),
        *tool_block(0, ['{"location": "San']),
        message_delta("max_tokens"),
        MESSAGE_STOP,
    ]
    out, verdict, _ = drive(b"".join(blocks))
    assert (verdict.outcome, verdict.reason) == (Outcome.COMPLETE, Reason.LENGTH)
    assert out == b"".join(blocks)


# -- a max_tokens stop may leave the last content block open ----------------------------


@pytest.mark.parametrize(
    "blocks", [MAX_TOKENS_OPEN_TEXT, MAX_TOKENS_OPEN_TOOL], ids=["text_block", "tool_block_cut"]
)
def test_max_tokens_with_the_last_block_open_is_complete_length_in_every_partition(
    blocks: list[bytes],
) -> None:
    stream = b"".join(blocks)
    out, verdict, guard = drive(stream)
    assert (verdict.outcome, verdict.reason) == (Outcome.COMPLETE, Reason.LENGTH)
    assert out == stream  # message_stop included: nothing withheld
    assert guard.annotation("r") == b": gateway outcome=complete reason=length request_id=r\n"
    check_every_partition(stream, drive)


def test_the_cut_tool_input_is_kept_as_it_came() -> None:
    _, _, guard = drive(b"".join(MAX_TOKENS_OPEN_TOOL))
    assert contract_of(guard, MessagesContract).tool_call_arguments() == [
        (TOOL_ID, "get_weather", '{"location": "San Francisco, CA", "unit": "fah')
    ]


@pytest.mark.parametrize("stop_reason", ["end_turn", "tool_use", "stop_sequence", "refusal"])
def test_only_a_length_stop_may_leave_a_block_open(stop_reason: str) -> None:
    blocks = [*MAX_TOKENS_OPEN_TOOL[:-2], message_delta(stop_reason, 30), MESSAGE_STOP]
    out, verdict, _ = drive(b"".join(blocks))
    assert (verdict.outcome, verdict.reason) == (Outcome.INCOMPLETE, Reason.MISSING_FINISH)
    assert out == b"".join(blocks[:-1])  # message_stop withheld
