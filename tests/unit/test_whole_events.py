"""The guard hands its readers whole events (gateway.guard.whole), any partition alike.

What a stream's readers (a resume log, the cache's entry, a schema check) get is
the bytes the client got, cut where the decoder says each event ends: an SSE
block with what came before it (a comment-only block too), an NDJSON line, a
binary frame. A reader that refuses an event ends the stream before it.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from gateway.guard import (
    BedrockContract,
    ChatContract,
    Event,
    FramingOnly,
    OllamaContract,
    Outcome,
    Reason,
    Refusal,
    StreamGuard,
    WholeEvents,
)
from tests.unit.bedrock_streams import converse, text_block
from tests.unit.helpers import DONE, finish_chunk, text_chunk

BLOCKS = [
    b'data: {"a": 1}\n\n',
    b"event: x\r\ndata: y\r\n\r\n",
    b": ping\n\n",
    b"data: cr\r\r",
    b": comment\ndata: z\n\n",
    b"\r\n\r\ndata: after blank lines\r\n\r\n",  # (an LF first would end a CR-ended block)
    b"event: no-data\n\n",
    b"id: 7\r\n\r\n",
]


class Log:
    """A reader that keeps what it takes (and refuses the events ``refuse`` names)."""

    def __init__(self, refuse: str = "") -> None:
        self.taken: list[bytes] = []
        self.checked: list[Event] = []
        self.refuse = refuse

    def check(self, piece: bytes, event: Event) -> Refusal | None:
        self.checked.append(event)
        if self.refuse and self.refuse in event.data:
            return Refusal(Reason.INVALID_SHAPE, "refused by the reader")
        return None

    def take(self, piece: bytes, event: Event | None) -> None:
        self.taken.append(piece)


def _guarded(guard: StreamGuard, *readers: Log) -> WholeEvents:
    whole = WholeEvents()
    for reader in readers:
        whole.add(reader)
    guard.whole = whole
    return whole


def _feed(guard: StreamGuard, body: bytes, cuts: list[int]) -> bytes:
    out: list[bytes] = []
    start = 0
    for cut in [*cuts, len(body)]:
        out.append(guard.feed(body[start:cut]))
        start = cut
    guard.eof()
    out.append(guard.final)
    return b"".join(out)


@given(st.lists(st.sampled_from(BLOCKS), max_size=12), st.data())
def test_sse_blocks_are_the_events_whatever_the_partition(
    blocks: list[bytes], data: st.DataObject
) -> None:
    body = b"".join(blocks)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(body)))))
    guard = StreamGuard(FramingOnly())
    log = Log()
    whole = _guarded(guard, log)
    assert _feed(guard, body, cuts) == body  # readers change nothing the client gets
    assert log.taken == blocks
    assert whole.pending == b""


def test_blank_lines_before_a_block_belong_to_it() -> None:
    guard = StreamGuard(FramingOnly())
    log = Log()
    _guarded(guard, log)
    guard.feed(b"data: a\n\n\n\ndata: b\n\n")
    assert log.taken == [b"data: a\n\n", b"\n\ndata: b\n\n"]


def test_what_follows_the_last_whole_event_is_pending() -> None:
    guard = StreamGuard(FramingOnly())
    log = Log()
    whole = _guarded(guard, log)
    assert guard.feed(BLOCKS[0] + b": open\n") == BLOCKS[0] + b": open\n"
    assert log.taken == [BLOCKS[0]]
    assert whole.pending == b": open\n"
    guard.feed(b": more\n\n")
    assert log.taken == [BLOCKS[0], b": open\n: more\n\n"]


def test_ndjson_lines_are_the_events() -> None:
    lines = [
        b'{"message":{"content":"Hi"},"done":false}\n',
        b'{"done":true,"done_reason":"stop"}\n',
    ]
    guard = StreamGuard(OllamaContract())
    log = Log()
    _guarded(guard, log)
    body = b"".join(lines)
    assert _feed(guard, body, [3, 50]) == body
    assert log.taken == lines


def test_binary_frames_are_the_events() -> None:
    frames = converse(text_block(0, "Hel", "lo"))
    guard = StreamGuard(BedrockContract())
    log = Log()
    _guarded(guard, log)
    body = b"".join(frames)
    assert _feed(guard, body, [5, 40, len(frames[0]) + 3]) == body
    assert log.taken == frames
    assert guard.verdict is not None
    assert guard.verdict.complete


def test_a_refused_event_is_withheld_and_ends_the_stream() -> None:
    blocks = [text_chunk("fine"), b": ping\n", text_chunk("bad"), text_chunk("never"), DONE]
    guard = StreamGuard(ChatContract())
    checker, log = Log(refuse="bad"), Log()
    _guarded(guard, checker, log)
    out = guard.feed(b"".join(blocks))
    assert out == blocks[0] + blocks[1]  # the comment before it was the client's already
    assert log.taken == [blocks[0]]  # no reader took the refused event
    verdict = guard.verdict
    assert verdict is not None
    assert verdict.outcome is Outcome.INCOMPLETE
    assert verdict.reason is Reason.INVALID_SHAPE
    assert guard.done
    trailer = guard.annotation("req-1")
    error = json.loads(trailer.split(b"\n", 1)[0].removeprefix(b"data: "))
    assert error["error"]["code"] == "invalid_shape"  # the protocol's own error event


def test_a_refusal_replaces_a_finish_reached_in_the_same_read() -> None:
    guard = StreamGuard(ChatContract())
    _guarded(guard, Log(refuse="[DONE]"))
    out = guard.feed(text_chunk("a") + finish_chunk("stop") + DONE)
    assert out == text_chunk("a") + finish_chunk("stop")
    assert guard.verdict is not None
    assert guard.verdict.reason is Reason.INVALID_SHAPE


def test_held_events_wait_for_the_head_and_go_only_with_their_answer() -> None:
    guard = StreamGuard(FramingOnly())
    log = Log()
    whole = _guarded(guard, log)
    whole.hold()
    guard.feed(BLOCKS[0])
    assert log.taken == []
    whole.begin(held=True)
    assert log.taken == [BLOCKS[0]]
    whole.hold()
    guard.feed(BLOCKS[2])
    whole.begin(held=False)  # another answer went out: this one's events are dropped
    assert log.taken == [BLOCKS[0]]


def test_without_readers_the_guard_forwards_the_same_bytes() -> None:
    body = b"".join(BLOCKS)
    plain, read = StreamGuard(FramingOnly()), StreamGuard(FramingOnly())
    _guarded(read, Log())
    assert _feed(plain, body, [7, 30]) == _feed(read, body, [7, 30]) == body


def test_a_reader_is_handed_the_contracts_own_parse_of_each_event() -> None:
    """The schema check reads each event's JSON value as the contract parsed it (one
    parse per event, not two): the very object, while the reader is asked."""
    seen: list[object] = []
    same: list[bool] = []

    class Parsed(Log):
        def check(self, piece: bytes, event: Event) -> Refusal | None:
            seen.append(whole.parsed)
            same.append(whole.parsed is guard.contract.parsed)
            return None

    guard = StreamGuard(ChatContract())
    whole = _guarded(guard, Parsed())
    guard.feed(text_chunk("a") + finish_chunk() + DONE)
    parsed = [p for p in seen if isinstance(p, dict)]
    assert [p["choices"][0].get("finish_reason") for p in parsed] == [None, "stop"]
    assert seen[-1] is None  # [DONE] is no JSON the contract parsed
    assert all(same)  # the contract's own object: never parsed a second time
