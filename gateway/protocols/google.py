"""Google's Gemini API: ``models/{model}:streamGenerateContent?alt=sse`` and ``:generateContent``.

A Gemini request asks for a stream in its URL, not its body, so it is
counted (and capped) as a stream at admission like any other.
"""

from __future__ import annotations

from typing import Any

from gateway.guard import GeminiContract, Protocol
from gateway.guard.gemini import gemini_answer_usage, gemini_wants_stream, is_gemini_path
from gateway.protocols._spec import CredentialStyle, ProtocolSpec

__all__ = ["GEMINI"]


def _model_version(body: dict[str, Any]) -> str | None:
    model = body.get("modelVersion")
    return model if isinstance(model, str) else None


GEMINI = ProtocolSpec(
    protocol=Protocol.GEMINI,
    contract=GeminiContract,
    matches=is_gemini_path,
    wants_stream=lambda path, body: gemini_wants_stream(path),
    answer_usage=gemini_answer_usage,
    answer_model=_model_version,
    credential=CredentialStyle.X_GOOG_API_KEY,
    genai_operation="generate_content",
    genai_provider="gcp.gemini",
)
