"""Anthropic's Messages API."""

from __future__ import annotations

from gateway.guard import MessagesContract, Protocol
from gateway.guard.usage import messages_usage
from gateway.protocols._spec import CredentialStyle, ProtocolSpec, body_says_stream

__all__ = ["MESSAGES"]

MESSAGES = ProtocolSpec(
    protocol=Protocol.MESSAGES,
    contract=MessagesContract,
    matches=lambda path: path.rstrip("/").endswith("/messages"),
    wants_stream=body_says_stream,
    answer_usage=lambda body: messages_usage(body.get("usage")),
    credential=CredentialStyle.X_API_KEY,
    genai_operation="chat",
    genai_provider="anthropic",
)
