"""The Chat Completions (and legacy Completions) contract, driven through StreamGuard.

Every case is a stream in OpenAI's wire format (``chat.completion.chunk``
objects as ``data:`` lines, ``data: [DONE]``), the contract's options, and
what must come out: the outcome, the reason, and exactly which bytes were
forwarded to the client (docs/wire-contract.md, "Event-aligned relay" and
"Withheld events": whole blocks only; a rejected event is never forwarded; an
upstream error event is).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.guard import (
    ChatContract,
    CompletionsContract,
    Contract,
    Outcome,
    Reason,
    SSEDecoder,
    Usage,
    Verdict,
)
from tests.unit.helpers import (
    DONE,
    USAGE,
    GuardRun,
    bytewise,
    choice,
    chunk,
    finish_chunk,
    join,
    random_partition,
    role_chunk,
    run_guard,
    sse,
    text_chunk,
    usage_chunk,
)

ROLE = role_chunk()
HELLO = text_chunk("Hello")
WORLD = text_chunk(", world! \u4f60\u597d \U0001f642")
STOP = finish_chunk("stop")
USAGE_EV = usage_chunk()
HEARTBEAT = b": keep-alive\n\n"
ERROR_EV = sse({"error": {"message": "The server is overloaded", "type": "server_error"}})
EXPECTED_USAGE = Usage(input_tokens=19, output_tokens=10, cached_input_tokens=3, reasoning_tokens=2)


def tool_call_chunks(
    arguments: str, *, call_id: str = "call_Xyz123", name: str = "get_weather", index: int = 0
) -> list[bytes]:
    """A tool call as OpenAI streams it: id and name first, then argument fragments."""
    first = {"index": index, "id": call_id, "type": "function"}
    first["function"] = {"name": name, "arguments": ""}
    parts = [sse(chunk([choice(tool_calls=[first])]))]
    for i in range(0, len(arguments), 4):
        fragment = {"index": index, "function": {"arguments": arguments[i : i + 4]}}
        parts.append(sse(chunk([choice(tool_calls=[fragment])])))
    return parts


ARGS = json.dumps({"location": "Paris, France", "unit": "celsius"})
TOOLS = tool_call_chunks(ARGS)
BAD_TOOLS = tool_call_chunks('{"location": "Par')
TOOLS_FINISH = finish_chunk("tool_calls")


#: the longest line of the ordinary chunks above: budgets are set just over it
LINE = max(len(line) for part in (ROLE, HELLO, WORLD, STOP, USAGE_EV) for line in part.split(b"\n"))


@dataclass
class Case:
    name: str
    parts: list[bytes]
    forwarded: bytes
    outcome: Outcome
    reason: Reason
    options: dict[str, Any] = field(default_factory=dict)
    check: Callable[[GuardRun], None] | None = None
    decoder: Callable[[], SSEDecoder] | None = None
    max_stream_bytes: int | None = None
    contract: type[ChatContract] = ChatContract


def _usage_parsed(run: GuardRun) -> None:
    assert run.verdict.usage == EXPECTED_USAGE
    assert run.verdict.finish_reasons == {0: Reason.STOP}
    assert run.verdict.raw_finish_reasons == {0: "stop"}
    assert run.verdict.events == 6
    assert run.verdict.content_chars == len("Hello") + len(", world! \u4f60\u597d \U0001f642")


def _usage_unknown(run: GuardRun) -> None:
    assert run.verdict.usage is None  # never reported: unknown, not zero


def _tool_args(run: GuardRun) -> None:
    contract = run.guard.contract
    assert isinstance(contract, ChatContract)
    assert contract.tool_call_arguments(0) == [("call_Xyz123", "get_weather", ARGS)]
    assert json.loads(contract.tool_call_arguments(0)[0][2]) == json.loads(ARGS)
    assert run.verdict.tool_calls == 1
    assert run.verdict.finish_reasons == {0: Reason.TOOL_CALLS}


def _two_tools(run: GuardRun) -> None:
    contract = run.guard.contract
    assert isinstance(contract, ChatContract)
    assert contract.tool_call_arguments(0) == [
        ("call_A", "get_weather", '{"city": "Oslo"}'),
        ("call_B", "get_time", '{"tz": "CET"}'),
    ]
    assert run.verdict.tool_calls == 2


def _n2(run: GuardRun) -> None:
    assert run.verdict.finish_reasons == {0: Reason.STOP, 1: Reason.LENGTH}
    assert run.verdict.raw_finish_reasons == {0: "stop", 1: "length"}


def _n2_lowest_length(run: GuardRun) -> None:
    assert run.verdict.finish_reasons == {0: Reason.LENGTH, 1: Reason.STOP}


def _text_kept(run: GuardRun) -> None:
    contract = run.guard.contract
    assert isinstance(contract, ChatContract)
    assert contract.text(0) == "Hi there! I can't help with that."
    # refusal text counts as content; role-only, empty and null deltas do not
    assert run.verdict.content_chars == len("Hi there!") + len(" I can't help with that.")


INTERLEAVED_TOOLS = [
    sse(chunk([choice(tool_calls=[{"index": 0, "id": "call_A", "type": "function",
                                   "function": {"name": "get_weather", "arguments": ""}}])])),
    sse(chunk([choice(tool_calls=[{"index": 1, "id": "call_B", "type": "function",
                                   "function": {"name": "get_time", "arguments": ""}}])])),
    sse(chunk([choice(tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}])])),
    sse(chunk([choice(tool_calls=[{"index": 1, "function": {"arguments": '{"tz": "CET"}'}}])])),
    sse(chunk([choice(tool_calls=[{"index": 0, "function": {"arguments": '"Oslo"}'}}])])),
]  # fmt: skip

CONTENT_AFTER = text_chunk("more")
BAD_JSON = b'data: {"id": "chatcmpl-1", "choices": [{"delta": {"content": "x"\n\n'
LATE_USAGE_FREE = sse(chunk([], prompt_filter_results=[]))

INVALID_SHAPES: list[tuple[str, bytes]] = [
    ("array", b"data: [1, 2]\n\n"),
    ("string", b'data: "hello"\n\n'),
    ("number", b"data: 42\n\n"),
    ("null", b"data: null\n\n"),
    ("choices-object", sse({"choices": {"index": 0}})),
    ("choices-string", sse({"choices": "stop"})),
    ("choice-not-object", sse({"choices": ["x"]})),
    ("choice-index-negative", sse({"choices": [{"index": -1, "delta": {}}]})),
    ("choice-index-bool", sse({"choices": [{"index": True, "delta": {}}]})),
    ("delta-not-object", sse({"choices": [{"index": 0, "delta": "hi"}]})),
    ("content-not-string", sse(chunk([choice(content=["a"])]))),
    (
        "finish-not-string",
        sse({"choices": [{"index": 0, "delta": {}, "finish_reason": 1}]}),
    ),
    ("usage-not-object", sse(chunk([], usage=[1]))),
    ("tool-calls-not-list", sse(chunk([choice(tool_calls={"index": 0})]))),
    (
        "tool-arguments-not-string",
        sse(chunk([choice(tool_calls=[{"index": 0, "function": {"arguments": {}}}])])),
    ),
]

CASES = [
    Case(
        "text-stop-usage-done",
        [ROLE, HELLO, WORLD, STOP, USAGE_EV, DONE],
        join(ROLE, HELLO, WORLD, STOP, USAGE_EV, DONE),
        Outcome.COMPLETE,
        Reason.STOP,
        check=_usage_parsed,
    ),
    Case(
        "usage-null-in-every-chunk",
        [sse(chunk([choice(content="a")], include_usage_null=True)), STOP, DONE],
        join(sse(chunk([choice(content="a")], include_usage_null=True)), STOP, DONE),
        Outcome.COMPLETE,
        Reason.STOP,
        check=_usage_unknown,
    ),
    Case(
        "eof-after-text",
        [ROLE, HELLO, WORLD],
        join(ROLE, HELLO, WORLD),
        Outcome.INCOMPLETE,
        Reason.MISSING_DONE,
    ),
    Case(
        "eof-after-stop",
        [ROLE, HELLO, STOP, USAGE_EV],
        join(ROLE, HELLO, STOP, USAGE_EV),
        Outcome.INCOMPLETE,
        Reason.MISSING_DONE,
    ),
    Case(
        "eof-in-the-middle-of-an-event",
        [ROLE, HELLO, WORLD[:-1]],
        join(ROLE, HELLO),
        Outcome.INCOMPLETE,
        Reason.MISSING_DONE,
    ),
    Case(
        "done-without-stop",
        [ROLE, HELLO, DONE],
        join(ROLE, HELLO),  # the [DONE] is withheld: the client must not see a clean end
        Outcome.INCOMPLETE,
        Reason.MISSING_FINISH,
    ),
    Case(
        "done-without-any-choice",
        [HEARTBEAT, DONE],
        HEARTBEAT,
        Outcome.INCOMPLETE,
        Reason.MISSING_FINISH,
    ),
    Case(
        "no-finish-required-done-alone",
        [DONE],
        DONE,
        Outcome.COMPLETE,
        Reason.OTHER,
        options={"require_finish_reason": False},
    ),
    Case(
        "no-finish-required-text-then-done",
        [ROLE, HELLO, DONE],
        join(ROLE, HELLO, DONE),
        Outcome.COMPLETE,
        Reason.OTHER,
        options={"require_finish_reason": False},
    ),
    Case(
        "no-finish-required-but-finish-given",
        [HELLO, finish_chunk("length"), DONE],
        join(HELLO, finish_chunk("length"), DONE),
        Outcome.COMPLETE,
        Reason.LENGTH,
        options={"require_finish_reason": False},
    ),
    Case(
        "length",
        [ROLE, HELLO, finish_chunk("length"), DONE],
        join(ROLE, HELLO, finish_chunk("length"), DONE),
        Outcome.COMPLETE,
        Reason.LENGTH,
    ),
    Case(
        "content-filter",
        [ROLE, HELLO, finish_chunk("content_filter"), DONE],
        join(ROLE, HELLO, finish_chunk("content_filter"), DONE),
        Outcome.COMPLETE,
        Reason.CONTENT_FILTER,
    ),
    Case(
        "unknown-finish-reason-is-other",
        [HELLO, finish_chunk("eaten_by_a_grue"), DONE],
        join(HELLO, finish_chunk("eaten_by_a_grue"), DONE),
        Outcome.COMPLETE,
        Reason.OTHER,
    ),
    Case(
        "tool-calls-valid-arguments",
        [ROLE, *TOOLS, TOOLS_FINISH, DONE],
        join(ROLE, *TOOLS, TOOLS_FINISH, DONE),
        Outcome.COMPLETE,
        Reason.TOOL_CALLS,
        check=_tool_args,
    ),
    Case(
        "two-parallel-tool-calls-interleaved",
        [ROLE, *INTERLEAVED_TOOLS, TOOLS_FINISH, DONE],
        join(ROLE, *INTERLEAVED_TOOLS, TOOLS_FINISH, DONE),
        Outcome.COMPLETE,
        Reason.TOOL_CALLS,
        check=_two_tools,
    ),
    Case(
        "tool-calls-invalid-arguments",
        [ROLE, *BAD_TOOLS, TOOLS_FINISH, DONE],
        join(ROLE, *BAD_TOOLS),  # the finishing event is rejected, not forwarded
        Outcome.INCOMPLETE,
        Reason.INVALID_TOOL_ARGUMENTS,
    ),
    Case(
        "legacy-function-call",
        [
            sse(chunk([choice(function_call={"name": "f", "arguments": '{"a":'})])),
            sse(chunk([choice(function_call={"arguments": " 1}"})])),
            finish_chunk("function_call"),
            DONE,
        ],
        join(
            sse(chunk([choice(function_call={"name": "f", "arguments": '{"a":'})])),
            sse(chunk([choice(function_call={"arguments": " 1}"})])),
            finish_chunk("function_call"),
            DONE,
        ),
        Outcome.COMPLETE,
        Reason.TOOL_CALLS,
    ),
    Case(
        "n2-finishing-in-different-chunks",
        [
            sse(chunk([choice(0, role="assistant"), choice(1, role="assistant")])),
            text_chunk("a", 0),
            text_chunk("b", 1),
            finish_chunk("length", 1),
            text_chunk("c", 0),
            finish_chunk("stop", 0),
            DONE,
        ],
        join(
            sse(chunk([choice(0, role="assistant"), choice(1, role="assistant")])),
            text_chunk("a", 0),
            text_chunk("b", 1),
            finish_chunk("length", 1),
            text_chunk("c", 0),
            finish_chunk("stop", 0),
            DONE,
        ),
        Outcome.COMPLETE,
        Reason.STOP,  # the lowest choice index decides
        check=_n2,
    ),
    Case(
        "n2-lowest-index-decides",
        [
            text_chunk("a", 0),
            text_chunk("b", 1),
            finish_chunk("length", 0),
            finish_chunk("stop", 1),
            DONE,
        ],
        join(text_chunk("a", 0), text_chunk("b", 1), finish_chunk("length", 0))
        + join(finish_chunk("stop", 1), DONE),
        Outcome.COMPLETE,
        Reason.LENGTH,
        check=_n2_lowest_length,
    ),
    Case(
        "n2-done-while-one-choice-unfinished",
        [text_chunk("a", 0), text_chunk("b", 1), finish_chunk("stop", 0), DONE],
        join(text_chunk("a", 0), text_chunk("b", 1), finish_chunk("stop", 0)),
        Outcome.INCOMPLETE,
        Reason.MISSING_FINISH,
    ),
    Case(
        "usage-chunk-with-empty-choices-forwarded",
        [HELLO, STOP, USAGE_EV, DONE],
        join(HELLO, STOP, USAGE_EV, DONE),
        Outcome.COMPLETE,
        Reason.STOP,
        check=lambda run: _usage_is(run, EXPECTED_USAGE),
    ),
    Case(
        "usage-chunk-withheld",
        [HELLO, STOP, USAGE_EV, DONE],
        join(HELLO, STOP, DONE),  # exactly the usage event's bytes are dropped
        Outcome.COMPLETE,
        Reason.STOP,
        options={"withhold_usage": True},
        check=lambda run: _usage_is(run, EXPECTED_USAGE),
    ),
    Case(
        "withhold-usage-keeps-choiceless-chunks-without-usage",
        [LATE_USAGE_FREE, HELLO, STOP, USAGE_EV, LATE_USAGE_FREE, DONE],
        join(LATE_USAGE_FREE, HELLO, STOP, LATE_USAGE_FREE, DONE),
        Outcome.COMPLETE,
        Reason.STOP,
        options={"withhold_usage": True},
    ),
    Case(
        "usage-with-choices-is-not-withheld",
        [HELLO, sse(chunk([choice(finish="stop")], usage=USAGE)), DONE],
        join(HELLO, sse(chunk([choice(finish="stop")], usage=USAGE)), DONE),
        Outcome.COMPLETE,
        Reason.STOP,
        options={"withhold_usage": True},
        check=lambda run: _usage_is(run, EXPECTED_USAGE),
    ),
    Case(
        "error-envelope",
        [ROLE, HELLO, ERROR_EV, DONE],
        join(ROLE, HELLO, ERROR_EV),  # the upstream's own error IS forwarded
        Outcome.INCOMPLETE,
        Reason.UPSTREAM_ERROR,
    ),
    Case(
        "error-named-event",
        [HELLO, b'event: error\ndata: {"message": "quota"}\n\n', DONE],
        join(HELLO, b'event: error\ndata: {"message": "quota"}\n\n'),
        Outcome.INCOMPLETE,
        Reason.UPSTREAM_ERROR,
    ),
    Case(
        "error-null-is-not-an-error",
        [sse(chunk([choice(content="a")], error=None)), STOP, DONE],
        join(sse(chunk([choice(content="a")], error=None)), STOP, DONE),
        Outcome.COMPLETE,
        Reason.STOP,
    ),
    Case(
        "invalid-json",
        [ROLE, HELLO, HEARTBEAT, BAD_JSON, STOP, DONE],
        join(ROLE, HELLO, HEARTBEAT),  # stops exactly at the start of the bad event
        Outcome.INCOMPLETE,
        Reason.INVALID_JSON,
    ),
    Case(
        "invalid-json-in-the-same-chunk-as-good-events",
        [join(ROLE, HELLO, b": c\n", b"data: {nope\n: inside\n\n", STOP, DONE)],
        join(ROLE, HELLO, b": c\n"),
        Outcome.INCOMPLETE,
        Reason.INVALID_JSON,
    ),
    *[
        Case(
            f"invalid-shape-{label}",
            [HELLO, bad, STOP, DONE],
            HELLO,
            Outcome.INCOMPLETE,
            Reason.INVALID_SHAPE,
        )
        for label, bad in INVALID_SHAPES
    ],
    Case(
        "content-after-finish",
        [ROLE, HELLO, STOP, CONTENT_AFTER, DONE],
        join(ROLE, HELLO, STOP),
        Outcome.INCOMPLETE,
        Reason.CONTENT_AFTER_FINISH,
    ),
    Case(
        "tool-arguments-after-finish",
        [ROLE, *TOOLS, TOOLS_FINISH, TOOLS[-1], DONE],
        join(ROLE, *TOOLS, TOOLS_FINISH),
        Outcome.INCOMPLETE,
        Reason.CONTENT_AFTER_FINISH,
    ),
    Case(
        "repeated-finish-without-content-is-fine",
        [HELLO, STOP, sse(chunk([choice(finish="stop")])), DONE],
        join(HELLO, STOP, sse(chunk([choice(finish="stop")])), DONE),
        Outcome.COMPLETE,
        Reason.STOP,
    ),
    Case(
        "unterminated-done-at-eof",
        [HELLO, STOP, b"data: [DONE]"],
        join(HELLO, STOP),
        Outcome.INCOMPLETE,
        Reason.MISSING_DONE,
    ),
    Case(
        "done-line-without-blank-line-at-eof",
        [HELLO, STOP, b"data: [DONE]\n"],
        join(HELLO, STOP),
        Outcome.INCOMPLETE,
        Reason.MISSING_DONE,
    ),
    Case(
        "done-with-spaces",
        [HELLO, STOP, b"data:  [DONE] \n\n"],
        join(HELLO, STOP, b"data:  [DONE] \n\n"),
        Outcome.COMPLETE,
        Reason.STOP,
    ),
    Case(
        "nothing-after-done-is-read",
        [join(HELLO, STOP, DONE, b"data: {garbage\n\n")],
        join(HELLO, STOP, DONE),
        Outcome.COMPLETE,
        Reason.STOP,
    ),
    Case(
        "line-budget",
        [HELLO, text_chunk("x" * 300), STOP, DONE],
        HELLO,
        Outcome.INCOMPLETE,
        Reason.LIMIT_EXCEEDED,
        decoder=lambda: SSEDecoder(max_line_bytes=LINE + 10),
    ),
    Case(
        "line-budget-unterminated",
        [HELLO, b"data: " + b"x" * LINE, b"y" * 20],
        HELLO,
        Outcome.INCOMPLETE,
        Reason.LIMIT_EXCEEDED,
        decoder=lambda: SSEDecoder(max_line_bytes=LINE + 10),
    ),
    Case(
        "event-budget",
        [HELLO, b"data: {\ndata: " + b" " * LINE + b"\ndata: }\n\n", STOP, DONE],
        HELLO,
        Outcome.INCOMPLETE,
        Reason.LIMIT_EXCEEDED,
        decoder=lambda: SSEDecoder(max_event_bytes=LINE),
    ),
    Case(
        "event-budget-same-chunk",
        [join(HELLO, b"data: " + b"1" * (LINE + 1) + b"\n\n", STOP, DONE)],
        HELLO,  # the whole block before the offending one is still forwarded
        Outcome.INCOMPLETE,
        Reason.LIMIT_EXCEEDED,
        decoder=lambda: SSEDecoder(max_event_bytes=LINE),
    ),
    Case(
        "stream-budget",
        [HELLO, WORLD, STOP, DONE],
        HELLO,
        Outcome.INCOMPLETE,
        Reason.LIMIT_EXCEEDED,
        max_stream_bytes=len(HELLO) + 10,
    ),
    Case(
        "stream-budget-exactly-enough",
        [HELLO, STOP, DONE],
        join(HELLO, STOP, DONE),
        Outcome.COMPLETE,
        Reason.STOP,
        max_stream_bytes=len(join(HELLO, STOP, DONE)),
    ),
    Case(
        "stream-budget-done-inside-the-budget",
        [join(HELLO, STOP, DONE, HEARTBEAT)],
        join(HELLO, STOP, DONE),
        Outcome.COMPLETE,
        Reason.STOP,
        max_stream_bytes=len(join(HELLO, STOP, DONE)) + 1,
    ),
    Case(
        "role-empty-null-refusal-logprobs-unknown-keys",
        [
            sse(chunk([choice(role="assistant", content="")])),
            sse(chunk([choice()])),
            sse(chunk([choice(content=None, refusal=None, tool_calls=None)])),
            sse(
                chunk(
                    [
                        choice(
                            content="Hi there!",
                            logprobs={"content": [{"token": "Hi", "logprob": -0.1}]},
                            annotations=[],
                            future_field={"x": 1},
                        )
                    ],
                    service_tier="default",
                    obfuscation="aGVsbG8",
                )
            ),
            sse(chunk([choice(refusal=" I can't help with that.")])),
            sse(chunk([{"index": 0, "delta": None, "finish_reason": None}])),
            sse(chunk([{"index": 0}])),
            finish_chunk("stop"),
            DONE,
        ],
        b"",  # filled in below: everything
        Outcome.COMPLETE,
        Reason.STOP,
        options={"keep_text": True},
        check=_text_kept,
    ),
]
CASES[-1].forwarded = join(*CASES[-1].parts)


def _usage_is(run: GuardRun, usage: Usage) -> None:
    assert run.verdict.usage == usage


def _run(case: Case, chunks: list[bytes]) -> GuardRun:
    contract: Contract = case.contract(**case.options)
    decoder = case.decoder() if case.decoder else None
    return run_guard(contract, chunks, decoder=decoder, max_stream_bytes=case.max_stream_bytes)


@given(data=st.data())
def test_any_partition_of_any_case_gives_the_same_result(data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(CASES), "case")
    stream = join(*case.parts)
    whole = _run(case, [stream])
    split = _run(case, random_partition(data, stream))
    assert split.output == whole.output
    assert split.verdict == whole.verdict
    assert split.guard.annotation("req-1") == whole.guard.annotation("req-1")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_chat_contract(case: Case) -> None:
    run = _run(case, case.parts)
    assert (run.verdict.outcome, run.verdict.reason) == (case.outcome, case.reason)
    assert run.output == case.forwarded
    assert run.guard.forwarded_bytes == len(case.forwarded)
    assert run.guard.done
    if case.check is not None:
        case.check(run)
    # the same bytes one at a time: same verdict, same forwarded bytes
    again = _run(case, bytewise(b"".join(case.parts)))
    assert (again.verdict.outcome, again.verdict.reason) == (case.outcome, case.reason)
    assert again.output == case.forwarded


def test_forwarded_bytes_are_whole_blocks_as_they_complete() -> None:
    guard_run = run_guard(ChatContract(), [HELLO[:10], HELLO[10:] + WORLD[:5], WORLD[5:]])
    assert guard_run.pieces == [b"", HELLO, WORLD]


def test_upstream_error_annotation_adds_no_second_error() -> None:
    run = run_guard(ChatContract(), [ROLE, HELLO, ERROR_EV, DONE])
    assert run.output == join(ROLE, HELLO, ERROR_EV)
    assert run.guard.annotation("req-42") == (
        b": gateway outcome=incomplete reason=upstream_error request_id=req-42\n"
    )
    assert run.annotated("req-42").count(b'"error"') == 1


def test_verdict_counts() -> None:
    run = run_guard(ChatContract(), [ROLE, HELLO, HEARTBEAT, WORLD, STOP, USAGE_EV, DONE])
    verdict: Verdict = run.verdict
    assert verdict.events == 6  # comments are not events
    assert verdict.content_chars == 5 + len(", world! \u4f60\u597d \U0001f642")
    assert run.guard.content_events == 2
    assert verdict.detail == ""


def test_incomplete_verdict_detail_names_no_content() -> None:
    secret = "my secret prompt text"
    run = run_guard(ChatContract(), [text_chunk(secret), b"data: {" + secret.encode() + b"\n\n"])
    assert run.verdict.reason is Reason.INVALID_JSON
    assert run.verdict.detail
    assert secret not in run.verdict.detail
    assert secret.encode() not in run.guard.annotation("r")


# -- legacy Completions ------------------------------------------------------------------


def completion(text: str | None, finish: str | None = None, index: int = 0) -> bytes:
    body: dict[str, Any] = {
        "id": "cmpl-8a",
        "object": "text_completion",
        "created": 1732890000,
        "model": "gpt-3.5-turbo-instruct",
        "choices": [{"text": text, "index": index, "logprobs": None, "finish_reason": finish}],
    }
    return sse(body)


COMPLETION_CASES: list[tuple[str, list[bytes], int, Outcome, Reason]] = [
    ("stop", [completion("Hel"), completion("lo"), completion("", "stop"), DONE], 4,
     Outcome.COMPLETE, Reason.STOP),
    ("length", [completion("Hi", "length"), DONE], 2, Outcome.COMPLETE, Reason.LENGTH),
    ("missing-done", [completion("Hi"), completion("", "stop")], 2,
     Outcome.INCOMPLETE, Reason.MISSING_DONE),
    ("missing-finish", [completion("Hi"), DONE], 1, Outcome.INCOMPLETE, Reason.MISSING_FINISH),
    ("content-after-finish", [completion("Hi", "stop"), completion("!"), DONE], 1,
     Outcome.INCOMPLETE, Reason.CONTENT_AFTER_FINISH),
    ("text-not-string", [completion("Hi"), sse({"choices": [{"index": 0, "text": 5}]}), DONE], 1,
     Outcome.INCOMPLETE, Reason.INVALID_SHAPE),
    ("null-text", [completion(None), completion("ok", "stop"), DONE], 3,
     Outcome.COMPLETE, Reason.STOP),
    ("usage", [completion("a", "stop"), sse({"choices": [], "usage": USAGE}), DONE], 3,
     Outcome.COMPLETE, Reason.STOP),
]  # fmt: skip


@pytest.mark.parametrize(
    ("parts", "forwarded_parts", "outcome", "reason"),
    [c[1:] for c in COMPLETION_CASES],
    ids=[c[0] for c in COMPLETION_CASES],
)
def test_completions_contract(
    parts: list[bytes], forwarded_parts: int, outcome: Outcome, reason: Reason
) -> None:
    run = run_guard(CompletionsContract(keep_text=True), parts)
    assert (run.verdict.outcome, run.verdict.reason) == (outcome, reason)
    assert run.output == b"".join(parts[:forwarded_parts])


def test_completions_text_and_usage() -> None:
    contract = CompletionsContract(keep_text=True)
    parts = [completion("Hel"), completion("lo", index=1), completion("lo"), completion("", "stop")]
    parts += [completion("", "stop", index=1), sse({"choices": [], "usage": USAGE}), DONE]
    run = run_guard(contract, parts)
    assert run.verdict.complete
    assert contract.text(0) == "Hello"
    assert contract.text(1) == "lo"
    assert run.verdict.usage == EXPECTED_USAGE
    assert run.verdict.content_chars == 7
    assert contract.protocol == "completions"


def test_chat_delta_text_is_ignored_by_completions_and_vice_versa() -> None:
    chat_in_completions = run_guard(CompletionsContract(), [HELLO, STOP, DONE])
    assert chat_in_completions.verdict.content_chars == 0
    completions_in_chat = run_guard(ChatContract(), [completion("Hi", "stop"), DONE])
    assert completions_in_chat.verdict.content_chars == 0
    assert completions_in_chat.verdict.complete


# -- what real providers send (found in review) ------------------------------------


def _tool(
    index: int | None, call_id: str | None, name: str | None, arguments: str
) -> dict[str, object]:
    call: dict[str, object] = {"type": "function", "function": {"arguments": arguments}}
    if index is not None:
        call["index"] = index
    if call_id is not None:
        call["id"] = call_id
    if name is not None:
        call["function"] = {"name": name, "arguments": arguments}
    return call


def _tools_chunk(*calls: dict[str, object]) -> bytes:
    return sse(chunk([choice(0, tool_calls=list(calls))]))


@pytest.mark.parametrize("raw", ["abort", "error", "insufficient_system_resource"])
def test_error_finish_reasons_then_done_are_an_upstream_error(raw: str) -> None:
    stream = join(role_chunk(), text_chunk("The answer is"), finish_chunk(raw), DONE)
    run = run_guard(ChatContract(), [stream])
    assert (run.verdict.outcome, run.verdict.reason) == (Outcome.INCOMPLETE, Reason.UPSTREAM_ERROR)
    # [DONE] is withheld, so the SDK reads our error event before the end of the stream
    assert run.output == stream[: -len(DONE)]
    assert b'"code":"upstream_error"' in run.guard.annotation("r")


def test_empty_string_finish_reason_means_not_finished() -> None:
    def piece(text: str, finish: str | None) -> bytes:
        return sse(chunk([{"index": 0, "delta": {"content": text}, "finish_reason": finish}]))

    stream = join(piece("Hel", ""), piece("lo", ""), piece("", "stop"), DONE)
    run = run_guard(ChatContract(keep_text=True), [stream])
    assert (run.verdict.outcome, run.verdict.reason) == (Outcome.COMPLETE, Reason.STOP)
    assert run.output == stream


def test_tool_calls_without_index_are_told_apart_by_id() -> None:
    stream = join(
        _tools_chunk(_tool(None, "call_1", "f", '{"x":')),
        _tools_chunk(_tool(None, None, None, "1}")),
        _tools_chunk(_tool(None, "call_2", "g", '{"y":2}')),
        finish_chunk("tool_calls"),
        DONE,
    )
    contract = ChatContract()
    run = run_guard(contract, [stream])
    assert run.verdict.reason is Reason.TOOL_CALLS
    assert contract.tool_call_arguments() == [
        ("call_1", "f", '{"x":1}'),
        ("call_2", "g", '{"y":2}'),
    ]


def test_tool_calls_sharing_index_zero_with_distinct_ids_are_two_calls() -> None:
    stream = join(
        _tools_chunk(_tool(0, "call_a", "f", '{"x"')),
        _tools_chunk(_tool(0, None, None, ":1}")),
        _tools_chunk(_tool(0, "call_b", "g", '{"y":2}')),
        finish_chunk("tool_calls"),
        DONE,
    )
    contract = ChatContract()
    run = run_guard(contract, [stream])
    assert run.verdict.reason is Reason.TOOL_CALLS
    assert [args for _, _, args in contract.tool_call_arguments()] == ['{"x":1}', '{"y":2}']


def test_a_tool_without_parameters_may_send_empty_arguments() -> None:
    stream = join(_tools_chunk(_tool(0, "call_1", "now", "")), finish_chunk("tool_calls"), DONE)
    run = run_guard(ChatContract(), [stream])
    assert (run.verdict.outcome, run.verdict.reason) == (Outcome.COMPLETE, Reason.TOOL_CALLS)


def test_tool_arguments_cut_by_length_are_a_complete_length_stream() -> None:
    stream = join(_tools_chunk(_tool(0, "call_1", "f", '{"a": "lo')), finish_chunk("length"), DONE)
    run = run_guard(ChatContract(), [stream])
    assert (run.verdict.outcome, run.verdict.reason) == (Outcome.COMPLETE, Reason.LENGTH)
    assert run.output == stream


# -- termination = "finish": a clean end once every choice finished --------------------------


@pytest.mark.parametrize(
    ("parts", "outcome", "reason"),
    [
        ([ROLE, HELLO, STOP, USAGE_EV], Outcome.COMPLETE, Reason.STOP),
        ([ROLE, HELLO, finish_chunk("length")], Outcome.COMPLETE, Reason.LENGTH),
        ([ROLE, HELLO, STOP, USAGE_EV, DONE], Outcome.COMPLETE, Reason.STOP),
        # still as strict as ever: an unfinished choice, nothing at all, an unfinished
        # event, an error finish
        ([ROLE, HELLO], Outcome.INCOMPLETE, Reason.MISSING_DONE),
        ([], Outcome.INCOMPLETE, Reason.MISSING_DONE),
        ([ROLE, HELLO, STOP, USAGE_EV[:-1]], Outcome.INCOMPLETE, Reason.MISSING_DONE),
        ([ROLE, HELLO, STOP, b"data: {"], Outcome.INCOMPLETE, Reason.MISSING_DONE),
        ([ROLE, HELLO, finish_chunk("error")], Outcome.INCOMPLETE, Reason.UPSTREAM_ERROR),
    ],
)
def test_termination_finish_accepts_a_clean_end_after_every_choice_finished(
    parts: list[bytes], outcome: Outcome, reason: Reason
) -> None:
    run = run_guard(ChatContract(end_on_finish=True), parts)
    assert (run.verdict.outcome, run.verdict.reason) == (outcome, reason)
    # without the route key, the same clean end is missing_done
    if outcome is Outcome.COMPLETE and DONE not in parts:
        strict = run_guard(ChatContract(), parts)
        assert strict.verdict.reason is Reason.MISSING_DONE
        # the annotation is still appended, with the reason from the finish
        assert run.annotated().endswith(f"reason={reason} request_id=req-1\n".encode())


def test_termination_finish_applies_to_completions_too() -> None:
    parts = [completion("Hi"), completion(None, "stop")]
    run = run_guard(CompletionsContract(end_on_finish=True), parts)
    assert (run.verdict.outcome, run.verdict.reason) == (Outcome.COMPLETE, Reason.STOP)
