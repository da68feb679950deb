"""What a protocol reads for the check: the schemas a request asks for, and the
structured parts each of its stream's events carries.

Each protocol's spec (``gateway/protocols/``) turns its own request body into
``Schemas`` and each of its events into ``Part`` s; the check
(``gateway.schema.check``) knows no protocol.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["ANY_JSON", "Part", "PartKind", "Schemas"]

#: The schema of ``json_object`` / ``format: "json"``: exactly one JSON document, any.
ANY_JSON: dict[str, Any] = {}


class PartKind(enum.Enum):
    TEXT = "text"  # a delta of the answer's text
    REFUSAL = "refusal"  # the model's own refusal (a legitimate answer)
    TOOL_NAME = "tool_name"  # a tool call opens (key: the call's key, text: its name)
    TOOL_ARGS = "tool_args"  # a delta of a call's arguments
    TOOL_DONE = "tool_done"  # a call's arguments are whole (key ""): every open call
    END = "end"  # the answer finished (its finish reason came)


class Part(NamedTuple):
    kind: PartKind
    key: str = ""
    text: str = ""


@dataclass(frozen=True, slots=True)
class Schemas:
    """What a request asked for: its answer's schema (``ANY_JSON`` for plain JSON mode;
    None: free text) and each declared tool's parameter schema, by name."""

    answer: dict[str, Any] | bool | None = None
    tools: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.answer is not None or bool(self.tools)
