"""Ollama's native API: ``/api/chat`` and ``/api/generate``, NDJSON streams.

A route fronts it with ``prefix = "/api"``, ``upstream`` the server's
``/api`` (``http://127.0.0.1:11434/api``) and ``protocol = "ollama"``, so an
``ollama.Client`` pointed at the gateway's root works unchanged; only a chat
or generate request that streams is guarded, every other path (``/api/tags``,
``/api/show``, ``/api/pull``, ...) is relayed as it is (NDJSON is also
Ollama's format for a model download's progress). A ``protocol = "auto"``
route finds the two paths by their ending (``/api/chat``), so a prefix
whose upstream is the server's root (``/ollama`` in front of
``http://127.0.0.1:11434``) works too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.guard import OllamaContract, Protocol
from gateway.guard.ollama import is_ollama_path, ollama_usage, ollama_wants_stream
from gateway.protocols._spec import ClientRequests, ProtocolSpec, Redactor, Tool
from gateway.protocols.finish import ollama_finish
from gateway.protocols.ollama_structured import OLLAMA_STRUCTURED, ask_ollama

__all__ = ["OLLAMA"]


def _text(model: str, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": stream,
        "options": {"num_predict": max_tokens},
    }


def _tool(body: dict[str, Any], tool: Tool) -> None:
    function = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    body["tools"] = [{"type": "function", "function": function}]


def _error(status: int, message: str, type_: str, code: str, request_id: str) -> dict[str, Any]:
    """``{"error": "<message>"}``: a string, which the ollama client shows."""
    return {"error": f"{message} ({code}) (request_id={request_id})"}


def _redaction(redactor: Redactor) -> Callable[[bytes], bytes]:
    return redactor.lines  # NDJSON: one JSON text per line


OLLAMA = ProtocolSpec(
    protocol=Protocol.OLLAMA,
    contract=OllamaContract,
    matches=is_ollama_path,
    wants_stream=ollama_wants_stream,
    answer_usage=ollama_usage,
    make_contract=lambda o: OllamaContract(require_finish_reason=o.require_finish_reason),
    # The probe's path below a route with prefix ``/api``.
    requests=ClientRequests(
        path=lambda model, stream: "/chat",
        text=_text,
        tool=_tool,
        structured=ask_ollama,
        simulator_prefix="/api",
    ),
    output_limit=("options.num_predict",),
    genai_operation="chat",
    genai_provider="ollama",
    error_shape=_error,
    redaction=_redaction,
    answer_finish=ollama_finish,
    structured=OLLAMA_STRUCTURED,
)
