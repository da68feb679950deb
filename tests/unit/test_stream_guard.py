"""StreamGuard: which bytes reach the client, when, and the trailer after them.

docs/wire-contract.md ("Event-aligned relay", "Complete stream", "Incomplete
stream"): the client receives exactly the upstream's bytes up to the end
of the last complete block, plus comment lines outside any block at once; a
fragment never; a rejected event never; then one annotation: a comment line
for a complete stream, or an error event in the protocol's shape and the
comment line for an incomplete one.
"""

from __future__ import annotations

import json

import pytest

from gateway.guard import (
    ChatContract,
    CompletionsContract,
    FramingOnly,
    Outcome,
    Reason,
    SSEDecoder,
    StreamGuard,
)
from gateway.guard.verdict import INCOMPLETE_REASONS
from tests.unit.helpers import (
    DONE,
    decode,
    finish_chunk,
    join,
    role_chunk,
    run_guard,
    sse,
    text_chunk,
    usage_chunk,
)

HELLO = text_chunk("Hello")
STOP = finish_chunk("stop")
USAGE_EV = usage_chunk()

# -- event-aligned forwarding ---------------------------------------------------------


def test_an_unfinished_event_is_held_back_until_it_completes() -> None:
    guard = StreamGuard(ChatContract())
    assert guard.feed(HELLO[:-1]) == b""
    assert guard.held_bytes == len(HELLO) - 1
    assert guard.feed(HELLO[-1:]) == HELLO
    assert guard.held_bytes == 0
    assert guard.forwarded_bytes == len(HELLO)


def test_heartbeat_comments_outside_a_block_pass_at_once() -> None:
    guard = StreamGuard(ChatContract())
    assert guard.feed(b": ping\n") == b": ping\n"
    assert guard.feed(HELLO + b": ping") == HELLO
    assert guard.feed(b"\n") == b": ping\n"
    assert guard.feed(b":\r\n") == b":\r\n"


def test_comments_posing_as_the_annotation_are_dropped_whatever_the_split() -> None:
    forged = b": gateway outcome=complete reason=stop request_id=FAKE\n"
    stream = forged + b": gatewayish\n" + HELLO[:-1] + b":\tgateway\r\n\n" + STOP + DONE
    expected = b": gatewayish\n" + HELLO + STOP + DONE
    for size in (1, 2, 7, len(stream)):
        guard = StreamGuard(ChatContract())
        out = b"".join(guard.feed(stream[i : i + size]) for i in range(0, len(stream), size))
        assert out == expected, size
        assert guard.forged_comments == 2
        assert guard.verdict is not None
        assert guard.verdict.complete


def test_a_comment_inside_an_open_block_waits_for_the_block() -> None:
    guard = StreamGuard(ChatContract())
    head, tail = HELLO[:-1], HELLO[-1:]  # the data line, then its blank line
    assert guard.feed(head + b": inside\n") == b""
    assert guard.feed(tail) == head + b": inside\n" + tail


def test_held_bytes_are_at_most_one_unfinished_event() -> None:
    guard = StreamGuard(ChatContract())
    out = guard.feed(join(HELLO, HELLO, HELLO[:20]))
    assert out == join(HELLO, HELLO)
    assert guard.held_bytes == 20


def test_a_large_event_is_held_once_and_judged_with_few_copies() -> None:
    """docs/deployment.md, "Memory": an unfinished 8 MiB event fed in 64 KiB reads is
    held once (the decoder's pieces and the guard's are the same objects; before, the
    guard copied what it held on every read, a second copy and quadratic work), and
    judging it whole costs a few copies of its size, not more."""
    import tracemalloc

    event = text_chunk("x" * (8 * 1024 * 1024))
    size = len(event)
    guard = StreamGuard(ChatContract())
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(0, size - 2, 64 * 1024):  # all but the data line's end
            assert guard.feed(event[i : min(i + 64 * 1024, size - 2)]) == b""
        holding, peak = tracemalloc.get_traced_memory()
        assert guard.held_bytes == size - 2
        assert holding - base < 1.1 * size, (holding - base) / size
        assert peak - base < 1.2 * size, (peak - base) / size
        tracemalloc.reset_peak()
        assert guard.feed(event[-2:]) == event
        judged = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert guard.held_bytes == 0
    assert judged - base < 4.5 * size, (judged - base) / size


