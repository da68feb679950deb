"""Anthropic's Messages API."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Final

from gateway.guard import MessagesContract, Protocol
from gateway.guard.usage import messages_usage
from gateway.protocols._spec import (
    ClientRequests,
    CredentialStyle,
    ProtocolSpec,
    Tool,
    UsageBasis,
    body_says_stream,
)
from gateway.protocols.anthropic_structured import MESSAGES_STRUCTURED, ask_messages
from gateway.protocols.finish import messages_finish

__all__ = ["MESSAGES", "anthropic_error"]

#: HTTP status -> Anthropic's error type (its "HTTP errors" table; 503 and 504 as
#: the API's overload and timeout).
_ANTHROPIC_TYPES: Final = MappingProxyType(
    {
        400: "invalid_request_error",
        401: "authentication_error",
        402: "billing_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
        502: "api_error",
        503: "overloaded_error",
        504: "timeout_error",
        529: "overloaded_error",
    }
)


def anthropic_error(
    status: int, message: str, type_: str, code: str, request_id: str
) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message", "details": {"error_code"}},
    "request_id"}``, the type named from the status as Anthropic names it (401
    ``authentication_error``, 529 ``overloaded_error``)."""
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    text = f"{message} (request_id={request_id})"
    error = {"type": kind, "message": text, "details": {"error_code": code}}
    return {"type": "error", "error": error, "request_id": request_id}


def _text(model: str, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": prompt}],
        "stream": stream,
    }


def _tool(body: dict[str, Any], tool: Tool) -> None:
    body["tools"] = [
        {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}
    ]
    body["tool_choice"] = {"type": "tool", "name": tool.name}


MESSAGES = ProtocolSpec(
    protocol=Protocol.MESSAGES,
    request_id_headers=("request-id",),
    # 529: Anthropic's overloaded_error, with a Retry-After like a 503's
    cool_down_statuses=frozenset({429, 503, 529}),
    contract=MessagesContract,
    matches=lambda path: path.rstrip("/").endswith("/messages"),
    wants_stream=body_says_stream,
    answer_usage=lambda body: messages_usage(body.get("usage")),
    credential=CredentialStyle.X_API_KEY,
    requests=ClientRequests(
        path=lambda model, stream: "/messages",
        text=_text,
        headers={"anthropic-version": "2023-06-01"},
        tool=_tool,
        structured=ask_messages,
    ),
    output_limit=("max_tokens",),
    genai_operation="chat",
    genai_provider="anthropic",
    price_provider="anthropic",
    usage_basis=UsageBasis(input_includes_cached=False),
    error_shape=anthropic_error,
    continuable=True,
    hosts=("anthropic",),
    answer_headers=(b"anthropic-version", b"anthropic-beta"),
    answer_finish=messages_finish,
    structured=MESSAGES_STRUCTURED,
)
