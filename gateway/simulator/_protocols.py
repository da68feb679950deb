"""The provider wire shapes: one plan of the answer, one renderer per protocol.

A :class:`Plan` describes the answer neutrally: one or more *lanes* (a chat
choice, a Responses output item, an Anthropic content block, a Gemini
candidate, Ollama's one message), each either
text or a tool call, each with its pieces (deltas) and a neutral finish
(``stop``, ``length``, ``content_filter``, ``tool_calls``). A renderer turns
lane operations into the protocol's own event bytes. The fault choreography
(``_script``) only calls renderer methods, so every fault applies to every
protocol the same way.

Renderers are stateful (sequence numbers, accumulated text) and render
events strictly in stream order; they are made once per request. The four
OpenAI/Anthropic renderers live here, Gemini's in ``_gemini``, Ollama's in
``_ollama``, and the table of all of them in ``_renderers``.
"""

from __future__ import annotations

import abc
import base64
import hashlib
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal, get_args

from gateway.simulator._knobs import Knobs
from gateway.simulator._sse import Framer, dumps
from gateway.simulator._text import (
    invalid_tool_arguments,
    split_arguments,
    structured_answer,
    structured_arguments,
    text_deltas,
    tool_arguments,
)

__all__ = [
    "CREATED",
    "PROTOCOLS",
    "Lane",
    "Plan",
    "Renderer",
    "context_length_body",
    "embeddings_body",
    "error_body",
    "make_plan",
    "models_body",
    "sim_id",
]

ProtocolName = Literal[
    "chat",
    "completions",
    "responses",
    "messages",
    "gemini",
    "ollama",
    "ollama_generate",
    "bedrock_converse",
    "bedrock_invoke",
]
#: Every protocol the simulator speaks, in the order above (one list: the Literal's).
PROTOCOLS: Final[tuple[ProtocolName, ...]] = get_args(ProtocolName)
#: Ollama's native API: ``/api/chat`` and ``/api/generate``.
OLLAMA: Final = ("ollama", "ollama_generate")

#: A fixed creation time, so the same seed gives the same body bytes.
CREATED: Final = 1_735_689_600
DEFAULT_MODEL: Final = "sim-model"
DEFAULT_TOOL: Final = "get_weather"
MAX_CHOICES: Final = 16
_ERROR_MESSAGE: Final = "The simulated server had an error while processing your request."


def sim_id(salt: str, seed: int, length: int = 24) -> str:
    """A deterministic identifier for body fields (the same seed gives the same bytes)."""
    return hashlib.sha256(f"{salt}:{seed}".encode()).hexdigest()[:length]


@dataclass(slots=True)
class Lane:
    """One choice / output item / content block of the answer."""

    index: int
    kind: Literal["text", "tool"]
    pieces: Iterator[str]
    count: int
    finish: str
    tool_name: str = ""
    call_id: str = ""
    item_id: str = ""
    opened: bool = False
    closed: bool = False
    emitted: int = 0
    parts: list[str] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        index: int,
        kind: Literal["text", "tool"],
        pieces: list[str],
        finish: str,
        tool_name: str = "",
        call_id: str = "",
    ) -> Lane:
        """A lane whose pieces are all known at the start (a tool call's arguments, a
        structured answer)."""
        return cls(index, kind, iter(pieces), len(pieces), finish, tool_name, call_id)


@dataclass(slots=True)
class Plan:
    """The neutral answer of one request."""

    protocol: ProtocolName
    model: str
    lanes: list[Lane]
    include_usage: bool
    input_tokens: int
    seed: int
    tools: list[Any]

    @property
    def output_tokens(self) -> int:
        return sum(lane.emitted for lane in self.lanes)

    @property
    def finish(self) -> str:
        """The answer's overall finish, for protocols with one finish per message."""
        finishes = {lane.finish for lane in self.lanes}
        for candidate in ("length", "content_filter", "tool_calls"):
            if candidate in finishes:
                return candidate
        return "stop"


