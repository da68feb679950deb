"""Where Ollama's API carries schemas, answer text and tool calls.

``format``: ``"json"`` (any one JSON document) or a JSON Schema; ``tools``
as OpenAI's. A stream's text is each line's ``message.content`` (``/api/chat``)
or ``response`` (``/api/generate``); ``message.tool_calls`` come whole, their
``function.arguments`` an object; ``"done": true`` ends it.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.guard.decoder import Event
from gateway.protocols.structured import Structured, event_object, function_tools
from gateway.schema import ANY_JSON, Part, PartKind, Schemas

__all__ = ["OLLAMA_STRUCTURED", "ask_ollama"]

Json = dict[str, Any]


def _schemas(body: Json) -> Schemas:
    fmt = body.get("format")
    answer: Any = ANY_JSON if fmt == "json" else fmt if isinstance(fmt, dict) else None
    return Schemas(answer=answer, tools=function_tools(body.get("tools")))


def _parts(event: Event, parsed: Any) -> list[Part]:
    obj = event_object(event, parsed)
    if obj is None:
        return []
    out: list[Part] = []
    message = obj.get("message")
    text = message.get("content") if isinstance(message, dict) else obj.get("response")
    if isinstance(text, str) and text:
        out.append(Part(PartKind.TEXT, "", text))
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        name = function.get("name")
        arguments = function.get("arguments", {})
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        out.append(Part(PartKind.TOOL_NAME, "call", name if isinstance(name, str) else ""))
        out.append(Part(PartKind.TOOL_ARGS, "call", text))
        out.append(Part(PartKind.TOOL_DONE, "call"))
    if obj.get("done") is True:
        out.append(Part(PartKind.END))
    return out


OLLAMA_STRUCTURED = Structured(markers=(b'"format"', b'"tools"'), schemas=_schemas, parts=_parts)


def ask_ollama(body: Json, schema: Json) -> None:
    """Ask an Ollama body for an answer fitting ``schema``."""
    body["format"] = schema
