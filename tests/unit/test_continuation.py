"""Continuation, the pure parts: the request builders per style, and the joint that
rewrites a continuation's events onto the original stream (unit and property tests).

The property: whatever the answer's text and wherever it was cut, the original's
events up to the cut plus the rewritten continuation make one valid stream (its own
contract says complete) whose text is the whole answer, nothing repeated or lost,
and the joint's output does not depend on how the continuation's bytes are split.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.guard import ChatContract, MessagesContract, Outcome, Protocol, Reason, Usage
from gateway.guard.joint import ChatJoint, MessagesJoint
from gateway.protocols.continuation import ContinuationStyle, continuation_request
from tests.unit.helpers import (
    DONE,
    choice,
    chunk,
    random_partition,
    role_chunk,
    run_guard,
    sse,
    text_chunk,
)

CHAT_REQUEST: dict[str, Any] = {
    "model": "m",
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
}
NO_USAGE = Usage()

# -- the builders ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("style", "message", "extra"),
    [
        (ContinuationStyle.ASSISTANT_PREFILL, {"role": "assistant", "content": "Hello wo"}, {}),
        (
            ContinuationStyle.PREFIX,
            {"role": "assistant", "content": "Hello wo", "prefix": True},
            {},
        ),
        (
            ContinuationStyle.CONTINUE_FINAL_MESSAGE,
            {"role": "assistant", "content": "Hello wo"},
            {"continue_final_message": True, "add_generation_prompt": False},
        ),
    ],
)
def test_a_chat_continuation_appends_the_partial_answer_in_the_upstreams_style(
    style: ContinuationStyle, message: dict[str, Any], extra: dict[str, Any]
) -> None:
    built = continuation_request(Protocol.CHAT, style, CHAT_REQUEST, "Hello wo")
    assert built is not None
    assert built.body == {
        **CHAT_REQUEST,
        "messages": [*CHAT_REQUEST["messages"], message],
        **extra,
    }
    assert built.skip == ""
    assert CHAT_REQUEST["messages"] == [{"role": "user", "content": "hi"}]  # not mutated


def test_a_clients_own_prefill_is_extended_not_repeated() -> None:
    request = {
        **CHAT_REQUEST,
        "messages": [*CHAT_REQUEST["messages"], {"role": "assistant", "content": "{"}],
    }
    built = continuation_request(Protocol.CHAT, ContinuationStyle.ASSISTANT_PREFILL, request, '"a"')
    assert built is not None
    assert built.body["messages"][-1] == {"role": "assistant", "content": '{"a"'}
    assert len(built.body["messages"]) == 2


def test_a_messages_prefill_loses_its_trailing_whitespace_and_the_joint_skips_it() -> None:
    request = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    built = continuation_request(
        Protocol.MESSAGES, ContinuationStyle.ASSISTANT_PREFILL, request, "Hello world \n"
    )
    assert built is not None
    assert built.body["messages"][-1] == {"role": "assistant", "content": "Hello world"}
    assert built.skip == " \n"


def test_legacy_completions_append_the_text_to_the_prompt() -> None:
    request = {"model": "m", "prompt": "Say: ", "stream": True}
    built = continuation_request(
        Protocol.COMPLETIONS, ContinuationStyle.ASSISTANT_PREFILL, request, "Hello"
    )
    assert built is not None
    assert built.body["prompt"] == "Say: Hello"


@pytest.mark.parametrize(
    ("protocol", "style", "request_body"),
    [
        (Protocol.CHAT, ContinuationStyle.NONE, CHAT_REQUEST),
        (Protocol.RESPONSES, ContinuationStyle.ASSISTANT_PREFILL, {"input": "hi"}),
        (Protocol.GEMINI, ContinuationStyle.ASSISTANT_PREFILL, {"contents": []}),
        (Protocol.CHAT, ContinuationStyle.ASSISTANT_PREFILL, {"messages": "not a list"}),
        (Protocol.COMPLETIONS, ContinuationStyle.PREFIX, {"prompt": ["a", "b"]}),
    ],
)
def test_what_is_not_continued(
    protocol: Protocol, style: ContinuationStyle, request_body: dict[str, Any]
) -> None:
    assert continuation_request(protocol, style, request_body, "text") is None


# -- the Chat joint -----------------------------------------------------------------------------

PIECES = st.lists(
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
        min_size=1,
        max_size=6,
    ),
    min_size=2,
    max_size=12,
)


def chat_stream(pieces: list[str], chunk_id: str, *, role: bool = True) -> list[bytes]:
    events = [role_chunk()] if role else []
    events += [sse(chunk([choice(0, content=p)], id=chunk_id, created=7)) for p in pieces]
    events += [sse(chunk([choice(0, "stop")], id=chunk_id, created=7)), DONE]
    return events


def chat_text(stream: bytes) -> str:
    text = []
    for line in stream.split(b"\n"):
        if line.startswith(b"data: {"):
            for c in json.loads(line[6:])["choices"]:
                text.append(c.get("delta", {}).get("content") or "")
    return "".join(text)


@given(pieces=PIECES, data=st.data())
def test_a_chat_continuation_joins_the_original_exactly(pieces: list[str], data: Any) -> None:
    cut = data.draw(st.integers(1, len(pieces) - 1), "cut")
    before = b"".join([role_chunk(), *(text_chunk(p) for p in pieces[:cut])])
    continuation = b"".join(chat_stream(pieces[cut:], "chatcmpl-other"))
    original = ChatContract(keep_text=True)
    run_guard(original, [before])
    joint = ChatJoint(dict(original.first_ids), NO_USAGE)
    whole = joint.rewrite(continuation)
    split = ChatJoint(dict(original.first_ids), NO_USAGE)
    parts = random_partition(data, continuation)
    assert b"".join(split.rewrite(p) for p in parts) == whole
    joined = before + whole
    assert chat_text(joined) == "".join(pieces)
    deltas = [
        c.get("delta", {})
        for line in joined.split(b"\n")
        if line.startswith(b"data: {")
        for c in json.loads(line[6:])["choices"]
    ]
    assert sum("role" in d for d in deltas) == 1  # (a text may say "role" itself)
    ids = {
        json.loads(line[6:])["id"] for line in joined.split(b"\n") if line.startswith(b"data: {")
    }
    assert len(ids) == 1
    run = run_guard(ChatContract(), [joined])
    assert (run.verdict.outcome, run.verdict.reason) == (Outcome.COMPLETE, Reason.STOP)


def test_the_chat_joint_sums_the_usage_of_the_cut_attempt() -> None:
    usage = {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35}
    joint = ChatJoint({"id": "x"}, Usage(input_tokens=10, output_tokens=3))
    out = joint.rewrite(sse(chunk([], usage=usage)))
    assert json.loads(out[6:])["usage"] == {
        "prompt_tokens": 40,
        "completion_tokens": 8,
        "total_tokens": 48,
    }


# -- the Messages joint --------------------------------------------------------------------------


def messages_event(kind: str, **fields: Any) -> bytes:
    return sse({"type": kind, **fields}, event=kind)


START = messages_event(
    "message_start",
    message={
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "m",
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 1},
    },
)


def block_start(index: int) -> bytes:
    return messages_event(
        "content_block_start", index=index, content_block={"type": "text", "text": ""}
    )


def text_delta(index: int, text: str) -> bytes:
    return messages_event(
        "content_block_delta", index=index, delta={"type": "text_delta", "text": text}
    )


def messages_tail(index: int) -> list[bytes]:
    return [
        messages_event("content_block_stop", index=index),
        messages_event(
            "message_delta",
            delta={"stop_reason": "end_turn", "stop_sequence": None},
            usage={"output_tokens": 9},
        ),
        messages_event("message_stop"),
    ]


@given(pieces=PIECES, data=st.data())
def test_a_messages_continuation_goes_on_with_the_open_block(pieces: list[str], data: Any) -> None:
    cut = data.draw(st.integers(1, len(pieces) - 1), "cut")
    earlier = data.draw(st.booleans(), "an earlier, closed text block")
    first: list[bytes] = [START]
    open_index = 0
    if earlier:
        first += [block_start(0), text_delta(0, "x"), messages_event("content_block_stop", index=0)]
        open_index = 1
    first += [block_start(open_index), *(text_delta(open_index, p) for p in pieces[:cut])]
    before = b"".join(first)
    original = MessagesContract(keep_text=True)
    run_guard(original, [before])
    assert original.continuable()
    assert original.open_block == open_index
    continuation = b"".join(
        [START, block_start(0), *(text_delta(0, p) for p in pieces[cut:]), *messages_tail(0)]
    )
    whole = MessagesJoint(original.open_block, Usage(output_tokens=2)).rewrite(continuation)
    again = MessagesJoint(original.open_block, Usage(output_tokens=2))
    parts = random_partition(data, continuation)
    assert b"".join(again.rewrite(p) for p in parts) == whole
    run = run_guard(MessagesContract(keep_text=True), [before + whole])
    assert (run.verdict.outcome, run.verdict.reason) == (Outcome.COMPLETE, Reason.STOP)
    assert run.guard.contract.text() == ("x" if earlier else "") + "".join(pieces)  # type: ignore[attr-defined]
    assert (before + whole).count(b"event: message_start") == 1
    assert run.verdict.usage is not None
    assert run.verdict.usage.output_tokens == 11  # the continuation's 9, the cut's 2


def test_the_joint_takes_off_once_what_the_prefill_lost() -> None:
    joint = MessagesJoint(0, NO_USAGE)
    joint.skip_text(" \n")
    out = joint.rewrite(
        b"".join([START, block_start(0), text_delta(0, " "), text_delta(0, "\nok ")])
    )
    assert json.loads(out.split(b"data: ")[1])["delta"]["text"] == "ok "
    assert out.count(b"event: content_block_delta") == 1


def test_a_cut_inside_a_tool_call_or_with_two_choices_is_not_continuable() -> None:
    tool = sse(
        chunk(
            [
                choice(
                    0,
                    tool_calls=[
                        {
                            "index": 0,
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{"},
                        }
                    ],
                )
            ]
        )
    )
    contract = ChatContract(keep_text=True)
    run_guard(contract, [role_chunk(), text_chunk("a"), tool])
    assert not contract.continuable()
    two = ChatContract(keep_text=True)
    run_guard(two, [role_chunk(), text_chunk("a"), text_chunk("b", index=1)])
    assert not two.continuable()
    refusal = ChatContract(keep_text=True)
    run_guard(refusal, [role_chunk(), sse(chunk([choice(0, refusal="no")]))])
    assert not refusal.continuable()
    plain = ChatContract(keep_text=True)
    run_guard(plain, [role_chunk(), text_chunk("a")])
    assert plain.continuable()


def test_a_continuation_that_starts_with_a_tool_call_closes_the_open_text_block_first() -> None:
    before = b"".join([START, block_start(0), text_delta(0, "Let me check. ")])
    tool_start = messages_event(
        "content_block_start",
        index=0,
        content_block={"type": "tool_use", "id": "t1", "name": "f", "input": {}},
    )
    tool_input = messages_event(
        "content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": "{}"}
    )
    continuation = b"".join(
        [
            START,
            tool_start,
            tool_input,
            messages_event("content_block_stop", index=0),
            messages_event(
                "message_delta",
                delta={"stop_reason": "tool_use", "stop_sequence": None},
                usage={"output_tokens": 9},
            ),
            messages_event("message_stop"),
        ]
    )
    whole = MessagesJoint(0, NO_USAGE).rewrite(continuation)
    run = run_guard(MessagesContract(keep_text=True), [before + whole])
    assert (run.verdict.outcome, run.verdict.reason) == (Outcome.COMPLETE, Reason.TOOL_CALLS)
    assert run.guard.contract.tool_call_arguments() == [("t1", "f", "{}")]  # type: ignore[attr-defined]


# -- the joint check ---------------------------------------------------------------------------

from gateway.guard.joint import Check, JointCheck, dumps_utf8  # noqa: E402
from gateway.proxy.request_body import continuation_body  # noqa: E402

ANSWER = "The quick brown fox jumps over the lazy dog and runs away. "


def _check(before: str, pieces: list[str], **kw: Any) -> tuple[Check, str]:
    check = JointCheck(before, **kw)
    out = "".join(check.text(p) for p in pieces)
    return check.end(had_content=bool(pieces)), out


@given(st.integers(1, len(ANSWER) - 1), st.data())
def test_a_continuation_is_honoured_at_once_and_a_restart_is_not(cut: int, data: Any) -> None:
    before, rest = ANSWER[:cut], ANSWER[cut:]
    check = JointCheck(before)
    # a continuation that does not begin like the answer is released at its first text
    if not before.startswith(rest[:1]):
        assert check.text(rest) == rest
        assert check.state is Check.HONOURED
    # one that starts the answer again, split anywhere, is not honoured
    restart = JointCheck(before)
    whole = ANSWER
    at = 0
    for size in data.draw(st.lists(st.integers(1, 7), min_size=1, max_size=12)):
        restart.text(whole[at : at + size])
        at += size
    restart.text(whole[at:])
    assert restart.end(had_content=True) is Check.RESTARTED


def test_an_empty_continuation_is_not_honoured_unless_the_answer_had_finished() -> None:
    assert _check("Hello ", []) == (Check.EMPTY, "")
    assert _check("Hello ", [], finished=True) == (Check.HONOURED, "")
    # text after an answer that had finished: it was not a continuation
    assert _check("Hello ", ["more"], finished=True)[0] is Check.OVERRUN
    # a short continuation that only repeats the answer's beginning
    assert _check("Hello there, friend. ", ["Hello"])[0] is Check.RESTARTED
    assert _check("Hello there, friend. ", ["world"])[0] is Check.HONOURED


def test_a_regenerated_answer_is_released_only_past_what_the_client_has() -> None:
    state, out = _check("The quick ", ["The ", "qu", "ick brown", " fox"], regenerate=True)
    assert (state, out) == (Check.HONOURED, "brown fox")
    state, out = _check("The quick ", ["The ", "slow", " fox"], regenerate=True)
    assert (state, out) == (Check.DIVERGED, "")
    # it ended before it had covered what the client has
    assert _check("The quick ", ["The "], regenerate=True)[0] is Check.DIVERGED


def test_a_chat_joint_with_a_regenerated_answer_relays_only_the_rest() -> None:
    joint = ChatJoint({"id": "orig"}, NO_USAGE)
    joint.expect(JointCheck("Hello wor", regenerate=True))
    data = (
        role_chunk()
        + text_chunk("Hello ")
        + text_chunk("world")
        + sse(chunk([choice(0, "stop")]))
        + DONE
    )
    out = joint.rewrite(data)
    texts = [
        c["delta"].get("content", "")
        for line in out.split(b"\n")
        if line.startswith(b"data: {")
        for c in json.loads(line[6:])["choices"]
    ]
    assert "".join(texts) == "ld"
    assert b'"id":"orig"' in out
    assert b'"role"' not in out


def test_lone_surrogates_are_written_as_their_escape_and_the_rest_as_utf8() -> None:
    assert dumps_utf8({"t": "a\ud83d é"}) == '{"t":"a\\ud83d é"}'.encode()
    assert json.loads(dumps_utf8({"t": "a\ud83d é"})) == {"t": "a\ud83d é"}
    joint = ChatJoint({"id": "x"}, NO_USAGE)
    out = joint.rewrite(
        b'data: {"id":"y","choices":[{"index":0,"delta":{"content":"\\ud83d!"}}]}\n\n'
    )
    assert out == b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"\\ud83d!"}}]}\n\n'


@pytest.mark.parametrize(
    "style", [ContinuationStyle.ASSISTANT_PREFILL, ContinuationStyle.REGENERATE]
)
def test_the_continuation_body_is_built_from_the_bytes_with_a_surrogate_and_a_model(
    style: ContinuationStyle,
) -> None:
    body = json.dumps(CHAT_REQUEST).encode()
    built = continuation_body(body, Protocol.CHAT, style, "Hi \ud83d", "mapped")
    assert built is not None
    content, skip = built
    doc = json.loads(content)
    assert doc["model"] == "mapped"
    if style is ContinuationStyle.REGENERATE:
        assert doc["messages"] == CHAT_REQUEST["messages"]
    else:
        assert doc["messages"][-1] == {"role": "assistant", "content": "Hi \ud83d"}
        assert b"\\ud83d" in content
    assert skip == ""
    assert continuation_body(b"not json", Protocol.CHAT, style, "x", None) is None


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True) if b > a]


@given(
    st.text("ab ", min_size=1, max_size=40),
    st.text("ab ", max_size=40),
    st.lists(st.integers(0, 80), max_size=8),
    st.booleans(),
)
def test_the_joint_check_does_not_depend_on_how_the_text_is_split(
    before: str, after: str, cuts: list[int], regenerate: bool
) -> None:
    whole = JointCheck(before, regenerate=regenerate)
    whole_out = whole.text(after) if after else ""
    whole_state = whole.end(had_content=bool(after))
    split = JointCheck(before, regenerate=regenerate)
    split_out = "".join(split.text(piece) for piece in _split(after, cuts))
    assert split.end(had_content=bool(after)) is whole_state
    assert split_out == whole_out
    if regenerate and whole_state is Check.HONOURED:
        assert before + whole_out == after  # exactly the rest, after what the client has
