"""The SSE decoder against the HTML Standard and the web-platform-tests.

Sources, re-expressed as (input bytes, expected events):

* HTML Living Standard, 9.2 Server-sent events: the examples of 9.2.1
  (Introduction) and 9.2.6 (Interpreting an event stream).
* web-platform-tests ``eventsource/format-*.htm|js`` and ``event-data``.
  Their server script ``resources/message.py`` answers
  ``message + "\\n\\n" + "\\n"``, or ``message + "\\n"`` with ``newline=none``;
  ``last-event-id.py`` and ``last-event-id2.py`` answer fixed bodies. The
  bodies below are those responses. The ``format-mime-*`` tests check the
  HTTP ``Content-Type`` (that is the relay's business, not the decoder's);
  their body is ``message.py``'s default, included for completeness.

Every case is also checked against the reference decoder of ``helpers`` and
fed one byte at a time, so a case pins the decoder, the oracle and the
partition handling at once.
"""

from __future__ import annotations

import pytest

from gateway.guard import BudgetExceeded, Event, EventTooLarge, LineTooLong, SSEDecoder
from gateway.guard.errors import GuardError
from tests.unit.helpers import bytewise, decode, plain, reference_events, with_offsets

BOM = "\ufeff"


def message_py(message: str, *, newline_none: bool = False) -> bytes:
    """The body WPT's ``eventsource/resources/message.py`` sends for ``message``."""
    return (message + ("" if newline_none else "\n\n") + "\n").encode()


def ev(data: str, event: str = "message", id: str = "", retry: int | None = None) -> Event:
    return Event(event=event, data=data, id=id, retry=retry)


LONG = "x" * 2048

SPEC_CASES: list[tuple[str, bytes, list[Event]]] = [
    (
        "spec-intro-three-messages",
        b"data: This is the first message.\n\n"
        b"data: This is the second message, it\n"
        b"data: has two lines.\n\n"
        b"data: This is the third message.\n\n",
        [
            ev("This is the first message."),
            ev("This is the second message, it\nhas two lines."),
            ev("This is the third message."),
        ],
    ),
    (
        "spec-intro-event-types",
        b"event: add\ndata: 73857293\n\nevent: remove\ndata: 2153\n\nevent: add\ndata: 113411\n\n",
        [ev("73857293", "add"), ev("2153", "remove"), ev("113411", "add")],
    ),
    (
        "spec-yhoo-three-data-lines",
        b"data: YHOO\ndata: +2\ndata: 10\n\n",
        [ev("YHOO\n+2\n10")],
    ),
    (
        "spec-four-blocks",
        b": test stream\n\n"
        b"data: first event\nid: 1\n\n"
        b"data:second event\nid\n\n"
        b"data:  third event\n\n",
        [ev("first event", id="1"), ev("second event", id=""), ev(" third event")],
    ),
    (
        "spec-four-blocks-without-final-blank-line",
        b": test stream\n\n"
        b"data: first event\nid: 1\n\n"
        b"data:second event\nid\n\n"
        b"data:  third event\n",
        [ev("first event", id="1"), ev("second event")],
    ),
    (
        "spec-empty-data-and-newline-data",
        b"data\n\ndata\ndata\n\ndata:",
        [ev(""), ev("\n")],
    ),
    (
        "spec-empty-data-last-block-terminated",
        b"data\n\ndata\ndata\n\ndata:\n\n",
        [ev(""), ev("\n"), ev("")],
    ),
    (
        "spec-space-after-colon-ignored",
        b"data:test\n\ndata: test\n\n",
        [ev("test"), ev("test")],
    ),
]

