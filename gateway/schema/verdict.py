"""The schema verdict: whether an answer had the shape the client asked for.

It stands beside the stream's own verdict (``gateway.guard.Verdict``): a stream
may be complete and its answer ``invalid``. ``Result`` is a closed vocabulary
(metric label values); ``kind`` says which part of the answer was judged
(``answer``: the text asked to fit a schema; ``tool``: a tool call's arguments).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Kind", "Result", "SchemaVerdict", "worst"]


class Result(enum.StrEnum):
    """The verdict's vocabulary, worst last."""

    VALID = "valid"
    #: The model's own refusal (Chat's ``refusal`` delta): a legitimate answer, no fault.
    REFUSED = "refused"
    #: Not judged, with why: a schema out of bounds, an answer too large, ...
    UNCHECKED = "unchecked"
    INVALID = "invalid"


class Kind(enum.StrEnum):
    ANSWER = "answer"
    TOOL = "tool"


_RANK = {Result.VALID: 0, Result.REFUSED: 1, Result.UNCHECKED: 2, Result.INVALID: 3}


@dataclass(frozen=True, slots=True)
class SchemaVerdict:
    """One judged part: its result, and for ``invalid`` where (a JSON Pointer into the
    part's document, and the index of the stream's event that carried the fault) and
    what failed; for ``unchecked`` why."""

    result: Result
    kind: Kind = Kind.ANSWER
    pointer: str = ""
    event: int = -1
    detail: str = ""
    #: The tool the part belongs to (``kind`` tool), else "".
    tool: str = ""

    def fields(self) -> dict[str, str | int]:
        """The verdict as flat fields (the access log, the span)."""
        out: dict[str, str | int] = {"schema": str(self.result), "schema_kind": str(self.kind)}
        if self.result is Result.INVALID:
            out["schema_pointer"] = self.pointer
            out["schema_event"] = self.event
        if self.detail:
            out["schema_detail"] = self.detail
        if self.tool:
            out["schema_tool"] = self.tool
        return out

    def trailer(self) -> str:
        """The verdict's words in the stream's trailer (``schema=invalid at=/a event=3``)."""
        words = [f"schema={self.result}"]
        if self.result is Result.INVALID:
            words.append(f"schema_kind={self.kind}")
            words.append(f"schema_at={_token(self.pointer) or '/'}")
            words.append(f"schema_event={self.event}")
        return " ".join(words)


def _token(text: str) -> str:
    """A pointer as one trailer word: no space, nothing but printable ASCII."""
    return "".join(c if 33 <= ord(c) < 127 else "%" + format(ord(c), "02X")[-2:] for c in text)


def worst(verdicts: list[SchemaVerdict]) -> SchemaVerdict | None:
    """The verdict that speaks for all (the first of the worst result), or None."""
    best: SchemaVerdict | None = None
    for verdict in verdicts:
        if best is None or _RANK[verdict.result] > _RANK[best.result]:
            best = verdict
    return best
