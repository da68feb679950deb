"""OpenAI's protocol families: Chat Completions, legacy Completions and the Responses API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.guard import ChatContract, CompletionsContract, Protocol, ResponsesContract
from gateway.guard.usage import chat_usage, responses_usage
from gateway.protocols._spec import ProtocolSpec, body_says_stream

__all__ = ["CHAT", "COMPLETIONS", "RESPONSES"]


def _ask_for_usage(body: dict[str, Any]) -> bool:
    """Set ``stream_options.include_usage``; True when the client had not asked for it."""
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    new_options = dict(options) if isinstance(options, dict) else {}
    new_options["include_usage"] = True
    body["stream_options"] = new_options
    return True


def _ends_with(suffix: str) -> Callable[[str], bool]:
    return lambda path: path.rstrip("/").endswith(suffix)


CHAT = ProtocolSpec(
    protocol=Protocol.CHAT,
    contract=ChatContract,
    matches=_ends_with("/chat/completions"),
    wants_stream=body_says_stream,
    answer_usage=lambda body: chat_usage(body.get("usage")),
    make_contract=lambda o: ChatContract(
        require_finish_reason=o.require_finish_reason, withhold_usage=o.withhold_usage
    ),
    ask_for_usage=_ask_for_usage,
    genai_operation="chat",
    genai_provider="openai",
)

COMPLETIONS = ProtocolSpec(
    protocol=Protocol.COMPLETIONS,
    contract=CompletionsContract,
    matches=_ends_with("/completions"),
    wants_stream=body_says_stream,
    answer_usage=lambda body: chat_usage(body.get("usage")),
    make_contract=lambda o: CompletionsContract(require_finish_reason=o.require_finish_reason),
    genai_operation="text_completion",
    genai_provider="openai",
)

RESPONSES = ProtocolSpec(
    protocol=Protocol.RESPONSES,
    contract=ResponsesContract,
    matches=_ends_with("/responses"),
    wants_stream=body_says_stream,
    answer_usage=lambda body: responses_usage(body.get("usage")),
    genai_operation="chat",
    genai_provider="openai",
)
