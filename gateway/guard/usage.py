"""Token usage as each provider family reports it, read into one ``Usage`` shape.

A count that is missing or not a plain non-negative integer is unknown
(None), never zero.
"""

from __future__ import annotations

from typing import Any

from gateway.guard.contract import int_or_none
from gateway.guard.verdict import Usage

__all__ = ["chat_usage", "messages_usage", "responses_usage"]


def _detail(raw: dict[str, Any], section: str | None, key: str) -> int | None:
    holder = raw.get(section) if section is not None else raw
    return int_or_none(holder.get(key)) if isinstance(holder, dict) else None


def _read(
    raw: object,
    *,
    input_key: str,
    output_key: str,
    cached: tuple[str | None, str],
    reasoning: tuple[str | None, str],
    cache_write: str | None = None,
) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    return Usage(
        input_tokens=int_or_none(raw.get(input_key)),
        output_tokens=int_or_none(raw.get(output_key)),
        cached_input_tokens=_detail(raw, *cached),
        reasoning_tokens=_detail(raw, *reasoning),
        cache_write_tokens=int_or_none(raw.get(cache_write)) if cache_write else None,
    )


def chat_usage(raw: object) -> Usage | None:
    """OpenAI Chat Completions and legacy Completions ``usage``."""
    return _read(
        raw,
        input_key="prompt_tokens",
        output_key="completion_tokens",
        cached=("prompt_tokens_details", "cached_tokens"),
        reasoning=("completion_tokens_details", "reasoning_tokens"),
    )


def responses_usage(raw: object) -> Usage | None:
    """OpenAI Responses API ``response.usage``."""
    return _read(
        raw,
        input_key="input_tokens",
        output_key="output_tokens",
        cached=("input_tokens_details", "cached_tokens"),
        reasoning=("output_tokens_details", "reasoning_tokens"),
    )


def messages_usage(raw: object) -> Usage | None:
    """Anthropic Messages ``usage`` (input excludes cached tokens, as Anthropic reports it)."""
    return _read(
        raw,
        input_key="input_tokens",
        output_key="output_tokens",
        cached=(None, "cache_read_input_tokens"),
        reasoning=("output_tokens_details", "thinking_tokens"),
        cache_write="cache_creation_input_tokens",
    )
