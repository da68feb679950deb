"""The Responses API's own resume, answered from the log for any upstream (pure parts).

``GET {prefix}/responses/{response_id}?stream=true&starting_after=SEQ`` for a
response whose stream the store holds (the recorder named its log by the
response id) and that belongs to the caller is answered by the resume service
from the log: the events whose ``sequence_number`` is above SEQ (and what
follows them), the live tail, then the trailer. Anything else goes upstream.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["after_sequence", "sequence_number_of"]

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
