"""Google's Gemini API: ``models/{model}:streamGenerateContent?alt=sse`` and ``:generateContent``.

A Gemini request asks for a stream in its URL, not its body, so it is
counted (and capped) as a stream at admission like any other.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any, Final
from urllib.parse import unquote

from gateway.guard import GeminiContract, Protocol
from gateway.guard.gemini import (
    gemini_answer_usage,
    gemini_wants_stream,
    google_error,
    is_gemini_path,
)
from gateway.protocols._spec import (
    ClientRequests,
    CredentialStyle,
    ProtocolSpec,
    Tool,
    UsageBasis,
)
from gateway.protocols.finish import gemini_finish
from gateway.protocols.google_structured import GEMINI_STRUCTURED, ask_gemini

__all__ = ["GEMINI"]

#: HTTP status -> the canonical ``google.rpc.Code`` name Google's errors carry
#: (502 has no code of its own: a failed upstream is ``UNAVAILABLE``).
_GOOGLE_STATUS: Final = MappingProxyType(
    {
        400: "INVALID_ARGUMENT",
        401: "UNAUTHENTICATED",
        403: "PERMISSION_DENIED",
        404: "NOT_FOUND",
        409: "ABORTED",
        413: "INVALID_ARGUMENT",
        429: "RESOURCE_EXHAUSTED",
        499: "CANCELLED",
        500: "INTERNAL",
        501: "NOT_IMPLEMENTED",
        502: "UNAVAILABLE",
        503: "UNAVAILABLE",
        504: "DEADLINE_EXCEEDED",
    }
)


def _error(status: int, message: str, type_: str, code: str, request_id: str) -> dict[str, Any]:
    """Google's ``{"error": {"code", "message", "status", "details"}}``, the canonical
    ``google.rpc.Code`` name from the status, the code in a ``google.rpc.ErrorInfo``
    as the gateway's stream errors carry it."""
    name = _GOOGLE_STATUS.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
    return google_error(status, name, f"{message} (request_id={request_id})", code, request_id)


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
    requests=ClientRequests(
        path=_path, text=_text, tool=_tool, structured=ask_gemini, simulator_prefix="/v1beta"
    ),
    output_limit=("generationConfig.maxOutputTokens", "generation_config.max_output_tokens"),
    genai_operation="generate_content",
    genai_provider="gcp.gemini",
    price_provider="google",
    usage_basis=UsageBasis(output_includes_reasoning=False),
    error_shape=_error,
    hosts=("googleapis",),
    answer_finish=gemini_finish,
    structured=GEMINI_STRUCTURED,
)
