"""Ollama's native API: ``/api/chat`` and ``/api/generate``, streamed as NDJSON.

Ollama answers a streamed request (the default: a body without
``"stream": false``) with ``application/x-ndjson``: one JSON object per
line, each a ``ChatResponse`` (``message`` with ``content``, ``thinking`` and
``tool_calls``) or a ``GenerateResponse`` (``response``, ``thinking``), and a
final line with ``"done": true``, its ``done_reason`` and the counts. So:

- complete when a line says ``"done": true``: its ``done_reason`` names the
  reason (``OLLAMA_FINISH``: ``stop``, ``length``; ``load`` and ``unload``,
  which end a request that generated nothing, and anything unknown are
  ``other``); ``stop`` after a tool call is ``tool_calls``. A ``done`` line
  without ``done_reason`` (Ollama before 0.1.39) is ``missing_finish``
  unless the route accepts it (``require_finish_reason = false``: ``other``);
- ``missing_done`` when the body ends before such a line.

Checks, each rejecting the line at which it fails: JSON object
(``invalid_json``); ``done`` a boolean, ``done_reason`` a string,
``message`` an object, ``content``, ``thinking`` and ``response`` strings,
``tool_calls`` a list of objects each with a ``function`` object and a string
``name`` (``invalid_shape``); ``function.arguments`` an object
(``invalid_tool_arguments``). A line whose ``error`` is a non-empty string is
Ollama's own error (the ``ollama`` client raises ``ResponseError`` on it):
forwarded, verdict ``upstream_error``; any other ``error`` is rejected
(``invalid_shape``) and replaced by ours. A line with a top-level ``gateway``
member (the key of the gateway's own error line) is rejected too
(``invalid_shape``): NDJSON has no comment line to filter, and a client must
never read a verdict the upstream wrote.

Usage: ``prompt_eval_count`` is input, ``eval_count`` output, both on the
``done`` line. The error line for an incomplete stream (``error_event``) is
``{"error": "<message>", "gateway": {...}}``: the ``ollama`` client raises
``ResponseError`` with the message. NDJSON has no comment line, so a complete
stream gets nothing appended.

Memory: counters and the number of tool calls; no text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from gateway.guard.contract import (
    Action,
    Contract,
    Incomplete,
    Protocol,
    int_or_none,
    parse_json_object,
)
from gateway.guard.decoder import Event
from gateway.guard.framing import NDJSON
from gateway.guard.verdict import Reason, Usage

__all__ = [
    "OLLAMA_FINISH",
    "OllamaContract",
    "is_ollama_path",
    "ollama_usage",
    "ollama_wants_stream",
]

#: Ollama ``done_reason`` values with a reason of their own (others are ``other``).
OLLAMA_FINISH: Final[Mapping[str, Reason]] = MappingProxyType(
    {"stop": Reason.STOP, "length": Reason.LENGTH}
)

#: The request paths (below a route's prefix) that answer with a guarded stream.
STREAM_PATHS: Final = ("/api/chat", "/api/generate")
_STREAM_ENDINGS: Final = ("/chat", "/generate")


def is_ollama_path(path: str) -> bool:
    """``.../api/chat`` or ``.../api/generate`` (query ignored)."""
    return path.split("?", 1)[0].rstrip("/").endswith(STREAM_PATHS)


def ollama_wants_stream(path: str, body: dict[str, Any] | None) -> bool:
    """A chat or generate request streams unless its body says ``"stream": false``.

    The path may be below a route whose prefix is ``/api`` (``/chat``), so only
    its last segment is read.
    """
    if not path.split("?", 1)[0].rstrip("/").endswith(_STREAM_ENDINGS):
        return False
    return body is None or body.get("stream") is not False


def ollama_usage(obj: Mapping[str, Any]) -> Usage | None:
    """The counts of a ``done`` line or a whole answer (None when it has neither)."""
    prompt = int_or_none(obj.get("prompt_eval_count"))
    output = int_or_none(obj.get("eval_count"))
    if prompt is None and output is None:
        return None
    return Usage(input_tokens=prompt, output_tokens=output)


def _string(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{where}{key} is not a string")
    return value


class OllamaContract(Contract):
    """Ollama ``/api/chat`` and ``/api/generate`` stream contract (NDJSON lines)."""

    protocol = Protocol.OLLAMA
    framing = NDJSON
    finish_table = OLLAMA_FINISH
    comment_on_complete = False
    wording = {
        Reason.MISSING_DONE: "the upstream ended the stream before its final line",
        Reason.MISSING_FINISH: "the upstream's final line had no done_reason",
        Reason.INVALID_JSON: "the upstream sent a line that is not valid JSON",
        Reason.INVALID_SHAPE: "the upstream sent a line of an invalid shape",
        Reason.INVALID_TOOL_ARGUMENTS: (
            "the upstream sent tool call arguments that are not an object"
        ),
    }

    def __init__(self, *, require_finish_reason: bool = True) -> None:
        super().__init__()
        self.require_finish_reason = require_finish_reason
        self._tool_calls = 0

    @classmethod
    def error_event(cls, incomplete: Incomplete) -> bytes:
        """One NDJSON line: Ollama's ``error`` string, and the gateway's verdict beside it."""
        payload = {
            "error": incomplete.message,
            "gateway": {
                "outcome": "incomplete",
                "reason": str(incomplete.reason),
                "request_id": incomplete.request_id,
            },
        }
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"

    @property
    def tool_calls(self) -> int:
        return self._tool_calls

    def _normalize_finish(self, index: int, raw: str) -> Reason:
        reason = self.normalize(raw)
        if reason is Reason.STOP and self._tool_calls:
            return Reason.TOOL_CALLS
        return reason

    def _on_event(self, event: Event) -> Action:
        obj = self.parsed = parse_json_object(event.data)
        if "gateway" in obj:  # the key of our own error line: only the gateway writes it
            raise self._reject(Reason.INVALID_SHAPE, "a line carries the gateway's verdict key")
        error = obj.get("error")
        if error is not None:
            if isinstance(error, str) and error:
                return self._upstream_error("the upstream sent an error line")
            raise self._reject(Reason.INVALID_SHAPE, "error is not a message")
        if self.model is None:
            self._note_model(obj.get("model"))
        try:
            carried = self._content(obj)
        except ValueError as exc:
            raise self._reject(Reason.INVALID_SHAPE, str(exc)) from None
        if carried:
            self.content_events += 1
        done = obj.get("done")
        if done is None or done is False:
            return Action.FORWARD
        if done is not True:
            raise self._reject(Reason.INVALID_SHAPE, "done is not a boolean")
        return self._on_done(obj)

    def _content(self, obj: Mapping[str, Any]) -> bool:
        """Count the line's output; True when it carried any. Raises ValueError on a bad shape."""
        chars = len(_string(obj, "response", "")) + len(_string(obj, "thinking", ""))
        calls = 0
        message = obj.get("message")
        if message is not None:
            if not isinstance(message, dict):
                raise ValueError("message is not an object")
            chars += len(_string(message, "content", "message."))
            chars += len(_string(message, "thinking", "message."))
            calls = self._on_tool_calls(message.get("tool_calls"))
        self.content_chars += chars
        return chars > 0 or calls > 0

    def _on_tool_calls(self, raw: object) -> int:
        if raw is None:
            return 0
        if not isinstance(raw, list):
            raise ValueError("message.tool_calls is not a list")
        for call in raw:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                raise ValueError("a tool call has no function object")
            if not isinstance(function.get("name"), str):
                raise ValueError("a tool call's function has no name")
            if not isinstance(function.get("arguments", {}), dict):
                raise self._reject(
                    Reason.INVALID_TOOL_ARGUMENTS, "a tool call's arguments are not an object"
                )
        self._tool_calls += len(raw)
        return len(raw)

    def _on_done(self, obj: Mapping[str, Any]) -> Action:
        self.usage = ollama_usage(obj)
        raw = obj.get("done_reason")
        if raw is None:
            if self.require_finish_reason:
                raise self._reject(Reason.MISSING_FINISH, "the done line has no done_reason")
            return self._complete(Reason.OTHER)
        if not isinstance(raw, str):
            raise self._reject(Reason.INVALID_SHAPE, "done_reason is not a string")
        self.finish_reasons[0] = raw
        return self._complete(self._normalize_finish(0, raw))
