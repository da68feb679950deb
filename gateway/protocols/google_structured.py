"""Where Gemini's API carries schemas, answer text and tool calls.

``generationConfig.responseJsonSchema`` (JSON Schema), or
``responseSchema`` (Gemini's OpenAPI subset: upper-case type names, read here
as JSON Schema's), or ``responseMimeType: "application/json"`` alone (any one
JSON document); snake_case spellings too. Tools:
``tools[].functionDeclarations[]`` with ``parameters`` or
``parametersJsonSchema``. A stream's text is its first candidate's text parts
(thoughts aside); a ``functionCall`` comes whole, in one part (its ``args``
an object); a candidate's ``finishReason`` ends it.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.guard.decoder import Event
from gateway.protocols.structured import Structured, event_object
from gateway.schema import ANY_JSON, Part, PartKind, Schemas

__all__ = ["GEMINI_STRUCTURED", "ask_gemini", "openapi_schema"]

Json = dict[str, Any]


def _get(obj: Json, camel: str, snake: str) -> Any:
    return obj.get(camel, obj.get(snake))


def openapi_schema(schema: Any) -> Any:
    """Gemini's ``Schema`` (OpenAPI 3.0 subset) as JSON Schema: type names lower-cased,
    ``nullable`` as a ``null`` type (iterative; bounds are judged after)."""
    if not isinstance(schema, dict):
        return schema
    root: Json = {}
    stack: list[tuple[Any, Json]] = [(schema, root)]
    while stack:
        source, target = stack.pop()
        for key, value in source.items():
            if key == "type" and isinstance(value, str):
                target["type"] = value.lower()
            elif key == "nullable":
                continue
            elif isinstance(value, dict):
                child: Json = {}
                target[key] = child
                stack.append((value, child))
            elif isinstance(value, list):
                items: list[Any] = []
                for member in value:
                    if isinstance(member, dict):
                        child = {}
                        items.append(child)
                        stack.append((member, child))
                    else:
                        items.append(member)
                target[key] = items
            else:
                target[key] = value
        if source.get("nullable") is True and isinstance(target.get("type"), str):
            target["type"] = [target["type"], "null"]
    return root


def _answer(body: Json) -> Any:
    config = _get(body, "generationConfig", "generation_config")
    if not isinstance(config, dict):
        return None
    schema = _get(config, "responseJsonSchema", "response_json_schema")
    if isinstance(schema, (dict, bool)):
        return schema
    schema = _get(config, "responseSchema", "response_schema")
    if isinstance(schema, dict):
        return openapi_schema(schema)
    if _get(config, "responseMimeType", "response_mime_type") == "application/json":
        return ANY_JSON
    return None


def _schemas(body: Json) -> Schemas:
    tools: dict[str, Any] = {}
    declared = body.get("tools")
    for tool in declared if isinstance(declared, list) else ():
        functions = (
            _get(tool, "functionDeclarations", "function_declarations")
            if isinstance(tool, dict)
            else None
        )
        for function in functions if isinstance(functions, list) else ():
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                continue
            schema = _get(function, "parametersJsonSchema", "parameters_json_schema")
            if schema is None:
                schema = openapi_schema(function.get("parameters"))
            tools[function["name"]] = schema if isinstance(schema, (dict, bool)) else {}
    return Schemas(answer=_answer(body), tools=tools)


def _parts(event: Event, parsed: Any) -> list[Part]:
    obj = event_object(event, parsed)
    candidates = obj.get("candidates") if obj is not None else None
    if not isinstance(candidates, list) or not candidates:
        return []
    first = candidates[0]
    if not isinstance(first, dict):
        return []
    out: list[Part] = []
    content = first.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    for part in parts if isinstance(parts, list) else ():
        if not isinstance(part, dict) or part.get("thought") is True:
            continue
        text = part.get("text")
        if isinstance(text, str) and text:
            out.append(Part(PartKind.TEXT, "", text))
        call = _get(part, "functionCall", "function_call")
        if isinstance(call, dict):
            name = call.get("name")
            out.append(Part(PartKind.TOOL_NAME, "call", name if isinstance(name, str) else ""))
            args = call.get("args", {})
            out.append(Part(PartKind.TOOL_ARGS, "call", json.dumps(args)))
            out.append(Part(PartKind.TOOL_DONE, "call"))
    if _get(first, "finishReason", "finish_reason") is not None:
        out.append(Part(PartKind.END))
    return out


GEMINI_STRUCTURED = Structured(
    markers=(
        b"esponseSchema",
        b"esponse_schema",
        b"esponseJsonSchema",
        b"esponse_json_schema",
        b"esponseMimeType",
        b"esponse_mime_type",
        b"unctionDeclarations",
        b"unction_declarations",
    ),
    schemas=_schemas,
    parts=_parts,
)


def ask_gemini(body: Json, schema: Json) -> None:
    """Ask a Gemini body for an answer fitting ``schema``."""
    config = body.setdefault("generationConfig", {})
    config["responseMimeType"] = "application/json"
    config["responseJsonSchema"] = schema