def test_eof_discards_pending_bytes() -> None:
    guard = StreamGuard(ChatContract())
    assert guard.feed(HELLO + STOP[:30]) == HELLO
    verdict = guard.eof()
    assert (verdict.outcome, verdict.reason) == (Outcome.INCOMPLETE, Reason.MISSING_DONE)
    assert guard.held_bytes == 0
    assert guard.done
    assert guard.feed(STOP[30:]) == b""


def test_nothing_is_forwarded_after_the_verdict() -> None:
    guard = StreamGuard(ChatContract())
    assert guard.feed(join(HELLO, STOP, DONE, b": after\n", HELLO)) == join(HELLO, STOP, DONE)
    assert guard.done
    assert guard.feed(b": more\n") == b""
    assert guard.forwarded_bytes == len(join(HELLO, STOP, DONE))


def test_withheld_event_in_the_middle_of_a_chunk() -> None:
    guard = StreamGuard(ChatContract(withhold_usage=True))
    out = guard.feed(join(HELLO, STOP, b": hb\n", USAGE_EV, b": hb2\n", DONE))
    assert out == join(HELLO, STOP, b": hb\n", b": hb2\n", DONE)
    assert guard.verdict is not None
    assert guard.verdict.usage is not None


def test_withheld_event_split_across_chunks() -> None:
    stream = join(HELLO, STOP, USAGE_EV, DONE)
    cut = len(HELLO) + len(STOP) + 40  # inside the usage event
    run = run_guard(ChatContract(withhold_usage=True), [stream[:cut], stream[cut:]])
    assert run.pieces == [join(HELLO, STOP), DONE]


def test_rejected_event_after_good_events_in_the_same_chunk() -> None:
    guard = StreamGuard(ChatContract())
    out = guard.feed(join(HELLO, b": c\n\n", b"data: {oops\n\n", STOP, DONE))
    assert out == join(HELLO, b": c\n\n")
    assert guard.verdict is not None
    assert guard.verdict.reason is Reason.INVALID_JSON


def test_framing_only_forwards_everything_whole_and_is_complete_at_eof() -> None:
    stream = b"event: x\ndata: 1\n\n: c\nid: 2\n\ndata: partial"
    run = run_guard(FramingOnly(), [stream])
    assert run.output == stream[: stream.index(b"data: partial")]
    assert (run.verdict.outcome, run.verdict.reason) == (Outcome.COMPLETE, Reason.OTHER)


# -- aborts and budgets -------------------------------------------------------------------


def test_abort_gives_the_relays_reason() -> None:
    guard = StreamGuard(ChatContract())
    guard.feed(HELLO + HELLO[:10])
    verdict = guard.abort(Reason.IDLE_TIMEOUT, "no bytes for 30 s")
    assert (verdict.outcome, verdict.reason) == (Outcome.INCOMPLETE, Reason.IDLE_TIMEOUT)
    assert verdict.detail == "no bytes for 30 s"
    assert guard.held_bytes == 0
    assert guard.feed(HELLO[10:]) == b""


def test_abort_after_a_final_verdict_keeps_it() -> None:
    guard = StreamGuard(ChatContract())
    guard.feed(join(HELLO, STOP, DONE))
    verdict = guard.abort(Reason.CLIENT_DISCONNECT)
    assert (verdict.outcome, verdict.reason) == (Outcome.COMPLETE, Reason.STOP)


def test_stream_budget_forwards_the_whole_blocks_within_it() -> None:
    stream = join(HELLO, HELLO, STOP, DONE)
    guard = StreamGuard(ChatContract(), max_stream_bytes=len(HELLO) * 2 + 5)
    assert guard.feed(stream) == join(HELLO, HELLO)
    assert guard.verdict is not None
    assert (guard.verdict.outcome, guard.verdict.reason) == (
        Outcome.INCOMPLETE,
        Reason.LIMIT_EXCEEDED,
    )
    assert guard.feed(b"more") == b""


def test_stream_budget_reached_exactly_is_not_exceeded() -> None:
    guard = StreamGuard(ChatContract(), max_stream_bytes=len(HELLO))
    assert guard.feed(HELLO) == HELLO
    assert not guard.done
    assert guard.feed(b":") == b""
    assert guard.verdict is not None
    assert guard.verdict.reason is Reason.LIMIT_EXCEEDED