def _int_or_none(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _asks_structure(body: dict[str, Any], gemini_config: dict[str, Any]) -> bool:
    """The request asks for an answer of a JSON schema (any protocol's way of asking)."""
    fmt = _object(body.get("response_format")).get("type")
    text_fmt = _object(_object(body.get("text")).get("format")).get("type")
    return (
        fmt == "json_schema"
        or text_fmt == "json_schema"
        or _object(body.get("output_format")).get("type") == "json_schema"
        or "responseJsonSchema" in gemini_config
        or "responseSchema" in gemini_config
        or isinstance(body.get("format"), dict)
        or _object(_object(body.get("outputConfig")).get("textFormat")).get("type") == "json_schema"
    )


def _tool_name(protocol: ProtocolName, tools: list[Any]) -> str:
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        if protocol == "gemini":
            declarations = tool.get("functionDeclarations")
            for declaration in declarations if isinstance(declarations, list) else []:
                if isinstance(declaration, dict) and isinstance(declaration.get("name"), str):
                    return str(declaration["name"])
        elif protocol == "bedrock_converse":
            spec = tool.get("toolSpec")
            if isinstance(spec, dict) and isinstance(spec.get("name"), str):
                return str(spec["name"])
        elif protocol == "chat" or protocol in OLLAMA:
            function = tool.get("function")
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                return str(function["name"])
        elif isinstance(tool.get("name"), str):
            return str(tool["name"])
    return DEFAULT_TOOL


def _tool_choice_none(protocol: ProtocolName, body: dict[str, Any]) -> bool:
    if protocol == "gemini":
        config = _object(_object(body.get("toolConfig")).get("functionCallingConfig"))
        return config.get("mode") == "NONE"
    choice = body.get("tool_choice")
    if choice == "none":
        return True
    return isinstance(choice, dict) and choice.get("type") == "none"


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def make_plan(
    protocol: ProtocolName,
    body: dict[str, Any],
    knobs: Knobs,
    body_size: int,
    *,
    model: str | None = None,
) -> Plan:
    """Decide the answer: lanes, their pieces and finishes, from the request and knobs.

    ``model`` is the model the request names outside its body (Gemini: in the URL).
    """
    fault = knobs.fault
    if model is None:
        model = body.get("model") if isinstance(body.get("model"), str) else None
    model = model or DEFAULT_MODEL
    tools_raw = body.get("tools")
    tools: list[Any] = tools_raw if isinstance(tools_raw, list) else []
    gemini_config = _object(body.get("generationConfig"))

    if protocol in ("chat", "completions"):
        n = _int_or_none(body.get("n")) or 1
        n = max(1, min(n, MAX_CHOICES))
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
    elif protocol == "gemini":
        n = max(1, min(_int_or_none(gemini_config.get("candidateCount")) or 1, MAX_CHOICES))
        include_usage = True
    else:
        n = 1
        include_usage = True
    if fault == "choices_2":
        n = 2

    if protocol == "chat":
        max_tokens = _int_or_none(body.get("max_completion_tokens"))
        if max_tokens is None:
            max_tokens = _int_or_none(body.get("max_tokens"))
    elif protocol == "responses":
        max_tokens = _int_or_none(body.get("max_output_tokens"))
    elif protocol == "gemini":
        max_tokens = _int_or_none(gemini_config.get("maxOutputTokens"))
    elif protocol in OLLAMA:
        max_tokens = _int_or_none(_object(body.get("options")).get("num_predict"))
    elif protocol == "bedrock_converse":
        max_tokens = _int_or_none(_object(body.get("inferenceConfig")).get("maxTokens"))
        tools_raw = _object(body.get("toolConfig")).get("tools")
        tools = tools_raw if isinstance(tools_raw, list) else []
    else:
        max_tokens = _int_or_none(body.get("max_tokens"))

    # A request that asks for a structured answer gets the valid one unless a shape is named.
    shape = knobs.structured or ("valid" if _asks_structure(body, gemini_config) else "")
    tool_mode = protocol not in ("completions", "ollama_generate") and (
        fault in ("tool_calls", "invalid_tool_arguments")
        or shape in ("tool_off_schema", "undeclared_tool")
        or (bool(tools) and not _tool_choice_none(protocol, body))
    )
    chunk_bytes = 0 if fault == "huge_event" else knobs.chunk_bytes
    text_finish = {"length": "length", "content_filter": "content_filter"}.get(fault, "stop")

    lanes: list[Lane] = []
    for index in range(n):
        if tool_mode:
            arguments = (
                invalid_tool_arguments(knobs.seed + index)
                if fault == "invalid_tool_arguments"
                else structured_arguments(shape, knobs.seed + index)
                if shape
                else tool_arguments(knobs.seed + index)
            )
            # Gemini and Ollama send a function call whole, never its arguments in pieces.
            pieces = (
                [arguments]
                if protocol == "gemini" or protocol in OLLAMA
                else split_arguments(arguments, seed=knobs.seed + index)
            )
            name = "launch_missiles" if shape == "undeclared_tool" else _tool_name(protocol, tools)
            call_id = f"call_{sim_id('call', knobs.seed + index)}"
            lanes.append(Lane.of(index, "tool", pieces, "tool_calls", name, call_id))
            continue
        if shape:  # a structured answer, in small pieces, whatever the token count
            pieces = split_arguments(structured_answer(shape), seed=knobs.seed + index)
            lanes.append(Lane.of(index, "text", pieces, text_finish))
            continue
        count = knobs.tokens if index == 0 or fault != "choices_2" else knobs.tokens // 2
        finish = text_finish
        if max_tokens is not None and 0 <= max_tokens < count:
            count = max_tokens
            finish = "length"
        lanes.append(
            Lane(
                index=index,
                kind="text",
                pieces=text_deltas(
                    count,
                    seed=knobs.seed,
                    choice=index,
                    chunk_bytes=chunk_bytes,
                    surrogate=knobs.surrogate,
                ),
                count=count,
                finish=finish,
            )
        )
    return Plan(
        protocol=protocol,
        model=model,
        lanes=lanes,
        include_usage=include_usage,
        input_tokens=max(1, body_size // 4),
        seed=knobs.seed,
        tools=tools,
    )


class Renderer(abc.ABC):
    """Turns lane operations into one protocol's event bytes, in stream order."""

    #: Chat, legacy completions and Gemini interleave their choices; the others run
    #: lanes in turn.
    interleaved: ClassVar[bool] = False
    #: False when the stream has no terminator and simply ends after the events that
    #: carry the finishes (Gemini): ``drop_before_done`` then drops those events.
    has_terminator: ClassVar[bool] = True

    def __init__(self, plan: Plan, framer: Framer) -> None:
        self.plan = plan
        self.framer = framer

    def start(self) -> list[bytes]:
        """Events before the first lane opens."""
        return []

    @abc.abstractmethod
    def open_lane(self, lane: Lane) -> list[bytes]: ...

    @abc.abstractmethod
    def delta(self, lane: Lane, piece: str) -> bytes: ...

    @abc.abstractmethod
    def close_lane(self, lane: Lane) -> list[bytes]: ...

    def finish(self, *, stopped: bool) -> list[bytes]:
        """Events after the lanes and before the terminator (``stopped``: finishes were sent)."""
        return []

    @abc.abstractmethod
    def terminator(self) -> list[bytes]: ...

    @abc.abstractmethod
    def error_event(self) -> bytes: ...

    def invalid_json_event(self, lane: Lane, piece: str) -> bytes:
        """A well-framed event whose data is cut JSON (the last two characters removed)."""
        kept = len(lane.parts)
        event = self.delta(lane, piece).decode()
        del lane.parts[kept:]  # the client cannot parse it: not part of the answer
        nl = self.framer.nl
        body = event[: -2 * len(nl)]
        return (body[:-2] + nl + nl).encode()

    @abc.abstractmethod
    def invalid_shape_event(self, lane: Lane) -> bytes: ...

    @abc.abstractmethod
    def body(self) -> dict[str, Any]:
        """The non-streamed response body, with every lane's pieces consumed."""


def _drain(lane: Lane) -> str:
    text = "".join(lane.pieces)
    lane.emitted = lane.count
    lane.closed = True
    return text


def _openai_usage(plan: Plan) -> dict[str, Any]:
    out = plan.output_tokens
    return {
        "prompt_tokens": plan.input_tokens,
        "completion_tokens": out,
        "total_tokens": plan.input_tokens + out,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


class _OpenAIStreamRenderer(Renderer):
    """What Chat Completions and legacy Completions streams share: the chunk envelope,
    the usage-only chunk, ``[DONE]`` and the error event."""

    interleaved = True
    id: str
    chunk_object: ClassVar[str]
    #: fields between ``model`` and ``choices`` in every chunk
    envelope_extra: ClassVar[dict[str, str]] = {}

    def _chunk(self, choices: Any, usage: Any = None) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": self.chunk_object,
            "created": CREATED,
            "model": self.plan.model,
            **self.envelope_extra,
            "choices": choices,
        }
        if self.plan.include_usage:
            chunk["usage"] = usage
        return self.framer.event(dumps(chunk))

    def finish(self, *, stopped: bool) -> list[bytes]:
        if not self.plan.include_usage:
            return []
        return [self._chunk([], _openai_usage(self.plan))]

    def terminator(self) -> list[bytes]:
        return [self.framer.event("[DONE]")]

    def error_event(self) -> bytes:
        error = {"message": _ERROR_MESSAGE, "type": "server_error", "param": None, "code": None}
        return self.framer.event(dumps({"error": error}))


class ChatRenderer(_OpenAIStreamRenderer):
    chunk_object = "chat.completion.chunk"
    envelope_extra: ClassVar[dict[str, str]] = {"system_fingerprint": "fp_sim"}

    def __init__(self, plan: Plan, framer: Framer) -> None:
        super().__init__(plan, framer)
        self.id = f"chatcmpl-sim{sim_id('chat', plan.seed)}"

    @staticmethod
    def _choice(lane: Lane, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"index": lane.index, "delta": delta, "logprobs": None, "finish_reason": finish}

    def open_lane(self, lane: Lane) -> list[bytes]:
        if lane.kind == "tool":
            call = {
                "index": 0,
                "id": lane.call_id,
                "type": "function",
                "function": {"name": lane.tool_name, "arguments": ""},
            }
            delta = {"role": "assistant", "content": None, "tool_calls": [call]}
        else:
            delta = {"role": "assistant", "content": "", "refusal": None}
        return [self._chunk([self._choice(lane, delta)])]

    def delta(self, lane: Lane, piece: str) -> bytes:
        if lane.kind == "tool":
            delta: dict[str, Any] = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
        else:
            delta = {"content": piece}
        return self._chunk([self._choice(lane, delta)])

    def close_lane(self, lane: Lane) -> list[bytes]:
        return [self._chunk([self._choice(lane, {}, lane.finish)])]

    def invalid_shape_event(self, lane: Lane) -> bytes:
        return self._chunk({"index": lane.index, "delta": {"content": "shape"}})

    def body(self) -> dict[str, Any]:
        choices = []
        for lane in self.plan.lanes:
            text = _drain(lane)
            message: dict[str, Any] = {"role": "assistant", "refusal": None, "annotations": []}
            if lane.kind == "tool":
                message["content"] = None
                message["tool_calls"] = [
                    {
                        "id": lane.call_id,
                        "type": "function",
                        "function": {"name": lane.tool_name, "arguments": text},
                    }
                ]
            else:
                message["content"] = text
            choices.append(
                {
                    "index": lane.index,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": lane.finish,
                }
            )
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": CREATED,
            "model": self.plan.model,
            "system_fingerprint": "fp_sim",
            "choices": choices,
            "usage": _openai_usage(self.plan),
        }


class CompletionsRenderer(_OpenAIStreamRenderer):
    chunk_object = "text_completion"

    def __init__(self, plan: Plan, framer: Framer) -> None:
        super().__init__(plan, framer)
        self.id = f"cmpl-sim{sim_id('cmpl', plan.seed)}"

    @staticmethod
    def _choice(lane: Lane, text: str, finish: str | None = None) -> dict[str, Any]:
        return {"text": text, "index": lane.index, "logprobs": None, "finish_reason": finish}

    def open_lane(self, lane: Lane) -> list[bytes]:
        return []

    def delta(self, lane: Lane, piece: str) -> bytes:
        return self._chunk([self._choice(lane, piece)])

    def close_lane(self, lane: Lane) -> list[bytes]:
        return [self._chunk([self._choice(lane, "", lane.finish)])]

    def invalid_shape_event(self, lane: Lane) -> bytes:
        return self._chunk({"text": "shape", "index": lane.index})

    def body(self) -> dict[str, Any]:
        choices = [
            self._choice(lane, _drain(lane), lane.finish)
            for lane in self.plan.lanes  # drained in order, before usage is counted
        ]
        return {
            "id": self.id,
            "object": "text_completion",
            "created": CREATED,
            "model": self.plan.model,
            "choices": choices,
            "usage": _openai_usage(self.plan),
        }


class ResponsesRenderer(Renderer):
    """OpenAI Responses API: typed events, each with ``type`` and ``sequence_number``."""

    def __init__(self, plan: Plan, framer: Framer) -> None:
        super().__init__(plan, framer)
        self.id = f"resp_sim{sim_id('resp', plan.seed, 40)}"
        self.sequence = 0
        for lane in plan.lanes:
            prefix = "fc" if lane.kind == "tool" else "msg"
            lane.item_id = f"{prefix}_sim{sim_id(prefix, plan.seed * 64 + lane.index, 40)}"

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return self.framer.event(dumps(payload), name=kind)

    def _item_event(self, kind: str, lane: Lane, **fields: Any) -> bytes:
        """An event of one output item: its id and output index, then ``fields``."""
        return self._event(kind, item_id=lane.item_id, output_index=lane.index, **fields)

    def _item(self, lane: Lane) -> dict[str, Any]:
        status = "in_progress" if not lane.closed else "completed"
        if lane.closed and lane.finish in ("length", "content_filter"):
            status = "incomplete"
        text = "".join(lane.parts)
        if lane.kind == "tool":
            return {
                "id": lane.item_id,
                "type": "function_call",
                "status": status,
                "arguments": text if lane.closed else "",
                "call_id": lane.call_id,
                "name": lane.tool_name,
            }
        content = [self._part(text)] if lane.parts or lane.closed else []
        return {
            "id": lane.item_id,
            "type": "message",
            "status": status,
            "content": content,
            "role": "assistant",
        }

    @staticmethod
    def _part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}

    def _usage(self) -> dict[str, Any]:
        out = self.plan.output_tokens
        return {
            "input_tokens": self.plan.input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.plan.input_tokens + out,
        }

    def _response(
        self,
        status: str,
        *,
        final: bool = False,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        incomplete = None
        if status == "incomplete":
            reason = "content_filter" if self.plan.finish == "content_filter" else None
            incomplete = {"reason": reason or "max_output_tokens"}
        output = [self._item(lane) for lane in self.plan.lanes if lane.opened] if final else []
        return {
            "id": self.id,
            "object": "response",
            "created_at": CREATED,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": None,
            "max_output_tokens": None,
            "model": self.plan.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": self.plan.tools,
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": self._usage() if final else None,
            "user": None,
            "metadata": {},
        }

    def start(self) -> list[bytes]:
        return [
            self._event("response.created", response=self._response("in_progress")),
            self._event("response.in_progress", response=self._response("in_progress")),
        ]

    def open_lane(self, lane: Lane) -> list[bytes]:
        lane.opened = True
        events = [
            self._event(
                "response.output_item.added", output_index=lane.index, item=self._item(lane)
            )
        ]
        if lane.kind == "text":
            events.append(
                self._item_event(
                    "response.content_part.added", lane, content_index=0, part=self._part("")
                )
            )
        return events

    def delta(self, lane: Lane, piece: str) -> bytes:
        lane.parts.append(piece)
        return self._delta(lane, piece)

    def _delta(self, lane: Lane, delta: object) -> bytes:
        """A lane's delta event (``delta`` not a string: the invalid shape)."""
        if lane.kind == "tool":
            return self._item_event("response.function_call_arguments.delta", lane, delta=delta)
        return self._item_event(
            "response.output_text.delta", lane, content_index=0, delta=delta, logprobs=[]
        )

    def close_lane(self, lane: Lane) -> list[bytes]:
        text = "".join(lane.parts)
        events = []
        if lane.kind == "tool":
            events.append(
                self._item_event(
                    "response.function_call_arguments.done",
                    lane,
                    name=lane.tool_name,
                    arguments=text,
                )
            )
        else:
            events.append(
                self._item_event(
                    "response.output_text.done", lane, content_index=0, text=text, logprobs=[]
                )
            )
            events.append(
                self._item_event(
                    "response.content_part.done", lane, content_index=0, part=self._part(text)
                )
            )
        lane.closed = True
        events.append(
            self._event("response.output_item.done", output_index=lane.index, item=self._item(lane))
        )
        return events

    def terminator(self) -> list[bytes]:
        if self.plan.finish in ("length", "content_filter"):
            response = self._response("incomplete", final=True)
            return [self._event("response.incomplete", response=response)]
        return [self._event("response.completed", response=self._response("completed", final=True))]

    def error_event(self) -> bytes:
        error = {"code": "server_error", "message": _ERROR_MESSAGE}
        response = self._response("failed", final=True, error=error)
        return self._event("response.failed", response=response)

    def invalid_shape_event(self, lane: Lane) -> bytes:
        return self._delta(lane, 42)

    def body(self) -> dict[str, Any]:
        for lane in self.plan.lanes:
            lane.opened = True
            lane.parts = [_drain(lane)]
        status = "incomplete" if self.plan.finish in ("length", "content_filter") else "completed"
        return self._response(status, final=True)


_ANTHROPIC_STOP: Final = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}


