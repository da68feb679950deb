"""A protocol's own retrieve (the Responses API's) is declared by its spec, as data."""

from __future__ import annotations

import json

from gateway.protocols import RETRIEVABLE
from gateway.protocols.retrieval import after_sequence


def _event(kind: str, sequence: int, **extra: object) -> bytes:
    data = {"type": kind, "sequence_number": sequence, **extra}
    return b"event: " + kind.encode() + b"\ndata: " + json.dumps(data).encode() + b"\n\n"


def test_a_retrievable_protocol_names_its_id_in_its_first_event() -> None:
    assert RETRIEVABLE  # the Responses API
    for spec in RETRIEVABLE:
        retrieval = spec.retrieval
        assert retrieval is not None
        assert spec.requests is not None
        # the retrieve is below the path a client creates the stream at
        assert retrieval.path.startswith(spec.requests.path("m", True).split("?")[0])
        created = _event("response.created", 0, response={"id": "resp_1", "status": "x"})
        assert retrieval.id_of(created) == "resp_1"
        assert retrieval.id_of(_event("response.output_text.delta", 1, delta="hi")) is None
        assert retrieval.id_of(b'data: {not json, "response"\n\n') is None
        assert retrieval.wants_stream({"stream": ["true"]})
        assert not retrieval.wants_stream({})


def test_the_cursor_keeps_the_events_after_it_and_the_comments_between() -> None:
    events = [_event("a", 0), b": ping\n\n", _event("b", 1), b": ping\n\n", _event("c", 2)]
    keep = after_sequence(0)
    assert [e for e in events if keep(e)] == events[2:]
    keep_all = after_sequence(-1)
    assert [e for e in events if keep_all(e)] == events
