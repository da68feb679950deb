"""A protocol's own way to fetch a stream again by the id its events name, from a cursor.

The Responses API has one: ``GET {prefix}/responses/{response_id}?stream=true
&starting_after=SEQ`` streams a response again from the event after the one
whose ``sequence_number`` is SEQ. A spec that declares a ``Retrieval`` says,
as data, where such a request is (``path``), that it asks for the stream
(``wants_stream``), which event names the id (``id_of``), and what its cursor
is (``cursor``, ``after``); the resume service answers it from the stream's
log for any upstream, and names no protocol.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["Retrieval", "after_sequence", "response_id_of", "sequence_number_of"]

Query = Mapping[str, list[str]]


@dataclass(frozen=True, slots=True)
class Retrieval:
    """How a client retrieves a stream of the protocol by the id its events name."""

    #: The path below the route's prefix that a retrieve starts with; the id follows.
    path: str
    #: The id one event of a stream names (None: this event names none).
    id_of: Callable[[bytes], str | None]
    #: The query parameter that holds the cursor.
    cursor: str
    #: The logged events to send again from a cursor: a filter over them, in order.
    after: Callable[[int], Callable[[bytes], bool]]
    #: Whether a retrieve's query asks for the stream (else it is not the log's to answer).
    wants_stream: Callable[[Query], bool]
    #: The cursor a retrieve that names none starts after.
    start: int = -1


_SEQUENCE = re.compile(rb'"sequence_number"\s*:\s*(-?[0-9]+)')


def sequence_number_of(event: bytes) -> int | None:
    match = _SEQUENCE.search(event)
    return int(match.group(1)) if match else None


def after_sequence(sequence: int) -> Callable[[bytes], bool]:
    """A filter of logged events: those from the first whose ``sequence_number`` is
    above ``sequence`` on (a comment block between two kept events is kept too)."""
    passed = False

    def keep(event: bytes) -> bool:
        nonlocal passed
        number = sequence_number_of(event)
        if number is not None:
            passed = number > sequence
        return passed

    return keep


def response_id_of(event: bytes) -> str | None:
    """The response id a Responses event carries (``response.created`` and the like)."""
    if b'"response"' not in event:
        return None
    for line in event.splitlines():
        if line.startswith(b"data:"):
            try:
                data = json.loads(line[5:])
            except ValueError:
                return None
            response = data.get("response") if isinstance(data, dict) else None
            if isinstance(response, dict) and isinstance(response.get("id"), str):
                return str(response["id"])
    return None


def stream_true(query: Query) -> bool:
    """``stream=true`` in the query."""
    return query.get("stream", [""])[0] == "true"