class MessagesRenderer(Renderer):
    """Anthropic Messages: named events whose data repeats the name in ``type``."""

    def __init__(self, plan: Plan, framer: Framer) -> None:
        super().__init__(plan, framer)
        self.id = f"msg_sim{sim_id('anthropic', plan.seed)}"
        self.pinged = False

    def _event(self, kind: str, **fields: Any) -> bytes:
        return self.framer.event(dumps({"type": kind, **fields}), name=kind)

    def _message(self, content: list[Any], stop: str | None, output_tokens: int) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.plan.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {
                "input_tokens": self.plan.input_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": output_tokens,
            },
        }

    def _tool_id(self, lane: Lane) -> str:
        return f"toolu_sim{sim_id('toolu', self.plan.seed * 64 + lane.index)}"

    def start(self) -> list[bytes]:
        return [self._event("message_start", message=self._message([], None, 1))]

    def open_lane(self, lane: Lane) -> list[bytes]:
        if lane.kind == "tool":
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": self._tool_id(lane),
                "name": lane.tool_name,
                "input": {},
            }
        else:
            block = {"type": "text", "text": ""}
        events = [self._event("content_block_start", index=lane.index, content_block=block)]
        if not self.pinged:
            self.pinged = True
            events.append(self._event("ping"))
        return events

    def delta(self, lane: Lane, piece: str) -> bytes:
        if lane.kind == "tool":
            delta = {"type": "input_json_delta", "partial_json": piece}
        else:
            delta = {"type": "text_delta", "text": piece}
        return self._event("content_block_delta", index=lane.index, delta=delta)

    def close_lane(self, lane: Lane) -> list[bytes]:
        return [self._event("content_block_stop", index=lane.index)]

    def finish(self, *, stopped: bool) -> list[bytes]:
        if not stopped:
            return []
        delta = {"stop_reason": _ANTHROPIC_STOP[self.plan.finish], "stop_sequence": None}
        usage = {"output_tokens": self.plan.output_tokens}
        return [self._event("message_delta", delta=delta, usage=usage)]

    def terminator(self) -> list[bytes]:
        return [self._event("message_stop")]

    def error_event(self) -> bytes:
        return self._event("error", error={"type": "overloaded_error", "message": "Overloaded"})

    def invalid_shape_event(self, lane: Lane) -> bytes:
        return self._event("content_block_delta", index=lane.index, delta="shape")

    def body(self) -> dict[str, Any]:
        content: list[Any] = []
        for lane in self.plan.lanes:
            text = _drain(lane)
            if lane.kind == "tool":
                try:
                    parsed = json.loads(text)
                except ValueError:
                    parsed = {"_raw": text}
                content.append(
                    {
                        "type": "tool_use",
                        "id": self._tool_id(lane),
                        "name": lane.tool_name,
                        "input": parsed,
                    }
                )
            else:
                content.append({"type": "text", "text": text})
        return self._message(content, _ANTHROPIC_STOP[self.plan.finish], self.plan.output_tokens)