WPT_CASES: list[tuple[str, bytes, list[Event]]] = [
    (
        "wpt-format-bom",
        message_py(f"{BOM}data:1\n\n{BOM}data:2\n\ndata:3"),
        [ev("1"), ev("3")],
    ),
    (
        "wpt-format-bom-2",
        message_py(f"{BOM}{BOM}data:1\n\ndata:2\n\ndata:3"),
        [ev("2"), ev("3")],
    ),
    (
        "wpt-format-comments",
        message_py(
            f"data:1\r:\0\n:\r\ndata:2\n:{LONG}\rdata:3\n:data:fail\r:{LONG}\ndata:4\n",
            newline_none=True,
        ),
        [ev("1\n2\n3\n4")],
    ),
    (
        "wpt-format-data-before-final-empty-line",
        message_py("retry:1000\ndata:test1\n\nid:test\ndata:test2", newline_none=True),
        [ev("test1", retry=1000)],
    ),
    (
        "wpt-format-field-data",
        message_py("data:\n\ndata\ndata\n\ndata:test"),
        [ev(""), ev("\n"), ev("test")],
    ),
    (
        "wpt-format-field-event",
        message_py("event:test\ndata:x\n\ndata:x"),
        [ev("x", "test"), ev("x")],
    ),
    (
        "wpt-format-field-event-empty",
        message_py("event: \ndata:data"),
        [ev("data")],
    ),
    (
        "wpt-format-field-id",  # last-event-id.py, first connection
        "id: \u2026\nretry: 200\ndata: hello\n\n".encode(),
        [ev("hello", id="\u2026", retry=200)],
    ),
    (
        "wpt-format-field-id-2",  # the id persists to later events of the stream
        "id: \u2026\nretry: 200\ndata: hello\n\ndata: \u2026\n\ndata: \u2026\n\n".encode(),
        [ev("hello", id="\u2026", retry=200), ev("\u2026", id="\u2026"), ev("\u2026", id="\u2026")],
    ),
    (
        "wpt-format-field-id-3-persists",
        b"id: 1\ndata: 1\n\ndata:2\n\n",
        [ev("1", id="1"), ev("2", id="1")],
    ),
    (
        "wpt-format-field-id-3-changes-and-persists",
        b"id: 1\ndata: 1\n\nid: 2\ndata:2\n\ndata:3\n\n",
        [ev("1", id="1"), ev("2", id="2"), ev("3", id="2")],
    ),
    (
        "wpt-format-field-id-3-resets",
        b"id: 1\ndata: 1\n\nid:\ndata:2\n\ndata:3\n\n",
        [ev("1", id="1"), ev("2", id=""), ev("3", id="")],
    ),
    (
        "wpt-format-field-id-3-resets-id-without-colon",
        b"id: 1\ndata: 1\n\nid\ndata:2\n\ndata:3\n\n",
        [ev("1", id="1"), ev("2", id=""), ev("3", id="")],
    ),
    (
        "wpt-format-field-id-null",  # last-event-id.py?idvalue=%00%00
        b"id: \x00\x00\nretry: 200\ndata: hello\n\n",
        [ev("hello", id="", retry=200)],
    ),
    (
        "wpt-format-field-parsing",
        message_py(
            "data:\0\ndata:  2\rData:1\ndata\0:2\ndata:1\r\0data:4\nda-ta:3\rdata_5\n"
            "data:3\rdata:\r\n data:32\ndata:4\n",
            newline_none=True,
        ),
        [ev("\0\n 2\n1\n3\n\n4")],
    ),
    (
        "wpt-format-field-retry",  # 03000 is 3000, not octal
        message_py("retry:03000\ndata:x"),
        [ev("x", retry=3000)],
    ),
    (
        "wpt-format-field-retry-bogus",  # 1000x is ignored: 3000 stays
        message_py("retry:3000\nretry:1000x\ndata:x"),
        [ev("x", retry=3000)],
    ),
    (
        "wpt-format-field-retry-empty",
        message_py("retry\ndata:test"),
        [ev("test")],
    ),
    (
        "wpt-format-field-unknown",
        message_py(
            "data:test\n data\ndata\nfoobar:xxx\njustsometext\n:thisisacommentyay\ndata:test"
        ),
        [ev("test\n\ntest")],
    ),
    (
        "wpt-format-leading-space",
        message_py("data:\ttest\rdata: \ndata:test"),
        [ev("\ttest\n\ntest")],
    ),
    (
        "wpt-format-newlines",
        message_py("data:test\r\ndata\ndata:test\r\n\r", newline_none=True),
        [ev("test\n\ntest")],
    ),
    (
        "wpt-format-null-character",
        message_py("data:\0\n\n"),
        [ev("\0")],
    ),
    (
        "wpt-format-utf-8",  # served as charset=windows-1252: still decoded as UTF-8
        message_py("data:ok\u2026"),
        [ev("ok\u2026")],
    ),
    (
        "wpt-format-mime-trailing-semicolon-body",
        message_py("data: data"),
        [ev("data")],
    ),
    (
        "wpt-event-data",  # resources/message2.py, one round
        b"data:msg\ndata: msg\n\n:\nfalsefield:msg\n\nfalsefield:msg\nData:data\n\n"
        b"data\n\ndata:end\n\n",
        [ev("msg\nmsg"), ev(""), ev("end")],
    ),
]


