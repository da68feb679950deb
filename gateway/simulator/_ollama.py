"""Ollama's native wire shape: ``/api/chat`` and ``/api/generate``, one JSON object per line.

A streamed answer (the default: ``"stream": false`` asks for one JSON body)
is ``application/x-ndjson``: each content delta a line with ``"done": false``
(``message.content`` for chat, ``response`` for generate), and a last line
with ``"done": true``, its ``done_reason`` (``stop``, ``length``) and the
counts (``prompt_eval_count``, ``eval_count``, durations). A tool call comes
whole, in one line's ``message.tool_calls`` with ``arguments`` as an object
(``invalid_tool_arguments`` sends a string). Ollama has no content filter,
so that finish is ``stop``. An error mid-stream is a line ``{"error": ...}``;
``done_without_finish`` ends with a ``done`` line that has no ``done_reason``.
NDJSON has no comments: a heartbeat is an empty line. The shapes follow the
Ollama API documentation and the ``ollama`` Python client's types.
"""

from __future__ import annotations

import json
from typing import Any, Final

from gateway.simulator._protocols import DEFAULT_MODEL, Lane, Plan, Renderer, sim_id
from gateway.simulator._sse import Framer, dumps

__all__ = ["NDJSONFramer", "OllamaChatRenderer", "OllamaGenerateRenderer", "ollama_tags_body"]

#: The neutral finish of a lane -> Ollama's ``done_reason``.
_DONE_REASON: Final = {"stop": "stop", "length": "length", "tool_calls": "stop"}
_CREATED_AT: Final = "2025-01-01T00:00:00.000000000Z"
_OVERLOADED: Final = "an error was encountered while running the model: server overloaded"


class NDJSONFramer(Framer):
    """One line per event; a comment (NDJSON has none) is an empty line."""

    __slots__ = ()

    def event(self, data: str, name: str | None = None) -> bytes:
        return f"{data}{self.nl}".encode()

    def comment(self, text: str) -> bytes:
        return self.nl.encode()


class _OllamaRenderer(Renderer):
    def __init__(self, plan: Plan, framer: Framer) -> None:
        super().__init__(plan, NDJSONFramer(crlf=framer.nl == "\r\n"))
        self._closed = False

    def _line(self, fields: dict[str, Any], *, done: bool = False) -> dict[str, Any]:
        return {"model": self.plan.model, "created_at": _CREATED_AT, **fields, "done": done}

    def _text(self, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def _tool(self, lane: Lane, piece: str) -> dict[str, Any]:
        try:
            arguments: Any = json.loads(piece)
        except ValueError:
            arguments = piece  # invalid_tool_arguments: not an object
        call = {"function": {"name": lane.tool_name, "arguments": arguments}}
        return {"message": {"role": "assistant", "content": "", "tool_calls": [call]}}

    def open_lane(self, lane: Lane) -> list[bytes]:
        return []

    def delta(self, lane: Lane, piece: str) -> bytes:
        lane.parts.append(piece)
        fields = self._tool(lane, piece) if lane.kind == "tool" else self._text(piece)
        return self.framer.event(dumps(self._line(fields)))

    def close_lane(self, lane: Lane) -> list[bytes]:
        self._closed = True
        return []

    def _done(self, text: str, *, finished: bool) -> dict[str, Any]:
        fields = self._text(text)
        if finished:
            fields["done_reason"] = _DONE_REASON.get(self.plan.finish, "stop")
        fields.update(
            total_duration=1_000_000,
            load_duration=10_000,
            prompt_eval_count=self.plan.input_tokens,
            prompt_eval_duration=100_000,
            eval_count=self.plan.output_tokens,
            eval_duration=800_000,
        )
        return self._line(fields, done=True)

    def terminator(self) -> list[bytes]:
        return [self.framer.event(dumps(self._done("", finished=self._closed)))]

    def error_event(self) -> bytes:
        return self.framer.event(dumps({"error": _OVERLOADED}))

    def invalid_json_event(self, lane: Lane, piece: str) -> bytes:
        """A whole line whose JSON is cut (the last two characters removed)."""
        kept = len(lane.parts)
        event = self.delta(lane, piece)
        del lane.parts[kept:]
        nl = self.framer.nl.encode()
        return event[: -len(nl) - 2] + nl

    def invalid_shape_event(self, lane: Lane) -> bytes:
        return self.framer.event(dumps(self._line({"message": "shape"})))

    def body(self) -> dict[str, Any]:
        lane = self.plan.lanes[0]
        text = "".join(lane.pieces)
        lane.emitted = lane.count
        lane.closed = True
        if lane.kind == "tool":
            done = self._done("", finished=True)
            done.update(self._tool(lane, text))
            return done
        return self._done(text, finished=True)


class OllamaChatRenderer(_OllamaRenderer):
    def _text(self, text: str) -> dict[str, Any]:
        return {"message": {"role": "assistant", "content": text}}


class OllamaGenerateRenderer(_OllamaRenderer):
    def _text(self, text: str) -> dict[str, Any]:
        return {"response": text}


def ollama_tags_body() -> dict[str, Any]:
    """``GET /api/tags``: the one model the simulator answers as (any name is answered alike)."""
    model = {
        "name": DEFAULT_MODEL,
        "model": DEFAULT_MODEL,
        "modified_at": "2025-01-01T00:00:00Z",
        "size": 0,
        "digest": sim_id("ollama-model", 0, 64),
        "details": {"format": "gguf", "family": "simulator", "parameter_size": "0B"},
    }
    return {"models": [model]}
