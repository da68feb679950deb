"""Structured: where a protocol carries its schemas, its answer text and its tool calls.

A spec's ``structured`` record (None: the protocol has no schema to check) is
what the schema check (``gateway.schema``) reads a request and a stream by:

- ``markers``: substrings a request body that asks for a schema must hold; a
  body with none of them is never parsed for the check (a request without a
  schema pays one substring search);
- ``schemas``: the request's JSON body -> ``Schemas`` (the answer's schema,
  each declared tool's parameters);
- ``text`` (optional): the common event, a delta of the answer's text and
  nothing else, read straight off the contract's parse (the check's fast way);
- ``parts``: one event (its type and data) and its JSON value as the
  contract parsed it (None: not parsed; the reader parses the data then) ->
  the ``Part`` s it carries. Sharing the contract's parse is most of the
  check's cost per event saved.

The readers here are shared by several families; each family's own are in its
``*_structured`` module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.guard.decoder import Event
from gateway.guard.jsonparse import loads
from gateway.schema import Part, Schemas

__all__ = ["Structured", "event_object", "function_tools", "json_object"]

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Structured:
    """How to read a protocol's requests and events for the schema check."""

    markers: tuple[bytes, ...]
    schemas: Callable[[Json], Schemas]
    #: Every event's parts. The common event, a delta of the answer's text alone, is
    #: read first by its contract, in compiled code (``Contract.delta_text``: Chat,
    #: Responses, Messages); ``parts`` reads the rest, and every event of the others.
    parts: Callable[[Event, Any], list[Part]]


def json_object(data: str) -> Json | None:
    """An event's data as a JSON object, or None (the contract judges what it is)."""
    try:
        obj = loads(data)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def event_object(event: Event, parsed: Any) -> Json | None:
    """An event's JSON object: the contract's parse when it made one, else its data's."""
    if type(parsed) is dict:
        return parsed
    return json_object(event.data)


def function_tools(tools: object) -> dict[str, Any]:
    """OpenAI-style ``tools`` (``{"type": "function", "function": {name, parameters}}``,
    or the Responses API's flat ``{"type": "function", name, parameters}``) by name."""
    out: dict[str, Any] = {}
    if not isinstance(tools, list):
        return out
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            continue
        function = tool.get("function", tool)
        if not isinstance(function, dict):
            continue
        name = function.get("name")
        if isinstance(name, str):
            parameters = function.get("parameters")
            out[name] = parameters if isinstance(parameters, (dict, bool)) else {}
    return out
