"""Anthropic's Messages API."""

from __future__ import annotations

from typing import Any

from gateway.guard import MessagesContract, Protocol
from gateway.guard.usage import messages_usage
from gateway.protocols._spec import (
    ClientRequests,
    CredentialStyle,
    ProtocolSpec,
    Tool,
    body_says_stream,
)
from gateway.protocols.finish import messages_finish

__all__ = ["MESSAGES"]


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
    ),
    genai_operation="chat",
    genai_provider="anthropic",
    answer_headers=(b"anthropic-version", b"anthropic-beta"),
    answer_finish=messages_finish,
)