_OPENAI_ERROR_TYPES: Final = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("requests", "rate_limit_exceeded"),
}
_ANTHROPIC_ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


#: HTTP status -> the canonical ``google.rpc.Code`` name Google's errors carry.
_GOOGLE_STATUS: Final = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "NOT_IMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def error_body(protocol: str, status: int, message: str, request_id: str) -> dict[str, Any]:
    """A non-2xx JSON error body in the provider's own shape."""
    if protocol in OLLAMA:
        return {"error": message}
    if protocol == "gemini":
        name = _GOOGLE_STATUS.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")
        return {"error": {"code": status, "message": message, "status": name}}
    if protocol == "messages":
        kind = _ANTHROPIC_ERROR_TYPES.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        return {
            "type": "error",
            "error": {"type": kind, "message": message},
            "request_id": request_id,
        }
    kind, code = _OPENAI_ERROR_TYPES.get(
        status, ("server_error" if status >= 500 else "invalid_request_error", None)
    )
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def context_length_body(protocol: str) -> dict[str, Any]:
    """A 400 saying the prompt is too long for the model, as each provider says it."""
    if protocol == "messages":
        return {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 208310 tokens > 200000 maximum",
            },
        }
    message = "This model's maximum context length is 8192 tokens."
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def models_body(*, anthropic: bool) -> dict[str, Any]:
    """``GET /v1/models`` in the OpenAI or (with ``anthropic-version``) Anthropic shape.

    One model, the name the documentation's examples use (any name is answered alike).
    """
    names = (DEFAULT_MODEL,)
    if anthropic:
        listing: list[dict[str, Any]] = [
            {
                "type": "model",
                "id": name,
                "display_name": name.replace("-", " ").title(),
                "created_at": "2025-01-01T00:00:00Z",
                "lifecycle": "active",
            }
            for name in names
        ]
        return {"data": listing, "has_more": False, "first_id": names[0], "last_id": names[-1]}
    data: list[dict[str, Any]] = [
        {"id": name, "object": "model", "created": CREATED, "owned_by": "simulator"}
        for name in names
    ]
    return {"object": "list", "data": data}


def _vector(text: str, dimensions: int) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    while len(digest) < dimensions:
        digest += hashlib.sha256(digest).digest()
    return [round((byte - 127.5) / 127.5, 6) for byte in digest[:dimensions]]


def embeddings_body(body: dict[str, Any]) -> dict[str, Any]:
    """A deterministic embeddings answer (float or base64 ``encoding_format``)."""
    raw = body.get("input")
    inputs: list[Any] = raw if isinstance(raw, list) and raw else [raw]
    if inputs and all(isinstance(x, int) for x in inputs):  # one token array
        inputs = [inputs]
    dimensions = _int_or_none(body.get("dimensions")) or 8
    dimensions = max(1, min(dimensions, 4096))
    as_base64 = body.get("encoding_format") == "base64"
    data = []
    tokens = 0
    for index, item in enumerate(inputs):
        text = item if isinstance(item, str) else json.dumps(item)
        tokens += max(1, len(text) // 4)
        vector = _vector(text, dimensions)
        embedding: Any = vector
        if as_base64:
            embedding = base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    model = body.get("model")
    return {
        "object": "list",
        "data": data,
        "model": model if isinstance(model, str) else DEFAULT_MODEL,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