@pytest.mark.parametrize(("stream", "expected"), [c[1:] for c in SPEC_CASES + WPT_CASES],
                         ids=[c[0] for c in SPEC_CASES + WPT_CASES])  # fmt: skip
def test_spec_and_wpt_cases(stream: bytes, expected: list[Event]) -> None:
    whole = decode([stream])
    assert whole == expected
    assert plain(whole) == plain(expected)  # Event equality ignores offsets, not fields
    assert plain(whole) == reference_events(stream)
    assert with_offsets(decode(bytewise(stream))) == with_offsets(whole)


def test_wpt_retry_sets_reconnection_time_on_the_decoder() -> None:
    decoder = SSEDecoder()
    decode([message_py("retry:3000\nretry:1000x\ndata:x")], decoder)
    assert decoder.retry == 3000
    decoder = SSEDecoder()
    decode([message_py("retry:03000\ndata:x")], decoder)
    assert decoder.retry == 3000


# -- features, one at a time -------------------------------------------------------


CASES: list[tuple[str, bytes, list[Event]]] = [
    ("lf", b"data: a\n\n", [ev("a")]),
    ("crlf", b"data: a\r\n\r\n", [ev("a")]),
    ("cr", b"data: a\r\r", [ev("a")]),
    ("mixed-line-ends", b"data: a\rdata: b\r\ndata: c\n\r\n", [ev("a\nb\nc")]),
    ("crlf-is-one-line-end-not-two", b"data: a\r\ndata: b\r\n\r\n", [ev("a\nb")]),
    ("lf-cr-is-two-line-ends", b"data: a\n\rdata: b\n\n", [ev("a"), ev("b")]),
    ("comment-lines-ignored", b": hi\ndata: a\n: inside\ndata: b\n\n", [ev("a\nb")]),
    ("comment-only-blocks-dispatch-nothing", b": ping\n\n:\n\n", []),
    ("field-without-colon-has-empty-value", b"data\ndata\n\n", [ev("\n")]),
    ("event-without-colon-resets-type", b"event\ndata: a\n\n", [ev("a")]),
    ("one-optional-space-removed", b"data:  two spaces\n\n", [ev(" two spaces")]),
    ("no-space-after-colon", b"data:x\n\n", [ev("x")]),
    ("tab-is-not-a-space", b"data:\tx\n\n", [ev("\tx")]),
    ("only-first-colon-splits", b"data: a:b: c\n\n", [ev("a:b: c")]),
    ("multiple-data-lines-joined-with-lf", b"data: a\ndata: b\ndata: c\n\n", [ev("a\nb\nc")]),
    ("trailing-lf-removed-once", b"data: a\ndata:\n\n", [ev("a\n")]),
    ("empty-data-line-still-dispatches", b"data:\n\n", [ev("")]),
    ("block-without-data-not-dispatched", b"event: x\n\nid: 7\n\nretry: 5\n\n", []),
    (
        "event-type-reset-after-dispatch",
        b"event: a\ndata: 1\n\ndata: 2\n\n",
        [ev("1", "a"), ev("2")],
    ),
    ("event-type-reset-by-undispatched-block", b"event: a\n\ndata: 2\n\n", [ev("2")]),
    ("last-event-type-line-wins", b"event: a\nevent: b\ndata: x\n\n", [ev("x", "b")]),
    ("field-names-case-sensitive", b"Data: x\nDATA: y\nEvent: z\ndata: ok\n\n", [ev("ok")]),
    ("leading-space-makes-unknown-field", b" data: x\ndata: ok\n\n", [ev("ok")]),
    ("unknown-fields-ignored", b"foo: bar\nbaz\n: c\ndata: ok\nqux: 1\n\n", [ev("ok")]),
    ("id-carried-forward", b"id: 7\ndata: a\n\ndata: b\n\n", [ev("a", id="7"), ev("b", id="7")]),
    ("id-after-data-in-same-block", b"data: a\nid: 8\n\n", [ev("a", id="8")]),
    ("id-from-block-without-data", b"id: 9\n\ndata: a\n\n", [ev("a", id="9")]),
    (
        "id-with-null-ignored",
        b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n",
        [ev("a", id="1"), ev("b", id="1")],
    ),
    ("id-empty-resets", b"id: 1\ndata: a\n\nid:\ndata: b\n\n", [ev("a", id="1"), ev("b", id="")]),
    (
        "id-unicode",
        "id: \u00e9\u4f60\U0001f600\ndata: a\n\n".encode(),
        [ev("a", id="\u00e9\u4f60\U0001f600")],
    ),
    ("retry-digits", b"retry: 1500\ndata: a\n\n", [ev("a", retry=1500)]),
    ("retry-zero", b"retry: 0\ndata: a\n\n", [ev("a", retry=0)]),
    ("retry-non-ascii-digits-ignored", "retry: \u0661\u0662\ndata: a\n\n".encode(), [ev("a")]),
    ("retry-fullwidth-digits-ignored", "retry: \uff11\uff12\ndata: a\n\n".encode(), [ev("a")]),
    ("retry-sign-ignored", b"retry: -1\ndata: a\n\nretry: +1\ndata: b\n\n", [ev("a"), ev("b")]),
    ("retry-decimal-ignored", b"retry: 1.5\ndata: a\n\n", [ev("a")]),
    ("retry-two-spaces-ignored", b"retry:  10\ndata: a\n\n", [ev("a")]),
    ("retry-is-per-block", b"retry: 10\ndata: a\n\ndata: b\n\n", [ev("a", retry=10), ev("b")]),
    ("bom-stripped", b"\xef\xbb\xbfdata: a\n\n", [ev("a")]),
    ("bom-only-first-line", b"\xef\xbb\xbf\n\xef\xbb\xbfdata: a\n\ndata: b\n\n", [ev("b")]),
    ("bom-later-in-stream-kept", b"data: a\n\n\xef\xbb\xbfdata: b\n\n", [ev("a")]),
    ("bom-in-data-kept", b"data: \xef\xbb\xbfa\n\n", [ev("\ufeffa")]),
    ("partial-bom-is-not-a-bom", b"\xef\xbbdata: a\n\ndata: b\n\n", [ev("b")]),
    ("invalid-utf8-data", b"data: a\xffb\xc3\n\n", [ev("a\ufffdb\ufffd")]),
    (
        "truncated-multibyte-at-line-end",
        b"data: \xe4\xbd\ndata: \xf0\x9f\x98\n\n",
        [ev("\ufffd\n\ufffd")],
    ),
    ("overlong-and-surrogate-encodings", b"data: \xc0\xaf\xed\xa0\x80\n\n", [ev("\ufffd" * 5)]),
    ("invalid-utf8-event-type", b"event: \xfe\ndata: a\n\n", [ev("a", "\ufffd")]),
    ("invalid-utf8-id", b"id: \x80\ndata: a\n\n", [ev("a", id="\ufffd")]),
    ("invalid-utf8-field-name-unknown", b"dat\xe1: x\ndata: ok\n\n", [ev("ok")]),
    (
        "multibyte-data",
        "data: \u4f60\u597d \U0001f642 caf\u00e9\n\n".encode(),
        [ev("\u4f60\u597d \U0001f642 caf\u00e9")],
    ),
    ("null-in-data-kept", b"data: a\x00b\n\n", [ev("a\x00b")]),
    ("eof-mid-event-not-dispatched", b"data: a\n\ndata: b\n", [ev("a")]),
    ("eof-mid-line-not-dispatched", b"data: a\n\ndata: b", [ev("a")]),
    ("eof-after-fields-only", b"data: a\nevent: x\nid: 3", []),
    ("extra-blank-lines-harmless", b"\n\n\ndata: a\n\n\n\n\ndata: b\n\n\n", [ev("a"), ev("b")]),
    ("blank-line-then-cr-lf-lines", b"\r\n\r\r\ndata: a\r\r\n", [ev("a")]),
    (
        "vertical-tab-and-form-feed-are-not-line-ends",
        b"data: a\x0bb\x0cc\x1cd\n\n",
        [ev("a\x0bb\x0cc\x1cd")],
    ),
    (
        "unicode-line-separators-are-not-line-ends",
        "data: a\u2028b\u0085c\n\n".encode(),
        [ev("a\u2028b\u0085c")],
    ),
]