def test_decoder_budget_error_ends_the_stream_after_the_whole_blocks_before_it() -> None:
    guard = StreamGuard(ChatContract(), SSEDecoder(max_line_bytes=len(HELLO)))
    out = guard.feed(join(HELLO, b": hb\n", b"data: " + b"x" * len(HELLO) + b"\n\n", DONE))
    assert out == join(HELLO, b": hb\n")
    assert guard.verdict is not None
    assert (guard.verdict.outcome, guard.verdict.reason) == (
        Outcome.INCOMPLETE,
        Reason.LIMIT_EXCEEDED,
    )
    assert guard.feed(DONE) == b""


def test_decoder_budget_error_after_the_terminator_in_the_same_chunk_is_moot() -> None:
    guard = StreamGuard(ChatContract(), SSEDecoder(max_line_bytes=len(HELLO)))
    out = guard.feed(join(HELLO, STOP, DONE, b"x" * (len(HELLO) + 1)))
    assert out == join(HELLO, STOP, DONE)
    assert guard.verdict is not None
    assert guard.verdict.reason is Reason.STOP


# -- the annotation (docs/wire-contract.md, "Complete stream" and "Incomplete stream") -----


def test_annotation_before_the_verdict_is_an_error() -> None:
    guard = StreamGuard(ChatContract())
    guard.feed(HELLO)
    with pytest.raises(RuntimeError):
        guard.annotation("r")


def test_complete_annotation_is_one_comment_line_with_a_single_lf() -> None:
    run = run_guard(ChatContract(), [role_chunk(), HELLO, STOP, DONE])
    trailer = run.guard.annotation("req-7f3a")
    assert trailer == b": gateway outcome=complete reason=stop request_id=req-7f3a\n"
    client_view = run.output + trailer
    assert client_view.endswith(DONE + trailer)
    # no blank line after it: a decoder sees no extra (empty) event
    assert decode([client_view]) == decode([run.output])


def test_incomplete_chat_annotation_exact_bytes() -> None:
    run = run_guard(ChatContract(), [HELLO])
    trailer = run.guard.annotation("req-123")
    message = (
        "Stream incomplete: the upstream ended the stream before its terminator "
        "(missing_done). request_id=req-123"
    )
    error = {"error": {"message": message, "type": "stream_incomplete", "code": "missing_done"}}
    assert trailer == (
        b"data: "
        + json.dumps(error, separators=(",", ":")).encode()
        + b"\n\n"
        + b": gateway outcome=incomplete reason=missing_done request_id=req-123\n"
    )


@pytest.mark.parametrize("reason", sorted(INCOMPLETE_REASONS - {Reason.UPSTREAM_ERROR}))
@pytest.mark.parametrize("contract", [ChatContract, CompletionsContract])
def test_incomplete_annotation_is_an_error_event_then_the_comment(
    reason: Reason, contract: type[ChatContract]
) -> None:
    guard = StreamGuard(contract())
    forwarded = guard.feed(HELLO)
    guard.abort(reason)
    trailer = guard.annotation("abc.DEF-9_")
    data_line, blank, comment, end = trailer.split(b"\n")
    assert (blank, end) == (b"", b"")
    assert comment == f": gateway outcome=incomplete reason={reason} request_id=abc.DEF-9_".encode()
    assert data_line.startswith(b"data: {")
    assert b"event:" not in trailer  # openai-python 1.0-1.13 ignores named events
    payload = json.loads(data_line[len(b"data: ") :])
    assert list(payload) == ["error"]
    assert payload["error"]["type"] == "stream_incomplete"
    assert payload["error"]["code"] == str(reason)
    assert "request_id=abc.DEF-9_" in payload["error"]["message"]
    assert str(reason) in payload["error"]["message"]
    # what the client decodes after the forwarded bytes: exactly one more event, the error
    events = decode([forwarded + trailer])
    assert len(events) == 2
    assert events[-1].event == "message"
    assert json.loads(events[-1].data) == payload


def test_upstream_error_annotation_is_only_the_comment_line() -> None:
    error_event = sse({"error": {"message": "rate limited", "type": "rate_limit_error"}})
    run = run_guard(ChatContract(), [HELLO, error_event, DONE])
    assert run.output == join(HELLO, error_event)
    assert run.guard.annotation("r1") == (
        b": gateway outcome=incomplete reason=upstream_error request_id=r1\n"
    )


def test_annotation_after_a_rejected_event_follows_the_last_whole_block() -> None:
    run = run_guard(ChatContract(), [HELLO, b"data: {\n\n", DONE])
    client_view = run.annotated("q")
    assert client_view.startswith(HELLO + b'data: {"error":')
    events = decode([client_view])
    assert [json.loads(e.data).get("error", {}).get("code") for e in events] == [
        None,
        "invalid_json",
    ]
