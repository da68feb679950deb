"""Where Bedrock's Converse carries schemas, answer text and tool calls.

A ``converse-stream`` request asks for a structured answer with
``outputConfig.textFormat`` (``{"type": "json_schema", "structure":
{"jsonSchema": {"schema": "<the schema as a JSON string>", "name": ...}}}``)
and declares tools in ``toolConfig.tools[].toolSpec`` (``name``,
``inputSchema.json``). Its stream's events name their type in the frame's
``:event-type`` header (the decoder's ``Event.event``): a ``contentBlockDelta``
carries the answer's text (``delta.text``) or a tool call's input
(``delta.toolUse.input``, keyed by ``contentBlockIndex``), a
``contentBlockStart`` opens a tool call (``start.toolUse.name``), its
``contentBlockStop`` closes it, ``messageStop`` ends the answer.

An ``invoke-with-response-stream`` body is the model's own and its events
are wrapped in base64 ``chunk`` s: not read here (unchecked by absence: no
part, no verdict).
"""

from __future__ import annotations

import json
from typing import Any

from gateway.guard.decoder import Event
from gateway.guard.jsonparse import loads
from gateway.protocols.structured import Structured, event_object
from gateway.schema import ANY_JSON, Part, PartKind, Schemas

__all__ = ["BEDROCK_STRUCTURED", "ask_bedrock"]

Json = dict[str, Any]


def _object(value: object) -> Json:
    return value if isinstance(value, dict) else {}


def _answer(body: Json) -> Any:
    fmt = _object(_object(body.get("outputConfig")).get("textFormat"))
    if fmt.get("type") != "json_schema":
        return None
    schema = _object(_object(fmt.get("structure")).get("jsonSchema")).get("schema")
    if isinstance(schema, str):  # the API's form: the schema as a JSON string
        try:
            schema = loads(schema)
        except (ValueError, RecursionError):
            return ANY_JSON
    return schema if isinstance(schema, (dict, bool)) else ANY_JSON


def _schemas(body: Json) -> Schemas:
    tools: dict[str, Any] = {}
    declared = _object(body.get("toolConfig")).get("tools")
    for tool in declared if isinstance(declared, list) else ():
        spec = _object(tool).get("toolSpec") if isinstance(tool, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            continue
        schema = _object(spec.get("inputSchema")).get("json")
        tools[spec["name"]] = schema if isinstance(schema, (dict, bool)) else {}
    return Schemas(answer=_answer(body), tools=tools)


def _parts(event: Event, parsed: Any) -> list[Part]:
    kind = event.event
    if kind == "contentBlockDelta":
        obj = event_object(event, parsed)
        delta = obj.get("delta") if obj is not None else None
        if not isinstance(delta, dict):
            return []
        text = delta.get("text")
        if isinstance(text, str):
            return [Part(PartKind.TEXT, "", text)] if text else []
        tool = delta.get("toolUse")
        piece = tool.get("input") if isinstance(tool, dict) else None
        if isinstance(piece, str) and piece:
            return [Part(PartKind.TOOL_ARGS, _key(obj), piece)]
        return []
    if kind == "contentBlockStart":
        obj = event_object(event, parsed)
        start = obj.get("start") if obj is not None else None
        tool = start.get("toolUse") if isinstance(start, dict) else None
        if isinstance(tool, dict):
            name = tool.get("name")
            return [Part(PartKind.TOOL_NAME, _key(obj), name if isinstance(name, str) else "")]
        return []
    if kind == "contentBlockStop":
        obj = event_object(event, parsed)
        return [Part(PartKind.TOOL_DONE, _key(obj))] if obj is not None else []
    if kind == "messageStop":
        return [Part(PartKind.END)]
    return []


def _key(obj: Json | None) -> str:
    return str(obj.get("contentBlockIndex", 0)) if obj is not None else "0"


BEDROCK_STRUCTURED = Structured(
    markers=(b'"outputConfig"', b'"toolConfig"'), schemas=_schemas, parts=_parts
)


def ask_bedrock(body: Json, schema: Json) -> None:
    """Ask a Converse body for an answer fitting ``schema``."""
    body["outputConfig"] = {
        "textFormat": {
            "type": "json_schema",
            "structure": {"jsonSchema": {"schema": json.dumps(schema), "name": "answer"}},
        }
    }
