"""The verdict on one stream and the bounded outcome vocabulary.

What each reason means to a client and an operator is written down in
``docs/wire-contract.md`` ("Outcomes and reasons"); keep the two in step.

Values here become Prometheus label values, so every set is closed: a finish
reason that no table knows normalizes to ``other``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "COMPLETE_REASONS",
    "ERROR_FINISHES",
    "FINISH_REASONS",
    "INCOMPLETE_REASONS",
    "Outcome",
    "Reason",
    "Usage",
    "Verdict",
    "normalize_finish",
]


class Outcome(enum.StrEnum):
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"


class Reason(enum.StrEnum):
    # complete: the normalized finish reason of the lowest choice index
    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    CONTENT_FILTER = "content_filter"
    OTHER = "other"
    # incomplete
    MISSING_DONE = "missing_done"
    MISSING_FINISH = "missing_finish"
    UPSTREAM_ERROR = "upstream_error"
    UPSTREAM_STATUS = "upstream_status"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    INVALID_JSON = "invalid_json"
    INVALID_SHAPE = "invalid_shape"
    CONTENT_AFTER_FINISH = "content_after_finish"
    INVALID_TOOL_ARGUMENTS = "invalid_tool_arguments"
    LIMIT_EXCEEDED = "limit_exceeded"
    UPSTREAM_DISCONNECT = "upstream_disconnect"
    FIRST_BYTE_TIMEOUT = "first_byte_timeout"
    IDLE_TIMEOUT = "idle_timeout"
    TOTAL_TIMEOUT = "total_timeout"
    CLIENT_DISCONNECT = "client_disconnect"
    #: The client stopped reading past the send timeout (set by the relay).
    CLIENT_STALLED = "client_stalled"
    GATEWAY_SHUTDOWN = "gateway_shutdown"
    #: A resumable stream cancelled by its owner (POST .../gateway/streams/{id}/cancel).
    CANCELLED = "cancelled"
    #: A resumable stream whose gateway process died before its end (its lease ran out).
    OWNER_LOST = "owner_lost"
    #: The answer or a tool call broke the schema the request asked for, on a route
    #: whose ``schema_check`` is ``end`` (``gateway.schema``).
    SCHEMA_MISMATCH = "schema_mismatch"


COMPLETE_REASONS = frozenset(
    {Reason.STOP, Reason.LENGTH, Reason.TOOL_CALLS, Reason.CONTENT_FILTER, Reason.OTHER}
)
INCOMPLETE_REASONS = frozenset(set(Reason) - COMPLETE_REASONS)

#: The finish/stop reasons of the OpenAI and Anthropic families (and their imitators).
FINISH_REASONS: Mapping[str, Reason] = {
    "stop": Reason.STOP,
    "end_turn": Reason.STOP,
    "stop_sequence": Reason.STOP,
    "eos": Reason.STOP,
    "length": Reason.LENGTH,
    "max_tokens": Reason.LENGTH,
    "max_output_tokens": Reason.LENGTH,
    "model_context_window_exceeded": Reason.LENGTH,
    "tool_calls": Reason.TOOL_CALLS,
    "tool_use": Reason.TOOL_CALLS,
    "function_call": Reason.TOOL_CALLS,
    "content_filter": Reason.CONTENT_FILTER,
    "refusal": Reason.CONTENT_FILTER,
}


#: Finish reasons with which providers report that generation failed (vLLM "abort",
#: OpenRouter "error", DeepSeek "insufficient_system_resource"): not a finish.
ERROR_FINISHES = frozenset({"abort", "error", "insufficient_system_resource"})


def normalize_finish(raw: str) -> Reason:
    """Map a provider's finish/stop reason onto the bounded vocabulary."""
    return FINISH_REASONS.get(raw, Reason.OTHER)


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage as the provider reported it; a field it did not report is None."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    reasoning_tokens: int | None = None
    #: Input tokens written to the provider's prompt cache (Anthropic's
    #: ``cache_creation_input_tokens``, Bedrock's ``cacheWriteInputTokens``).
    cache_write_tokens: int | None = None

    def merged(self, newer: Usage) -> Usage:
        """This usage updated by a newer report; a count the newer one lacks is kept."""
        return Usage(
            input_tokens=_newer(newer.input_tokens, self.input_tokens),
            output_tokens=_newer(newer.output_tokens, self.output_tokens),
            cached_input_tokens=_newer(newer.cached_input_tokens, self.cached_input_tokens),
            reasoning_tokens=_newer(newer.reasoning_tokens, self.reasoning_tokens),
            cache_write_tokens=_newer(newer.cache_write_tokens, self.cache_write_tokens),
        )

    def as_dict(self) -> dict[str, int]:
        """The reported counts, keyed by metric token type (unreported ones left out)."""
        pairs = (
            ("input", self.input_tokens),
            ("output", self.output_tokens),
            ("cached_input", self.cached_input_tokens),
            ("reasoning", self.reasoning_tokens),
            ("cache_write", self.cache_write_tokens),
        )
        return {name: value for name, value in pairs if value is not None}


def _newer(value: int | None, old: int | None) -> int | None:
    return old if value is None else value


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the guard concluded about one stream."""

    outcome: Outcome
    reason: Reason
    #: Normalized finish reason per choice index (only choices that finished).
    finish_reasons: dict[int, Reason] = field(default_factory=dict)
    #: The provider's own finish reason strings per choice index.
    raw_finish_reasons: dict[int, str] = field(default_factory=dict)
    #: Reported usage, or None when the provider never reported it (unknown, not zero).
    usage: Usage | None = None
    events: int = 0
    content_chars: int = 0
    tool_calls: int = 0
    #: A short human-readable explanation; never contains prompt or completion text.
    detail: str = ""
    #: The upstream's own error event was relayed: the client already has an error.
    error_forwarded: bool = False

    @property
    def complete(self) -> bool:
        return self.outcome is Outcome.COMPLETE
