"""Token usage as each provider family reports it, read into one ``Usage`` shape.

A count that is missing or not a plain non-negative integer is unknown
(None), never zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from gateway.guard.contract import int_or_none
from gateway.guard.verdict import Usage

__all__ = ["UsageKeys", "chat_usage", "messages_usage", "responses_usage"]

#: Where a count is kept: (the object that holds it, None for the usage object itself; its key).
Where = tuple[str | None, str]


def _detail(raw: dict[str, Any], where: Where | None) -> int | None:
    if where is None:
        return None
    section, key = where
    holder = raw.get(section) if section is not None else raw
    return int_or_none(holder.get(key)) if isinstance(holder, dict) else None


@dataclass(frozen=True, slots=True)
class UsageKeys:
    """Where one provider family's usage object keeps each count (None: not reported)."""

    input_key: str
    output_key: str
    cached: Where | None = None
    reasoning: Where | None = None
    cache_write: str | None = None

    def read(self, raw: object) -> Usage | None:
        """The counts of a usage object, or None when ``raw`` is not an object."""
        if not isinstance(raw, dict):
            return None
        return Usage(
            input_tokens=int_or_none(raw.get(self.input_key)),
            output_tokens=int_or_none(raw.get(self.output_key)),
            cached_input_tokens=_detail(raw, self.cached),
            reasoning_tokens=_detail(raw, self.reasoning),
            cache_write_tokens=int_or_none(raw.get(self.cache_write)) if self.cache_write else None,
        )


_CHAT: Final = UsageKeys(
    "prompt_tokens",
    "completion_tokens",
    cached=("prompt_tokens_details", "cached_tokens"),
    reasoning=("completion_tokens_details", "reasoning_tokens"),
)
_RESPONSES: Final = UsageKeys(
    "input_tokens",
    "output_tokens",
    cached=("input_tokens_details", "cached_tokens"),
    reasoning=("output_tokens_details", "reasoning_tokens"),
)
_MESSAGES: Final = UsageKeys(
    "input_tokens",
    "output_tokens",
    cached=(None, "cache_read_input_tokens"),
    reasoning=("output_tokens_details", "thinking_tokens"),
    cache_write="cache_creation_input_tokens",
)


def chat_usage(raw: object) -> Usage | None:
    """OpenAI Chat Completions and legacy Completions ``usage``."""
    return _CHAT.read(raw)


def responses_usage(raw: object) -> Usage | None:
    """OpenAI Responses API ``response.usage``."""
    return _RESPONSES.read(raw)


def messages_usage(raw: object) -> Usage | None:
    """Anthropic Messages ``usage`` (input excludes cached tokens, as Anthropic reports it)."""
    return _MESSAGES.read(raw)
