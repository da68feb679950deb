"""The tests' reference for the resume cursor's unit (what a client counts), and ``with_id``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.resume.service import with_id
from tests.client_events import Splitter

BLOCKS = [
    b'data: {"a": 1}\n\n',
    b"event: x\r\ndata: y\r\n\r\n",
    b": ping\n\n",
    b"data: cr\r\r",
    b": comment\ndata: z\n\n",
    b"\n\ndata: after blank lines\n\n",
]


def test_blocks_of_every_line_end() -> None:
    splitter = Splitter(lines=False)
    assert splitter.feed(b"".join(BLOCKS[:5]) + b": open") == BLOCKS[:5]
    assert splitter.rest == b": open"
    assert splitter.feed(b" block\n\n") == [b": open block\n\n"]


def test_blank_lines_before_a_block_belong_to_it() -> None:
    splitter = Splitter(lines=False)
    assert splitter.feed(b"data: a\n\n\n\ndata: b\n\n") == [b"data: a\n\n", b"\n\ndata: b\n\n"]
    splitter = Splitter(lines=False)
    assert splitter.feed(b"data: a\r\n\r\n\r\ndata: b\r\n\r\n") == [
        b"data: a\r\n\r\n",
        b"\r\ndata: b\r\n\r\n",
    ]


def test_ndjson_lines() -> None:
    splitter = Splitter(lines=True)
    assert splitter.feed(b'{"a":1}\n{"b":2}\r\n{"c"') == [b'{"a":1}\n', b'{"b":2}\r\n']
    assert splitter.feed(b":3}\n") == [b'{"c":3}\n']


def test_id_lines() -> None:
    assert with_id(b"data: x\n\n", 7) == b"id: 7\ndata: x\n\n"


@given(st.lists(st.sampled_from(BLOCKS[:5]), max_size=12), st.data())
def test_any_partition_gives_the_same_events(blocks: list[bytes], data: st.DataObject) -> None:
    """The relay sends whole events in sends of any grouping: the events are the blocks."""
    cuts = sorted(data.draw(st.sets(st.integers(0, len(blocks)))))
    splitter = Splitter(lines=False)
    events: list[bytes] = []
    start = 0
    for cut in [*cuts, len(blocks)]:
        events += splitter.feed(b"".join(blocks[start:cut]))
        start = cut
    assert events == blocks
    assert splitter.rest == b""


@given(st.binary(max_size=300), st.data())
def test_no_byte_is_lost_or_added(body: bytes, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(0, len(body)))))
    for ndjson in (False, True):
        splitter = Splitter(ndjson)
        out: list[bytes] = []
        start = 0
        for cut in [*cuts, len(body)]:
            out += splitter.feed(body[start:cut])
            start = cut
        assert b"".join(out) + splitter.rest == body
