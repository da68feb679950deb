"""OpenAI's protocol families: Chat Completions, legacy Completions and the Responses API."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from gateway.guard import ChatContract, CompletionsContract, Protocol, ResponsesContract
from gateway.guard.usage import chat_usage, responses_usage
from gateway.protocols._spec import ClientRequests, ProtocolSpec, Tool, body_says_stream
from gateway.protocols.finish import chat_finish, responses_finish
from gateway.protocols.openai_structured import (
    CHAT_STRUCTURED,
    RESPONSES_STRUCTURED,
    ask_chat,
    ask_responses,
)
from gateway.protocols.retrieval import Retrieval, after_sequence, response_id_of, stream_true

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


def _chat_text(model: str, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def _chat_tool(body: dict[str, Any], tool: Tool) -> None:
    function = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    body["tools"] = [{"type": "function", "function": function}]
    body["tool_choice"] = {"type": "function", "function": {"name": tool.name}}


def _completions_text(model: str, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}


def _choices(body: dict[str, Any], n: int) -> None:
    body["n"] = n


def _responses_text(model: str, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    # The Responses API wants max_output_tokens >= 16.
    return {
        "model": model,
        "input": prompt,
        "max_output_tokens": max(max_tokens, 16),
        "stream": stream,
    }


def _responses_tool(body: dict[str, Any], tool: Tool) -> None:
    body["tools"] = [
        {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        }
    ]
    body["tool_choice"] = {"type": "function", "name": tool.name}


def _ends_with(suffix: str) -> Callable[[str], bool]:
    return lambda path: path.rstrip("/").endswith(suffix)


#: What the three OpenAI APIs share: their provider's headers, names and stream request.
_openai = functools.partial(
    ProtocolSpec,
    request_id_headers=("x-request-id", "openai-request-id"),
    wants_stream=body_says_stream,
    genai_provider="openai",
    price_provider="openai",
    answer_headers=(b"openai-beta",),
)
#: What Chat Completions and legacy Completions share besides: an answer's usage and
#: finish reasons read alike, and a cut stream continued.
_chat_shaped = functools.partial(
    _openai,
    answer_usage=lambda body: chat_usage(body.get("usage")),
    answer_finish=chat_finish,
    continuable=True,
)

CHAT = _chat_shaped(
    protocol=Protocol.CHAT,
    contract=ChatContract,
    matches=_ends_with("/chat/completions"),
    make_contract=lambda o: ChatContract(
        require_finish_reason=o.require_finish_reason,
        withhold_usage=o.withhold_usage,
        end_on_finish=o.end_on_finish,
    ),
    ask_for_usage=_ask_for_usage,
    requests=ClientRequests(
        path=lambda model, stream: "/chat/completions",
        text=_chat_text,
        tool=_chat_tool,
        choices=_choices,
        structured=ask_chat,
    ),
    output_limit=("max_tokens", "max_completion_tokens"),
    genai_operation="chat",
    structured=CHAT_STRUCTURED,
)

COMPLETIONS = _chat_shaped(
    protocol=Protocol.COMPLETIONS,
    contract=CompletionsContract,
    matches=_ends_with("/completions"),
    make_contract=lambda o: CompletionsContract(
        require_finish_reason=o.require_finish_reason, end_on_finish=o.end_on_finish
    ),
    requests=ClientRequests(
        path=lambda model, stream: "/completions", text=_completions_text, choices=_choices
    ),
    output_limit=("max_tokens",),
    genai_operation="text_completion",
)

RESPONSES = _openai(
    protocol=Protocol.RESPONSES,
    retrieval=Retrieval(
        path="/responses/",
        id_of=response_id_of,
        cursor="starting_after",
        after=after_sequence,
        wants_stream=stream_true,
    ),
    contract=ResponsesContract,
    matches=_ends_with("/responses"),
    answer_usage=lambda body: responses_usage(body.get("usage")),
    requests=ClientRequests(
        path=lambda model, stream: "/responses",
        text=_responses_text,
        tool=_responses_tool,
        structured=ask_responses,
    ),
    output_limit=("max_output_tokens",),
    genai_operation="chat",
    answer_finish=responses_finish,
    structured=RESPONSES_STRUCTURED,
)
