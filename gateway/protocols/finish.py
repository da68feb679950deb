"""How a whole non-streamed answer says it finished, per protocol (``answer_finish``).

Each reader returns the answer's finish reason in the bounded vocabulary (the
contract's ``normalize``), or None when the answer did not finish: a choice
without a finish reason, a Responses answer still ``in_progress``, an Ollama
answer without ``done``. Where an answer has several choices or candidates,
every one must have finished and the lowest index names the reason, as for a
stream's verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.guard import Reason
from gateway.guard.gemini import GeminiContract
from gateway.guard.messages import MessagesContract
from gateway.guard.ollama import OllamaContract
from gateway.guard.verdict import normalize_finish

__all__ = [
    "chat_finish",
    "gemini_finish",
    "messages_finish",
    "ollama_finish",
    "responses_finish",
]

Json = dict[str, Any]


def _lowest(items: object, field: str, normalize: Callable[[str], Reason]) -> Reason | None:
    """The reason of the lowest-index item when every item names one, else None."""
    if not isinstance(items, list) or not items:
        return None
    reasons: list[tuple[int, Reason]] = []
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            return None
        raw = item.get(field)
        if not isinstance(raw, str) or not raw or raw == "FINISH_REASON_UNSPECIFIED":
            return None
        index = item.get("index", position)
        reasons.append((index if isinstance(index, int) else position, normalize(raw)))
    return min(reasons, key=lambda pair: pair[0])[1]


def chat_finish(body: Json) -> Reason | None:
    """Chat Completions and Completions: every ``choices[].finish_reason``."""
    return _lowest(body.get("choices"), "finish_reason", normalize_finish)


def responses_finish(body: Json) -> Reason | None:
    """Responses: ``status`` completed (a function call among the output: tool_calls), or
    incomplete with ``incomplete_details.reason``."""
    status = body.get("status")
    if status == "completed":
        output = body.get("output")
        calls = isinstance(output, list) and any(
            isinstance(item, dict) and item.get("type") == "function_call" for item in output
        )
        return Reason.TOOL_CALLS if calls else Reason.STOP
    if status == "incomplete":
        details = body.get("incomplete_details")
        raw = details.get("reason") if isinstance(details, dict) else None
        return normalize_finish(raw) if isinstance(raw, str) else Reason.OTHER
    return None


def messages_finish(body: Json) -> Reason | None:
    """Messages: ``stop_reason``."""
    raw = body.get("stop_reason")
    return MessagesContract.normalize(raw) if isinstance(raw, str) and raw else None


def gemini_finish(body: Json) -> Reason | None:
    """Gemini: every ``candidates[].finishReason`` (STOP with a function call: tool_calls)."""
    reason = _lowest(body.get("candidates"), "finishReason", GeminiContract.normalize)
    if reason is Reason.STOP:
        for candidate in body.get("candidates") or ():
            content = candidate.get("content") if isinstance(candidate, dict) else None
            parts = content.get("parts") if isinstance(content, dict) else None
            if isinstance(parts, list) and any(
                isinstance(p, dict) and "functionCall" in p for p in parts
            ):
                return Reason.TOOL_CALLS
    return reason


def ollama_finish(body: Json) -> Reason | None:
    """Ollama: ``done`` with its ``done_reason`` (a tool call in the message: tool_calls)."""
    if body.get("done") is not True:
        return None
    message = body.get("message")
    if isinstance(message, dict) and message.get("tool_calls"):
        return Reason.TOOL_CALLS
    raw = body.get("done_reason")
    return OllamaContract.normalize(raw) if isinstance(raw, str) and raw else Reason.STOP
