"""NDJSON: same bytes, any partition, same lines, verdict and forwarded bytes.

The NDJSON decoder keeps the promises of the SSE decoder (docs/wire-contract.md,
"Same bytes, any partition"): the network may split a stream anywhere, between
a CR and its LF or inside a UTF-8 character, and the events (offsets included),
the boundary and a budget error come out the same. Fixed fixtures are checked
for every two-chunk split and one byte at a time; hypothesis then draws random
line streams, budgets and partitions, and checks the decoder against a
reference that splits the whole stream at once, and the guard (with Ollama's
contract) against its one-chunk run.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.guard import GuardError, LineTooLong, NDJSONDecoder, OllamaContract, Reason
from tests.unit.helpers import all_partitions, bytewise, random_partition, run_guard

PROPERTY = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

CJK = "\u4f60\u597d\uff0c\u4e16\u754c"
EMOJI = "\U0001f642\U0001f680"

Offsets = list[tuple[str, int, int]]


def reference(stream: bytes, limit: int | None = None) -> tuple[Offsets, bool, int]:
    """(events with offsets, whether the budget failed, boundary) for a whole stream.

    Written from the framing's definition, sharing no code with the decoder:
    lines end at LF, a CR before it is dropped, blank lines are no event, a last
    line without LF is unfinished; a line (or the unfinished rest) longer than
    ``limit`` bytes stops the stream there.
    """
    events: Offsets = []
    pos = 0
    *lines, rest = stream.split(b"\n")
    for line in lines:
        if limit is not None and len(line) > limit:
            return events, True, pos
        end = pos + len(line) + 1
        text = line.removesuffix(b"\r")
        if text.strip():
            events.append((text.decode("utf-8", "replace"), pos, end))
        pos = end
    return events, limit is not None and len(rest) > limit, pos


def run(chunks: list[bytes], limit: int | None = None) -> tuple[Offsets, bool, int, int]:
    decoder = NDJSONDecoder() if limit is None else NDJSONDecoder(limit, limit)
    events: Offsets = []
    failed = False
    for chunk in chunks:
        try:
            got = decoder.feed(chunk)
        except GuardError:
            got = decoder.events_before_error
            failed = True
        events += [(e.data, e.start, e.end) for e in got]
        if failed:
            break
    if not failed:
        events += [(e.data, e.start, e.end) for e in decoder.close()]
    return events, failed, decoder.boundary, decoder.received


def line(obj: object, eol: bytes = b"\n") -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + eol


BASE = (
    line({"model": "m", "message": {"role": "assistant", "content": CJK}, "done": False})
    + b"\n"
    + line({"message": {"content": EMOJI}, "done": False}, b"\r\n")
    + b"   \t\n"
    + b'{"response": "caf\xc3\xa9 \xe4\xbd\xa0\xe5"}\n'
    + line({"done": True, "done_reason": "stop", "eval_count": 3})
    + b'{"unterminated": '
)

FIXTURES = {
    "lf": BASE,
    "crlf": BASE.replace(b"\n", b"\r\n"),
    "blank-only": b"\n\r\n \n",
    "no-line-end": b'{"a": 1}',
    "cr-inside-a-line": b'{"a": "x\ry"}\n{"b": 2}\r\r\n',
}


@pytest.mark.parametrize("name", list(FIXTURES))
def test_decoder_lines_and_offsets_do_not_depend_on_the_partition(name: str) -> None:
    stream = FIXTURES[name]
    events, failed, boundary = reference(stream)
    for label, partition in all_partitions(stream):
        assert run(partition) == (events, failed, boundary, len(stream)), label


def test_the_fixture_holds_the_hard_cases() -> None:
    events, _, boundary = reference(FIXTURES["crlf"])
    texts = [json.loads(text) for text, _, _ in events]
    assert texts[0]["message"]["content"] == CJK
    assert texts[1]["message"]["content"] == EMOJI
    assert texts[2]["response"] == "caf\u00e9 \u4f60\ufffd"  # a cut character is U+FFFD
    assert texts[3]["done"] is True
    assert len(events) == 4  # blank and whitespace lines are no events
    assert boundary == FIXTURES["crlf"].rindex(b"\n") + 1  # the unterminated line is held


@pytest.mark.parametrize("limit", [1, 10, 40, 80])
def test_a_line_over_budget_fails_at_the_same_line_whatever_the_partition(limit: int) -> None:
    stream = FIXTURES["lf"]
    expected = reference(stream, limit)
    for label, partition in all_partitions(stream):
        events, failed, boundary, _ = run(partition, limit)
        assert (events, failed, boundary) == expected, label


def test_an_unfinished_line_fails_as_soon_as_it_outgrows_the_budget() -> None:
    decoder = NDJSONDecoder(8, 8)
    assert [e.data for e in decoder.feed(b'{"a":1}\n12345678')] == ['{"a":1}']
    with pytest.raises(LineTooLong):
        decoder.feed(b"9")
    assert decoder.boundary == 8
    assert reference(b'{"a":1}\n123456789', 8) == ([('{"a":1}', 0, 8)], True, 8)


def test_the_budget_is_the_smaller_of_the_line_and_event_budgets() -> None:
    decoder = NDJSONDecoder(max_line_bytes=100, max_event_bytes=8)
    assert decoder.feed(b'{"a":1}\n') != []
    with pytest.raises(LineTooLong):
        decoder.feed(b'{"a": 12}\n')
    with pytest.raises(LineTooLong):  # dead after an error
        decoder.feed(b"\n")
    with pytest.raises(ValueError, match="positive"):
        NDJSONDecoder(0)


json_lines = st.lists(
    st.one_of(
        st.dictionaries(st.text(max_size=4), st.text(max_size=12), max_size=3).map(
            lambda obj: json.dumps(obj, ensure_ascii=False).encode()
        ),
        st.binary(max_size=12).map(lambda raw: raw.replace(b"\n", b"")),
        st.sampled_from([b"", b" ", b"\r", b"\t\r"]),
    ),
    max_size=12,
)


@PROPERTY
@given(
    lines=json_lines,
    eol=st.sampled_from([b"\n", b"\r\n"]),
    tail=st.binary(max_size=6),
    limit=st.one_of(st.none(), st.integers(1, 30)),
    data=st.data(),
)
def test_property_any_partition_gives_the_reference_lines(
    lines: list[bytes], eol: bytes, tail: bytes, limit: int | None, data: st.DataObject
) -> None:
    stream = b"".join(item + eol for item in lines) + tail.replace(b"\n", b"")
    events, failed, boundary = reference(stream, limit)
    got = run(random_partition(data, stream), limit)
    assert got[:3] == (events, failed, boundary)


# -- the guard with Ollama's contract ----------------------------------------------------


def chat_line(content: str, **extra: object) -> bytes:
    return line(
        {"model": "llama3.2", "message": {"role": "assistant", "content": content}, **extra}
    )


COMPLETE = (
    chat_line(CJK, done=False)
    + chat_line(EMOJI, done=False)
    + chat_line("", done=True, done_reason="stop", prompt_eval_count=5, eval_count=2)
)
GUARD_STREAMS = {
    "complete": COMPLETE,
    "complete-crlf": COMPLETE.replace(b"\n", b"\r\n"),
    "cut": COMPLETE[:-10],
    "error-line": chat_line("a", done=False) + line({"error": "model overloaded"}),
    "invalid-json": chat_line("a", done=False) + b'{"message": {"content": "b"\n' + COMPLETE,
}


def drive(chunks: list[bytes], max_line_bytes: int | None = None) -> tuple[bytes, object, bytes]:
    decoder = None if max_line_bytes is None else NDJSONDecoder(max_line_bytes, max_line_bytes)
    result = run_guard(OllamaContract(), chunks, decoder=decoder)  # type: ignore[arg-type]
    return result.output, result.verdict, result.annotated("req-1")


@pytest.mark.parametrize("name", list(GUARD_STREAMS))
def test_guard_output_verdict_and_trailer_do_not_depend_on_the_partition(name: str) -> None:
    stream = GUARD_STREAMS[name]
    whole = drive([stream])
    for label, partition in all_partitions(stream):
        assert drive(partition) == whole, label


def test_the_guard_forwards_whole_lines_and_the_trailer_is_one_line() -> None:
    output, _, annotated = drive([GUARD_STREAMS["cut"]])
    assert output == chat_line(CJK, done=False) + chat_line(EMOJI, done=False)
    trailer = json.loads(annotated[len(output) :])
    assert trailer["gateway"] == {
        "outcome": "incomplete",
        "reason": "missing_done",
        "request_id": "req-1",
    }
    assert annotated.endswith(b"}\n")
    assert annotated.count(b"\n") == 3


@pytest.mark.parametrize("limit", [20, 60])
def test_a_line_over_the_budget_is_limit_exceeded_whatever_the_partition(limit: int) -> None:
    whole = drive([COMPLETE], limit)
    assert whole[1].reason is Reason.LIMIT_EXCEEDED  # type: ignore[attr-defined]
    for label, partition in [("bytewise", bytewise(COMPLETE)), *all_partitions(COMPLETE)]:
        assert drive(partition, limit) == whole, label


@PROPERTY
@given(name=st.sampled_from(sorted(GUARD_STREAMS)), data=st.data())
def test_property_the_guard_is_partition_invariant(name: str, data: st.DataObject) -> None:
    stream = GUARD_STREAMS[name]
    assert drive(random_partition(data, stream)) == drive([stream])
