"""Google's Gemini API: ``models/{model}:streamGenerateContent?alt=sse`` and ``:generateContent``.

A Gemini request asks for a stream in its URL, not its body, so it is
counted (and capped) as a stream at admission like any other.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from gateway.guard import GeminiContract, Protocol
from gateway.guard.gemini import gemini_answer_usage, gemini_wants_stream, is_gemini_path
from gateway.protocols._spec import ClientRequests, CredentialStyle, ProtocolSpec, Tool
from gateway.protocols.finish import gemini_finish

__all__ = ["GEMINI"]


#: ``.../models/{model}:generateContent``: the model is in the path (an SDK quotes it).
_PATH_MODEL = re.compile(r"/models/([^/?:]+):")


def _path_model(path: str, body: Any) -> str | None:
    """The model a Gemini request names in its URL; the body names none."""
    match = _PATH_MODEL.search(path.split("?", 1)[0])
    return unquote(match.group(1)) if match else None


def _model_version(body: dict[str, Any]) -> str | None:
    model = body.get("modelVersion")
    return model if isinstance(model, str) else None


def _path(model: str, stream: bool) -> str:
    return (
        f"/models/{model}:streamGenerateContent?alt=sse"
        if stream
        else f"/models/{model}:generateContent"
    )


def _text(model: str, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    # The model and whether to stream are in the path.
    return {
        "contents": [{"role": "user", "parts": [{"text": prompt}]}],
        "generationConfig": {"maxOutputTokens": max_tokens},
    }


def _tool(body: dict[str, Any], tool: Tool) -> None:
    declaration = {
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
    }
    body["tools"] = [{"functionDeclarations": [declaration]}]
    body["toolConfig"] = {"functionCallingConfig": {"mode": "ANY"}}


GEMINI = ProtocolSpec(
    protocol=Protocol.GEMINI,
    contract=GeminiContract,
    matches=is_gemini_path,
    wants_stream=lambda path, body: gemini_wants_stream(path),
    answer_usage=gemini_answer_usage,
    answer_model=_model_version,
    request_model=_path_model,
    credential=CredentialStyle.X_GOOG_API_KEY,
    requests=ClientRequests(path=_path, text=_text, tool=_tool),
    genai_operation="generate_content",
    genai_provider="gcp.gemini",
    answer_finish=gemini_finish,
)
