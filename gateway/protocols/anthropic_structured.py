"""Where Anthropic's Messages API carries schemas, answer text and tool calls.

Its JSON outputs: ``output_format`` (``{"type": "json_schema", "schema"}``), or
``output_config.format`` of the same shape; ``tools[].input_schema`` (a tool
without one, such as a server tool, is not checked). A stream's text is its
``text_delta`` s, a tool call opens at a ``tool_use`` block's
``content_block_start`` (keyed by the block's ``index``), grows by
``input_json_delta.partial_json`` and closes at its ``content_block_stop``; a
``refusal`` stop reason is the model's refusal; ``message_stop`` ends it.
"""

from __future__ import annotations

from typing import Any

from gateway.guard.decoder import Event
from gateway.protocols.structured import Structured, event_object
from gateway.schema import ANY_JSON, Part, PartKind, Schemas

__all__ = ["MESSAGES_STRUCTURED", "ask_messages"]

Json = dict[str, Any]


def _answer(body: Json) -> Any:
    fmt = body.get("output_format")
    config = body.get("output_config")
    if fmt is None and isinstance(config, dict):
        fmt = config.get("format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return None
    schema = fmt.get("schema")
    return schema if isinstance(schema, (dict, bool)) else ANY_JSON


def _schemas(body: Json) -> Schemas:
    tools: dict[str, Any] = {}
    declared = body.get("tools")
    for tool in declared if isinstance(declared, list) else ():
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            schema = tool.get("input_schema")
            if isinstance(schema, (dict, bool)):
                tools[tool["name"]] = schema
            else:  # a server tool: declared, its input not ours to judge
                tools[tool["name"]] = True
    return Schemas(answer=_answer(body), tools=tools)


def _parts(event: Event, parsed: Any) -> list[Part]:
    obj = event_object(event, parsed)
    if obj is None:
        return []
    kind = obj.get("type")
    key = str(obj.get("index", 0))
    if kind == "content_block_delta":
        delta = obj.get("delta")
        if not isinstance(delta, dict):
            return []
        if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
            return [Part(PartKind.TEXT, "", delta["text"])] if delta["text"] else []
        if delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            return [Part(PartKind.TOOL_ARGS, key, delta["partial_json"])]
        return []
    if kind == "content_block_start":
        block = obj.get("content_block")
        if isinstance(block, dict) and block.get("type") == "tool_use":
            name = block.get("name")
            return [Part(PartKind.TOOL_NAME, key, name if isinstance(name, str) else "")]
        return []
    if kind == "content_block_stop":
        return [Part(PartKind.TOOL_DONE, key)]
    if kind == "message_delta":
        delta = obj.get("delta")
        if isinstance(delta, dict) and delta.get("stop_reason") == "refusal":
            return [Part(PartKind.REFUSAL)]
        return []
    if kind == "message_stop":
        return [Part(PartKind.END)]
    return []


MESSAGES_STRUCTURED = Structured(
    markers=(b'"output_format"', b'"output_config"', b'"tools"'),
    schemas=_schemas,
    parts=_parts,
)


def ask_messages(body: Json, schema: Json) -> None:
    """Ask a Messages body for an answer fitting ``schema`` (its JSON outputs)."""
    body["output_format"] = {"type": "json_schema", "schema": schema}