@pytest.mark.parametrize(("stream", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_feature_cases(stream: bytes, expected: list[Event]) -> None:
    whole = decode([stream])
    assert plain(whole) == plain(expected)
    assert plain(whole) == reference_events(stream)
    assert with_offsets(decode(bytewise(stream))) == with_offsets(whole)


def test_invalid_utf8_never_raises() -> None:
    junk = bytes(range(256)) * 4
    stream = b"data: " + junk.replace(b"\n", b"").replace(b"\r", b"") + b"\n\n"
    events = decode([stream])
    assert len(events) == 1
    assert "\ufffd" in events[0].data
    assert plain(events) == reference_events(stream)


# -- offsets -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stream", "spans"),
    [
        (b"data: a\n\ndata: b\n\n", [(0, 9), (9, 18)]),
        # start is the first field line, not a comment or blank line before it
        (b": c\n\n\ndata: a\n\n", [(6, 15)]),
        # comments inside the block are part of it
        (b"data: a\n: c\ndata: b\n\n", [(0, 21)]),
        # end: after the blank line's terminator, whichever it is
        (b"data: a\r\n\r\ndata: b\r\n\r\n", [(0, 11), (11, 22)]),
        (b"data: a\n\r\ndata: b\r\r\n", [(0, 10), (10, 20)]),
        (b"data: a\r\rdata: b\r\r", [(0, 9), (9, 18)]),
        (b"\xef\xbb\xbfdata: a\n\n", [(0, 12)]),  # the BOM's bytes count
        (b"id: 1\n\ndata: a\n\n", [(7, 16)]),  # a block with no data dispatches nothing
    ],
)
def test_event_offsets(stream: bytes, spans: list[tuple[int, int]]) -> None:
    events = decode([stream])
    assert [(e.start, e.end) for e in events] == spans
    for event in events:
        assert stream[event.end - 1 : event.end] in (b"\n", b"\r")
        # the span alone decodes to the same event
        assert decode([stream[event.start : event.end]]) == [Event(event.event, event.data)]


def test_event_equality_and_hash_ignore_offsets() -> None:
    a = Event(data="x", start=0, end=9)
    b = Event(data="x", start=100, end=109)
    assert a == b
    assert not a.__ne__(b)
    assert hash(a) == hash(b)
    assert a != Event(data="y", start=0, end=9)
    assert a != Event(data="x", event="other")
    assert a != ("message", "x", "", None, 0, 9)


# -- boundary and pending_bytes ------------------------------------------------------


def test_heartbeat_outside_a_block_advances_boundary_at_once() -> None:
    d = SSEDecoder()
    assert d.feed(b": ping\n") == []
    assert (d.boundary, d.pending_bytes, d.in_block) == (7, 0, False)
    d.feed(b":\r\n")
    assert (d.boundary, d.pending_bytes) == (10, 0)


def test_blank_lines_outside_a_block_advance_boundary() -> None:
    d = SSEDecoder()
    d.feed(b"\n\r\n")
    assert (d.boundary, d.pending_bytes) == (3, 0)


def test_unfinished_line_does_not_advance_boundary() -> None:
    d = SSEDecoder()
    d.feed(b": pin")
    assert (d.boundary, d.pending_bytes) == (0, 5)
    d.feed(b"g\ndata: x")
    assert (d.boundary, d.pending_bytes, d.in_block) == (7, 7, False)


def test_block_with_a_field_but_no_blank_line_does_not_advance_boundary() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: x\n") == []
    assert (d.boundary, d.pending_bytes, d.in_block) == (0, 8, True)
    assert d.feed(b"\n") == [ev("x")]
    assert (d.boundary, d.pending_bytes, d.in_block) == (9, 0, False)


def test_comment_inside_an_open_block_does_not_advance_boundary() -> None:
    d = SSEDecoder()
    d.feed(b": before\n")
    assert d.boundary == 9
    d.feed(b"event: x\n: inside\n")
    assert (d.boundary, d.pending_bytes, d.in_block) == (9, 18, True)
    d.feed(b"data: y\n\n")
    assert (d.boundary, d.pending_bytes, d.in_block) == (36, 0, False)


def test_block_without_data_still_ends_at_its_blank_line() -> None:
    d = SSEDecoder()
    assert d.feed(b"id: 3\nretry: 10\n") == []
    assert d.boundary == 0
    assert d.feed(b"\n") == []
    assert (d.boundary, d.last_event_id, d.retry) == (17, "3", 10)


def test_blank_line_cr_at_the_end_of_a_chunk_waits_for_the_next_byte() -> None:
    # Is it a CR or the first half of a CRLF? The event's end depends on it.
    d = SSEDecoder()
    assert d.feed(b"data: a\r\n\r") == []
    assert (d.boundary, d.pending_bytes, d.in_block) == (0, 10, True)
    events = d.feed(b"\n")
    assert [(e.data, e.start, e.end) for e in events] == [("a", 0, 11)]
    assert (d.boundary, d.pending_bytes) == (11, 0)
    d.feed(b": hb\r")  # a comment ended by a CR: the boundary moves at once
    assert d.boundary == 16
    d.feed(b"\ndata")
    assert (d.boundary, d.pending_bytes) == (17, 4)


def test_blank_line_cr_followed_by_another_byte_is_a_lone_cr() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: a\r\r") == []
    events = d.feed(b"data: b\r")
    assert [(e.data, e.start, e.end) for e in events] == [("a", 0, 9)]
    assert d.boundary == 9


def test_close_dispatches_an_event_whose_blank_line_ends_the_stream_with_a_cr() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: a\r\r") == []
    assert [(e.data, e.start, e.end) for e in d.close()] == [("a", 0, 9)]
    assert d.close() == []
    unfinished = SSEDecoder()
    unfinished.feed(b"data: a\r")
    assert unfinished.close() == []  # no blank line: discarded, as the standard says


def test_cr_then_lf_in_next_chunk_inside_a_block_is_one_line_end() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: a\r") == []
    assert d.feed(b"\ndata: b\r") == []
    assert d.boundary == 0
    assert d.feed(b"\n") == []  # the LF of the CRLF, not a blank line
    assert d.feed(b"\r\n") == [ev("a\nb")]


# -- budgets ---------------------------------------------------------------------------


def test_line_at_the_limit_is_fine_one_byte_more_is_not() -> None:
    ok = SSEDecoder(max_line_bytes=10)
    assert ok.feed(b"data: 1234\n\n") == [ev("1234")]  # "data: 1234" is 10 bytes
    bad = SSEDecoder(max_line_bytes=10)
    with pytest.raises(LineTooLong) as info:
        bad.feed(b"data: 12345\n\n")
    assert info.value.reason == "limit_exceeded"
    assert isinstance(info.value, BudgetExceeded)


def test_comment_lines_are_bounded_too() -> None:
    with pytest.raises(LineTooLong):
        SSEDecoder(max_line_bytes=8).feed(b": " + b"x" * 20 + b"\n")


def test_unterminated_line_growing_across_chunks_raises_when_it_crosses() -> None:
    d = SSEDecoder(max_line_bytes=16)
    assert d.feed(b"data: ") == []
    assert d.feed(b"0123456789") == []  # 16 bytes: at the limit
    assert d.pending_bytes == 16
    with pytest.raises(LineTooLong) as info:
        d.feed(b"x")
    assert info.value.reason == "limit_exceeded"


def test_unterminated_line_after_complete_lines_in_the_same_chunk() -> None:
    d = SSEDecoder(max_line_bytes=16)
    with pytest.raises(LineTooLong):
        d.feed(b"data: ok\n\n" + b"y" * 17)
    assert d.events_before_error == [ev("ok")]


def test_crlf_chunks_are_bounded_too() -> None:
    d = SSEDecoder(max_line_bytes=16)
    with pytest.raises(LineTooLong):
        d.feed(b"data: ok\r\n\r\n" + b"y" * 17 + b"\r\n")
    assert d.events_before_error == [ev("ok")]
    d = SSEDecoder(max_line_bytes=16)
    d.feed(b"data: ok\r\n\r\n")
    with pytest.raises(LineTooLong):
        d.feed(b"y" * 17)


def test_event_data_at_the_limit_is_fine_one_byte_more_is_not() -> None:
    ok = SSEDecoder(max_event_bytes=5)
    assert ok.feed(b"data: ab\ndata: cd\n\n") == [ev("ab\ncd")]  # 5 bytes with the LF
    bad = SSEDecoder(max_event_bytes=5)
    with pytest.raises(EventTooLarge) as info:
        bad.feed(b"data: ab\ndata: cde\n\n")
    assert info.value.reason == "limit_exceeded"
    assert isinstance(info.value, BudgetExceeded)


def test_event_data_over_budget_across_chunks() -> None:
    d = SSEDecoder(max_event_bytes=8)
    assert d.feed(b"data: 1234\n") == []
    with pytest.raises(EventTooLarge):
        d.feed(b"data: 5678\n")


def test_endless_comments_inside_a_block_are_bounded() -> None:
    d = SSEDecoder(max_line_bytes=10, max_event_bytes=10)  # a block may hold 2*10+10 bytes
    d.feed(b"data: a\n")
    for _ in range(4):  # 8 + 4 * 5 = 28 bytes: still within 30
        d.feed(b": xx\n")
    assert d.in_block
    with pytest.raises(EventTooLarge):
        d.feed(b": xx\n")


def test_endless_unknown_fields_inside_a_block_are_bounded() -> None:
    d = SSEDecoder(max_line_bytes=10, max_event_bytes=10)
    with pytest.raises(EventTooLarge):
        d.feed(b"event: e\n" + b"foo: bar\n" * 10)


@pytest.mark.parametrize(
    ("budgets", "stream", "error"),
    [
        ({"max_line_bytes": 8}, b"data: 123456789\n\n", LineTooLong),
        ({"max_line_bytes": 8}, b"data: 123456789", LineTooLong),
        ({"max_event_bytes": 3}, b"data: 1234\n\n", EventTooLarge),
    ],
)
def test_after_an_error_the_decoder_keeps_raising(
    budgets: dict[str, int], stream: bytes, error: type[GuardError]
) -> None:
    d = SSEDecoder(**budgets)
    with pytest.raises(error) as first:
        d.feed(stream)
    for more in (b"data: fine\n\n", b"", b"\n"):
        with pytest.raises(error) as again:
            d.feed(more)
        assert again.value is first.value


def test_events_before_the_offending_line_are_kept() -> None:
    d = SSEDecoder(max_event_bytes=4)
    with pytest.raises(EventTooLarge):
        d.feed(b"data: a\n\n: hb\ndata: b\n\ndata: 12345\n\ndata: c\n\n")
    assert d.events_before_error == [ev("a"), ev("b")]
    assert d.boundary == 23  # up to the end of the last whole block


@pytest.mark.parametrize("budgets", [{"max_line_bytes": 0}, {"max_event_bytes": 0}])
def test_budgets_must_be_positive(budgets: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="positive"):
        SSEDecoder(**budgets)
