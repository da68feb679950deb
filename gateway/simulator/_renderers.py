"""The renderer of each protocol the simulator speaks, in one table."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from gateway.simulator._bedrock import BedrockConverseRenderer, BedrockInvokeRenderer
from gateway.simulator._gemini import GeminiRenderer
from gateway.simulator._ollama import OllamaChatRenderer, OllamaGenerateRenderer
from gateway.simulator._protocols import (
    ChatRenderer,
    CompletionsRenderer,
    MessagesRenderer,
    Plan,
    ProtocolName,
    Renderer,
    ResponsesRenderer,
)
from gateway.simulator._sse import Framer

__all__ = ["RENDERERS", "make_renderer"]

RENDERERS: Final[Mapping[ProtocolName, type[Renderer]]] = MappingProxyType(
    {
        "chat": ChatRenderer,
        "completions": CompletionsRenderer,
        "responses": ResponsesRenderer,
        "messages": MessagesRenderer,
        "gemini": GeminiRenderer,
        "ollama": OllamaChatRenderer,
        "ollama_generate": OllamaGenerateRenderer,
        "bedrock_converse": BedrockConverseRenderer,
        "bedrock_invoke": BedrockInvokeRenderer,
    }
)


def make_renderer(plan: Plan, *, crlf: bool) -> Renderer:
    return RENDERERS[plan.protocol](plan, Framer(crlf=crlf))
