"""Same bytes, any partition, same result (docs/wire-contract.md, "Same bytes, any partition").

The network splits a stream anywhere: inside a UTF-8 character, between the
CR and LF of a CRLF, inside the BOM, inside ``data:``. The decoder must
return the same events with the same offsets, and the StreamGuard the same
forwarded bytes, verdict and annotation, whatever the split. Fixed fixtures
are checked for every two-chunk split and for one byte at a time; hypothesis
then draws random streams and random partitions, and also checks the
decoder against the reference decoder of ``helpers``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.guard import (
    ChatContract,
    CompletionsContract,
    Contract,
    FramingOnly,
    GuardError,
    Reason,
    SSEDecoder,
    StreamGuard,
)
from tests.unit.helpers import (
    DONE,
    all_partitions,
    choice,
    chunk,
    decode,
    finish_chunk,
    plain,
    reference_events,
    role_chunk,
    run_guard,
    sse,
    text_chunk,
    usage_chunk,
    with_offsets,
)

# -- fixtures -------------------------------------------------------------------------

CJK = "\u4f60\u597d\uff0c\u4e16\u754c"  # 3-byte characters
EMOJI = "\U0001f642\U0001f680\U0001f1fa\U0001f1f3"  # 4-byte characters, a flag pair
ACCENTS = "caf\u00e9 na\u00efve \u00fcber"  # 2-byte characters


def crlf(data: bytes) -> bytes:
    return data.replace(b"\n", b"\r\n")


def cr(data: bytes) -> bytes:
    return data.replace(b"\n", b"\r")


BASE = (
    b": welcome\n\n"
    + f"event: greet\nid: \u03b1-1\ndata: {CJK}\ndata: {EMOJI}\n\n".encode()
    + b": heartbeat\n"
    + f"data: {ACCENTS}\n: inside\ndata:  two spaces\n\n".encode()
    + b"retry: 2500\nid: 7\x00bad\ndata: x\n\n"
    + b"data: unterminated"
)

DECODER_FIXTURES: dict[str, bytes] = {
    "lf": BASE,
    "crlf": crlf(BASE),
    "cr": cr(BASE),
    "bom-lf": b"\xef\xbb\xbf" + BASE,
    "bom-crlf": b"\xef\xbb\xbf" + crlf(BASE),
    "mixed-line-ends": f"data: {CJK}\r\ndata: {EMOJI}\r: c\n\r\ndata: z\n\r".encode(),
    "invalid-utf8": b"data: \xe4\xbd\xa0\xe5\n\ndata: \xff\xfe\r\n\r\nid: \xc3\ndata: y\r\r",
    "blank-lines-and-comments": b"\n\r\n:\r\n: a\n\n\n\rdata: a\n\n\r\n\n",
    "bom-only": b"\xef\xbb\xbf",
    "bom-then-blank": b"\xef\xbb\xbf\r\ndata: a\r\n\r\n",
}


@pytest.mark.parametrize("name", list(DECODER_FIXTURES))
def test_decoder_events_and_offsets_do_not_depend_on_the_partition(name: str) -> None:
    stream = DECODER_FIXTURES[name]
    reference = None
    for label, partition in all_partitions(stream):
        decoder = SSEDecoder()
        got = with_offsets(decode(partition, decoder))
        state = (decoder.boundary, decoder.received, decoder.last_event_id, decoder.retry)
        if reference is None:
            reference = (got, state)
            assert plain(decode([stream])) == reference_events(stream)
        assert (got, state) == reference, label


def test_fixtures_really_contain_the_hard_cases() -> None:
    events = decode([DECODER_FIXTURES["bom-crlf"]])
    assert [e.data for e in events] == [
        f"{CJK}\n{EMOJI}",
        f"{ACCENTS}\n two spaces",
        "x",
    ]
    assert [e.event for e in events] == ["greet", "message", "message"]
    assert [e.id for e in events] == ["\u03b1-1", "\u03b1-1", "\u03b1-1"]
    assert [e.retry for e in events] == [None, None, 2500]
    stream = DECODER_FIXTURES["bom-crlf"]

    def span(first_line: bytes, last_line: bytes) -> tuple[int, int]:
        start = stream.index(first_line)
        blank = stream.index(last_line + b"\r\n\r\n", start) + len(last_line) + 2
        return start, blank + 2  # through the CRLF of the blank line

    assert [(e.start, e.end) for e in events] == [
        span(b"event: greet", EMOJI.encode()),
        span(b"data: caf", b"two spaces"),
        span(b"retry: 2500", b"data: x"),
    ]
    assert events[0].start == 16  # after the BOM, the comment and its blank line


# -- the guard over chat streams ----------------------------------------------------------

TOOL_ARGS = json.dumps({"city": "M\u00fcnchen", "unit": "celsius", "note": CJK})


def _tool_stream() -> bytes:
    parts = [role_chunk()]
    head = {"id": "call_abc", "type": "function", "function": {"name": "weather", "arguments": ""}}
    parts.append(sse(chunk([choice(tool_calls=[{"index": 0, **head}])])))
    for i in range(0, len(TOOL_ARGS), 7):
        piece = TOOL_ARGS[i : i + 7]
        call = {"index": 0, "function": {"arguments": piece}}
        parts.append(sse(chunk([choice(tool_calls=[call])])))
    parts += [finish_chunk("tool_calls"), usage_chunk(), DONE]
    return b"".join(parts)


CHAT_OK = b"".join(
    [
        b"\xef\xbb\xbf: connected\n\n",
        role_chunk(),
        text_chunk(CJK),
        b": keep-alive\n\n",
        text_chunk(EMOJI),
        text_chunk(ACCENTS),
        finish_chunk("stop"),
        usage_chunk(),
        DONE,
    ]
)

GUARD_FIXTURES: dict[str, tuple[Callable[[], Contract], bytes]] = {
    "chat-complete": (ChatContract, CHAT_OK),
    "chat-complete-crlf": (ChatContract, crlf(CHAT_OK)),
    "chat-complete-cr": (ChatContract, cr(CHAT_OK) + b": bye\r"),
    "chat-cr-ending-at-the-last-cr": (ChatContract, cr(CHAT_OK)),
    "chat-tool-calls": (ChatContract, _tool_stream()),
    "chat-withheld-usage-crlf": (
        lambda: ChatContract(withhold_usage=True),
        crlf(CHAT_OK),
    ),
    "chat-missing-done": (ChatContract, CHAT_OK[: -len(DONE)] + b"data: [DO"),
    "chat-cut-inside-emoji": (ChatContract, CHAT_OK[: CHAT_OK.index(EMOJI.encode()) + 2]),
    "chat-invalid-json-crlf": (
        ChatContract,
        crlf(role_chunk() + text_chunk(CJK) + b'data: {"choices": [\n\n' + DONE),
    ),
    "chat-missing-finish": (ChatContract, role_chunk() + text_chunk(EMOJI) + DONE),
    "chat-upstream-error": (
        ChatContract,
        text_chunk(CJK) + sse({"error": {"message": "overloaded", "type": "server_error"}}),
    ),
    "chat-content-after-finish-crlf": (
        ChatContract,
        crlf(text_chunk("a") + finish_chunk() + text_chunk(CJK) + DONE),
    ),
    "completions": (
        CompletionsContract,
        sse({"choices": [{"index": 0, "text": CJK, "finish_reason": None}]})
        + sse({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
        + DONE,
    ),
    "framing-only": (FramingOnly, DECODER_FIXTURES["bom-crlf"]),
}


def _guard_result(make: Callable[[], Contract], partition: list[bytes], **kw: Any) -> object:
    run = run_guard(make(), partition, **kw)
    v = run.verdict
    return (
        run.output,
        v.outcome,
        v.reason,
        v.finish_reasons,
        v.raw_finish_reasons,
        v.usage,
        v.events,
        v.content_chars,
        v.tool_calls,
        run.guard.annotation("req-part"),
    )


@pytest.mark.parametrize("name", list(GUARD_FIXTURES))
def test_guard_output_and_verdict_do_not_depend_on_the_partition(name: str) -> None:
    make, stream = GUARD_FIXTURES[name]
    reference = None
    for label, partition in all_partitions(stream):
        got = _guard_result(make, partition)
        if reference is None:
            reference = got
        assert got == reference, label


def test_guard_fixtures_reach_the_intended_verdicts() -> None:
    expected = {
        "chat-complete": ("complete", "stop"),
        "chat-complete-crlf": ("complete", "stop"),
        "chat-complete-cr": ("complete", "stop"),
        # CR-only framing that ends exactly at the CR of the [DONE] block's blank
        # line: only EOF completes that event; the guard judges it then and hands
        # its bytes to the relay in ``final``
        "chat-cr-ending-at-the-last-cr": ("complete", "stop"),
        "chat-tool-calls": ("complete", "tool_calls"),
        "chat-withheld-usage-crlf": ("complete", "stop"),
        "chat-missing-done": ("incomplete", "missing_done"),
        "chat-cut-inside-emoji": ("incomplete", "missing_done"),
        "chat-invalid-json-crlf": ("incomplete", "invalid_json"),
        "chat-missing-finish": ("incomplete", "missing_finish"),
        "chat-upstream-error": ("incomplete", "upstream_error"),
        "chat-content-after-finish-crlf": ("incomplete", "content_after_finish"),
        "completions": ("complete", "length"),
        "framing-only": ("complete", "other"),
    }
    got = {}
    for name, (make, stream) in GUARD_FIXTURES.items():
        verdict = run_guard(make(), [stream]).verdict
        got[name] = (str(verdict.outcome), str(verdict.reason))
    assert got == expected


def test_crlf_stream_is_forwarded_whole_in_every_partition() -> None:
    # including the LF of the last CRLF, even when it arrives in a chunk of its own
    stream = crlf(CHAT_OK)
    for label, partition in all_partitions(stream):
        run = run_guard(ChatContract(), partition)
        assert run.output == stream, label
        assert run.verdict.complete


def test_withheld_usage_bytes_are_the_same_in_every_partition() -> None:
    stream = crlf(CHAT_OK)
    usage = crlf(usage_chunk())
    start = stream.index(usage)
    for label, partition in all_partitions(stream):
        run = run_guard(ChatContract(withhold_usage=True), partition)
        # exactly the usage block is dropped, through the CRLF of its blank line
        assert run.output == stream[:start] + stream[start + len(usage) :], label
        assert run.verdict.usage is not None


# -- hypothesis: random streams, random partitions ------------------------------------------

_TEXT = st.text(
    alphabet=st.characters(
        blacklist_categories=("Cs",), blacklist_characters="\r\n", max_codepoint=0x1F9FF
    ),
    max_size=12,
)
_VALUE = st.one_of(
    _TEXT.map(str.encode),
    st.binary(max_size=6).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
    st.sampled_from([b"", b" ", b"  x", b"\x00", b"\xef\xbb\xbf", b"12", b"\xd9\xa1"]),
)
_NAME = st.sampled_from([b"data", b"data", b"data", b"event", b"id", b"retry", b"foo", b"Data"])
_FIELD = st.builds(
    lambda name, sep, value: name + sep + value,
    _NAME,
    st.sampled_from([b": ", b":", b"", b":  "]),
    _VALUE,
)
_LINE = st.one_of(
    _FIELD,
    _FIELD,
    _VALUE.map(lambda v: b":" + v),  # comment
    st.just(b""),  # blank line
)
_EOL = st.sampled_from([b"\n", b"\r\n", b"\r"])


@st.composite
def event_streams(draw: st.DrawFn) -> bytes:
    eol_style = draw(st.sampled_from(["lf", "crlf", "cr", "mixed"]))
    fixed = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}.get(eol_style)
    out = [b"\xef\xbb\xbf"] if draw(st.booleans()) else []
    for line in draw(st.lists(_LINE, max_size=16)):
        out.append(line + (fixed if fixed is not None else draw(_EOL)))
    if draw(st.booleans()):
        out.append(draw(_FIELD))  # an unterminated last line
    return b"".join(out)


@st.composite
def partitions(draw: st.DrawFn, data: bytes) -> list[bytes]:
    if not data:
        return [data]
    cuts = draw(st.lists(st.integers(0, len(data)), max_size=min(len(data), 12)))
    bounds = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@given(data=st.data(), stream=event_streams())
def test_random_streams_decode_like_the_reference_in_any_partition(
    data: st.DataObject, stream: bytes
) -> None:
    whole = decode([stream])
    assert plain(whole) == reference_events(stream)
    partition = data.draw(partitions(stream))
    assert with_offsets(decode(partition)) == with_offsets(whole)
    ends = [0]
    for event in whole:
        assert event.start >= ends[-1]
        assert event.end > event.start
        assert stream[event.end - 1 : event.end] in (b"\n", b"\r")
        ends.append(event.end)


@given(data=st.data(), stream=event_streams())
def test_random_streams_guard_output_is_partition_independent(
    data: st.DataObject, stream: bytes
) -> None:
    partition = data.draw(partitions(stream))
    whole = run_guard(FramingOnly(), [stream])
    split = run_guard(FramingOnly(), partition)
    assert split.output == whole.output
    assert (split.verdict.outcome, split.verdict.reason) == (
        whole.verdict.outcome,
        whole.verdict.reason,
    )
    # framing only forwards everything up to the end of the last whole block or
    # comment line outside a block; it is a prefix of the stream
    assert stream.startswith(whole.output)
    # and what has been forwarded is never a fragment, after any feed
    forwarded = b""
    for piece in split.pieces:
        forwarded += piece
        decoder = SSEDecoder()
        decoder.feed(forwarded)
        decoder.close()  # a final CR might still have been the start of a CRLF
        assert decoder.pending_bytes == 0
        assert not decoder.in_block


@given(
    data=st.data(),
    stream=event_streams(),
    max_line=st.integers(1, 24),
    max_event=st.integers(1, 24),
)
def test_budget_errors_do_not_depend_on_the_partition(
    data: st.DataObject, stream: bytes, max_line: int, max_event: int
) -> None:
    def outcome(chunks: list[bytes]) -> tuple[Any, ...]:
        decoder = SSEDecoder(max_line_bytes=max_line, max_event_bytes=max_event)
        events = []
        try:
            for piece in chunks:
                events += decoder.feed(piece)
        except GuardError as exc:
            return (type(exc), with_offsets(events + decoder.events_before_error))
        return (None, with_offsets(events))

    partition = data.draw(partitions(stream))
    assert outcome(partition) == outcome([stream])

    def guarded(chunks: list[bytes]) -> tuple[Any, ...]:
        decoder = SSEDecoder(max_line_bytes=max_line, max_event_bytes=max_event)
        run = run_guard(FramingOnly(), chunks, decoder=decoder)
        return (run.output, run.verdict.outcome, run.verdict.reason, run.verdict.events)

    assert guarded(partition) == guarded([stream])


# chat streams built from realistic pieces and faults

_CONTENT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), max_codepoint=0x1F9FF), max_size=8
)
_CHAT_PART = st.one_of(
    _CONTENT.map(text_chunk),
    _CONTENT.map(lambda t: text_chunk(t, index=1)),
    st.sampled_from(
        [
            role_chunk(),
            finish_chunk("stop"),
            finish_chunk("length", index=1),
            usage_chunk(),
            b": keep-alive\n\n",
            b":\n",
            sse(chunk([choice(refusal="no")])),
            sse(chunk([choice()])),
            sse(chunk([choice(content=None)])),
            sse({"error": {"message": "boom", "type": "server_error"}}),
            b'data: {"choices": [\n\n',
            b"data: [1, 2]\n\n",
            b"event: ping\ndata: {}\n\n",
            DONE,
        ]
    ),
)


@st.composite
def chat_streams(draw: st.DrawFn) -> bytes:
    parts = draw(st.lists(_CHAT_PART, min_size=1, max_size=10))
    stream = b"".join(parts)
    if draw(st.booleans()):
        stream = stream[: draw(st.integers(0, len(stream)))]  # the upstream was cut
    style = draw(st.sampled_from(["lf", "crlf", "cr"]))
    if style == "crlf":
        stream = crlf(stream)
    elif style == "cr":
        stream = cr(stream)
    return stream


@given(
    data=st.data(),
    stream=chat_streams(),
    withhold=st.booleans(),
    require_finish=st.booleans(),
    limit=st.one_of(st.none(), st.integers(0, 400)),
)
def test_random_chat_streams_guard_is_partition_independent(
    data: st.DataObject,
    stream: bytes,
    withhold: bool,
    require_finish: bool,
    limit: int | None,
) -> None:
    def make() -> Contract:
        return ChatContract(withhold_usage=withhold, require_finish_reason=require_finish)

    partition = data.draw(partitions(stream))
    whole = _guard_result(make, [stream], max_stream_bytes=limit)
    assert _guard_result(make, partition, max_stream_bytes=limit) == whole
    assert _guard_result(make, [bytes([b]) for b in stream], max_stream_bytes=limit) == whole


def test_an_event_completed_only_by_eof_is_forwarded_in_final() -> None:
    stream = cr(CHAT_OK)
    for name, chunks in all_partitions(stream):
        guard = StreamGuard(ChatContract())
        out = b"".join(guard.feed(piece) for piece in chunks)
        verdict = guard.eof()
        assert verdict.reason is Reason.STOP, name
        assert out + guard.final == stream, name
