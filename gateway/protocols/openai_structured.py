"""Where Chat Completions and the Responses API carry schemas, answer text and tool calls.

Chat: ``response_format`` (``json_schema`` with its ``schema``, or
``json_object``), ``tools[].function.parameters``; a stream's first choice's
``delta.content`` / ``delta.refusal`` / ``delta.tool_calls`` (keyed by their
``index``), closed by its ``finish_reason``. Responses: ``text.format``
(``json_schema`` / ``json_object``), ``tools[].parameters``; the
``response.output_text.delta``, ``response.refusal.delta``,
``response.output_item.added`` (a ``function_call``),
``response.function_call_arguments.delta`` / ``.done`` events (keyed by
``output_index``), closed by ``response.completed`` / ``response.incomplete``.
"""

from __future__ import annotations

from typing import Any

from gateway.guard.chat import lone_text
from gateway.guard.decoder import Event
from gateway.protocols.structured import Structured, event_object, function_tools, json_object
from gateway.schema import ANY_JSON, Part, PartKind, Schemas

__all__ = ["CHAT_STRUCTURED", "RESPONSES_STRUCTURED", "ask_chat", "ask_responses"]

Json = dict[str, Any]


def _format_schema(fmt: object, nested: bool) -> Any:
    """A ``json_schema`` / ``json_object`` format's schema (ANY_JSON), or None."""
    if not isinstance(fmt, dict):
        return None
    kind = fmt.get("type")
    if kind == "json_object":
        return ANY_JSON
    if kind != "json_schema":
        return None
    holder = fmt.get("json_schema") if nested else fmt
    schema = holder.get("schema") if isinstance(holder, dict) else None
    return schema if isinstance(schema, (dict, bool)) else ANY_JSON


def _chat_schemas(body: Json) -> Schemas:
    return Schemas(
        answer=_format_schema(body.get("response_format"), nested=True),
        tools=function_tools(body.get("tools")),
    )


_TEXT = PartKind.TEXT


def _chat_parts(event: Event, parsed: Any) -> list[Part]:
    obj = parsed if type(parsed) is dict else json_object(event.data)
    choices = obj.get("choices") if obj is not None else None
    if type(choices) is not list:
        return []
    text = lone_text(obj)  # the common chunk: one choice, a text delta, nothing else
    if text is not None:
        return [Part(_TEXT, "", text)] if text else []
    out: list[Part] = []
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            if isinstance(content, str) and content:
                out.append(Part(PartKind.TEXT, "", content))
            refusal = delta.get("refusal")
            if isinstance(refusal, str) and refusal:
                out.append(Part(PartKind.REFUSAL, "", refusal))
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                _chat_calls(calls, out)
        if choice.get("finish_reason"):  # "" is some servers' "not yet", as the contract says
            out.append(Part(PartKind.END))
    return out


def _chat_calls(calls: list[Any], out: list[Part]) -> None:
    for call in calls:
        if not isinstance(call, dict):
            continue
        key = str(call.get("index", 0))
        function = call.get("function")
        if not isinstance(function, dict):
            continue
        name = function.get("name")
        if isinstance(name, str) and name:
            out.append(Part(PartKind.TOOL_NAME, key, name))
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            out.append(Part(PartKind.TOOL_ARGS, key, arguments))


def _responses_schemas(body: Json) -> Schemas:
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    return Schemas(
        answer=_format_schema(fmt, nested=False), tools=function_tools(body.get("tools"))
    )


def _responses_parts(event: Event, parsed: Any) -> list[Part]:
    obj = event_object(event, parsed)
    if obj is None:
        return []
    kind = obj.get("type")
    key = str(obj.get("output_index", 0))
    if kind == "response.output_text.delta":
        delta = obj.get("delta")
        return [Part(PartKind.TEXT, "", delta)] if isinstance(delta, str) and delta else []
    if kind == "response.function_call_arguments.delta":
        delta = obj.get("delta")
        return [Part(PartKind.TOOL_ARGS, key, delta)] if isinstance(delta, str) else []
    if kind == "response.function_call_arguments.done":
        return [Part(PartKind.TOOL_DONE, key)]
    if kind == "response.output_item.added":
        item = obj.get("item")
        if isinstance(item, dict) and item.get("type") == "function_call":
            name = item.get("name")
            return [Part(PartKind.TOOL_NAME, key, name if isinstance(name, str) else "")]
        return []
    if kind == "response.refusal.delta":
        return [Part(PartKind.REFUSAL, "", str(obj.get("delta", "")))]
    if kind in ("response.completed", "response.incomplete"):
        return [Part(PartKind.END)]
    return []


CHAT_STRUCTURED = Structured(
    markers=(b'"response_format"', b'"tools"'),
    schemas=_chat_schemas,
    parts=_chat_parts,
)
RESPONSES_STRUCTURED = Structured(
    markers=(b'"format"', b'"tools"'),
    schemas=_responses_schemas,
    parts=_responses_parts,
)


def ask_chat(body: Json, schema: Json) -> None:
    """Ask a Chat body for an answer fitting ``schema``."""
    body["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema, "strict": True},
    }


def ask_responses(body: Json, schema: Json) -> None:
    """Ask a Responses body for an answer fitting ``schema``."""
    body["text"] = {"format": {"type": "json_schema", "name": "answer", "schema": schema}}
