"""The OpenAI Responses API (``/responses``) completion contract.

The stream is a sequence of typed events: each block names its type in
``event:`` and repeats it as ``"type"`` in a JSON object that also carries an
increasing ``sequence_number``. There is no ``[DONE]``: the stream is complete
at ``response.completed`` (reason ``stop``, or ``tool_calls`` when the output
holds a client tool call) or ``response.incomplete`` (reason from
``incomplete_details.reason``). ``response.failed`` and ``error`` are the
upstream's own error events: forwarded, verdict ``upstream_error``.

Checks, each rejecting the event at which it fails: JSON object with a string
``type`` that matches the ``event:`` name (when there is one); a
``sequence_number``, when present, is a non-negative integer above the last
one; text deltas are strings and never follow their output item's
``response.output_item.done``; function-call arguments, assembled per output
item, are valid JSON when the call finishes
(``response.function_call_arguments.done``, ``response.output_item.done``) and
at ``response.completed``. At ``response.completed`` every output item that
was added has had its ``response.output_item.done``, and every item of the
model's own (message, function or custom tool call, reasoning) that the
response lists has status ``completed`` or none, else ``missing_finish``; a
hosted tool call's status is the tool's (real streams end with an image
generation still ``generating``), not checked.
Unknown event types are forwarded and ignored (the API adds new ones often).

Memory: counters, the arguments of each function call, the set of finished
output indices (and of those added and not yet done), and the text only with
``keep_text=True``. Terminal events are
read for their status, output item types and usage, never stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeGuard

from gateway.guard.contract import (
    Action,
    Contract,
    Incomplete,
    Protocol,
    data_line,
    parse_json_object,
    valid_tool_arguments,
)
from gateway.guard.sse import Event
from gateway.guard.usage import responses_usage
from gateway.guard.verdict import Reason

__all__ = ["ResponsesContract", "output_text"]

#: Deltas that carry output the client asked for: counted as content.
_TEXT_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta",
        "response.custom_tool_call_input.delta",
    }
)
#: Output item types that ask the client to run a tool (finish ``tool_calls``).
_CLIENT_TOOL_ITEMS = frozenset({"function_call", "custom_tool_call"})

#: Output items the model itself writes: in ``response.completed`` each has status
#: ``completed`` (or none: the API's reasoning items often carry none, or null).
#: A hosted tool call's status is the tool's, not the answer's: real complete streams
#: end with an ``image_generation_call`` still ``generating``, or a search ``failed``.
_MODEL_ITEMS = frozenset({"message", "function_call", "custom_tool_call", "reasoning"})

_INCOMPLETE: dict[str, Reason] = {
    "max_output_tokens": Reason.LENGTH,
    "content_filter": Reason.CONTENT_FILTER,
}


@dataclass(slots=True)
class _FunctionCall:
    item_id: str = ""
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    #: Set once the arguments were final and checked (a ``.done`` event).
    finished: bool = False


def _is_index(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def output_text(obj: Any) -> str | None:
    """A ``response.output_text.delta``'s text; None for any other event (the common
    event of an answer, read in compiled code by the contract)."""
    if type(obj) is dict and obj.get("type") == "response.output_text.delta":
        delta = obj.get("delta")
        if type(delta) is str:
            return delta
    return None


class ResponsesContract(Contract):
    """OpenAI Responses API stream contract (``POST /responses`` with ``stream: true``)."""

    protocol = Protocol.RESPONSES
    wording = {
        Reason.MISSING_DONE: "the upstream ended the stream before the response was done",
        Reason.MISSING_FINISH: (
            "the upstream ended the response while an output item was unfinished"
        ),
        Reason.CONTENT_AFTER_FINISH: (
            "the upstream sent content for an output item after it was done"
        ),
        Reason.INVALID_TOOL_ARGUMENTS: (
            "the upstream sent function call arguments that are not valid JSON"
        ),
    }

    @classmethod
    def error_event(cls, incomplete: Incomplete) -> bytes:
        """``event: error`` with the documented flat fields, plus a nested ``error``
        object (openai-python raises only on a top-level ``error`` key)."""
        sequence = (
            0 if incomplete.last_sequence_number is None else incomplete.last_sequence_number + 1
        )
        return data_line(
            {
                "type": "error",
                "code": str(incomplete.reason),
                "message": incomplete.message,
                "param": None,
                "sequence_number": sequence,
                "error": {
                    "type": "stream_incomplete",
                    "code": str(incomplete.reason),
                    "message": incomplete.message,
                },
            },
            event="error",
        )

    def __init__(self, *, keep_text: bool = False) -> None:
        super().__init__()
        self.keep_text = keep_text
        self._last_sequence: int | None = None
        self._calls: dict[int | str, _FunctionCall] = {}
        self._other_tool_items = 0  # client tool calls other than function calls
        self._output_tool_items = 0  # client tool calls listed by response.completed
        self._finished_items: set[int] = set()
        self._open_items: set[int] = set()  # added, and no output_item.done yet
        self._text: list[str] = []
        #: The response's id, as its first event naming one says (``resp_...``).
        self.response_id: str | None = None

    # -- results for callers that asked for them -----------------------------

    def text(self) -> str:
        """The assembled ``output_text`` of all output items (only with ``keep_text=True``)."""
        return "".join(self._text)

    def tool_call_arguments(self) -> list[tuple[str, str, str]]:
        """(call_id, name, arguments) of each function call, in the order they appeared."""
        return [(c.call_id, c.name, "".join(c.arguments)) for c in self._calls.values()]

    @property
    def tool_calls(self) -> int:
        return max(len(self._calls) + self._other_tool_items, self._output_tool_items)

    @property
    def last_sequence_number(self) -> int | None:
        """The highest ``sequence_number`` among the events relayed so far."""
        return self._last_sequence

    # -- the contract ----------------------------------------------------------

    def delta_text(self) -> str | None:
        """The event's text, when it is an ``output_text`` delta (``output_text``)."""
        return output_text(self.parsed)

    def _on_event(self, event: Event) -> Action:
        if event.event == "error":
            return self._upstream_error()
        if event.data.strip() == "[DONE]":
            # Not this protocol's terminator: the stream ended without one.
            raise self._reject(Reason.MISSING_DONE, "[DONE] arrived before response.completed")
        obj = self.parsed = parse_json_object(event.data)
        kind = obj.get("type")
        if not isinstance(kind, str):
            raise self._reject(Reason.INVALID_SHAPE, "event has no string type")
        if kind == "error":
            return self._upstream_error()
        if kind == "response.failed":
            self._take_usage(obj, strict=False)
            return self._upstream_error("the upstream sent response.failed")
        if event.event != "message" and event.event != kind:
            raise self._reject(Reason.INVALID_SHAPE, "event name and data type differ")
        if self.model is None or self.response_id is None:
            response = obj.get("response")
            if isinstance(response, dict):
                self._note_model(response.get("model"))
                found = response.get("id")
                if self.response_id is None and isinstance(found, str) and found:
                    self.response_id = found
        sequence = self._sequence_of(obj)
        action = self._dispatch(kind, obj)
        if sequence is not None:
            self._last_sequence = sequence
        return action

    def _sequence_of(self, obj: dict[str, Any]) -> int | None:
        raw = obj.get("sequence_number")
        if raw is None:
            return None
        if not _is_index(raw):
            raise self._reject(Reason.INVALID_SHAPE, "sequence_number is not an integer")
        if self._last_sequence is not None and raw <= self._last_sequence:
            raise self._reject(
                Reason.INVALID_SHAPE,
                f"sequence_number {raw} does not follow {self._last_sequence}",
            )
        return raw

    def _dispatch(self, kind: str, obj: dict[str, Any]) -> Action:
        if kind in _TEXT_DELTAS:
            self._on_text_delta(kind, obj)
        elif kind == "response.function_call_arguments.delta":
            self._on_arguments_delta(obj)
        elif kind == "response.function_call_arguments.done":
            self._on_arguments_done(obj)
        elif kind == "response.output_item.added":
            self._on_item_added(obj)
        elif kind == "response.output_item.done":
            self._on_item_done(obj)
        elif kind == "response.completed":
            return self._on_completed(obj)
        elif kind == "response.incomplete":
            return self._on_incomplete(obj)
        return Action.FORWARD

    # -- content ---------------------------------------------------------------

    def _string(self, obj: dict[str, Any], key: str) -> str:
        value = obj.get(key)
        if not isinstance(value, str):
            raise self._reject(Reason.INVALID_SHAPE, f"{obj.get('type')}.{key} is not a string")
        return value

    def _check_open(self, obj: dict[str, Any]) -> None:
        index = obj.get("output_index")
        if _is_index(index) and index in self._finished_items:
            raise self._reject(
                Reason.CONTENT_AFTER_FINISH, f"output item {index} sent content after it was done"
            )

    def _on_text_delta(self, kind: str, obj: dict[str, Any]) -> None:
        delta = self._string(obj, "delta")
        self._check_open(obj)
        if delta:
            self.content_events += 1
            self.content_chars += len(delta)
            if self.keep_text and kind == "response.output_text.delta":
                self._text.append(delta)

    def _call_for(self, obj: dict[str, Any], item_id: object = None) -> _FunctionCall:
        """The function call an event belongs to: by output index, else by item id."""
        if item_id is None:
            item_id = obj.get("item_id")
        index = obj.get("output_index")
        key: int | str
        if _is_index(index):
            key = index
        elif isinstance(item_id, str) and item_id:
            key = item_id
        else:
            raise self._reject(
                Reason.INVALID_SHAPE, "function call event has no output_index or item_id"
            )
        call = self._calls.get(key)
        if call is None:
            call = self._calls[key] = _FunctionCall()
            if isinstance(item_id, str):
                call.item_id = item_id
        return call

    def _on_arguments_delta(self, obj: dict[str, Any]) -> None:
        delta = self._string(obj, "delta")
        self._check_open(obj)
        call = self._call_for(obj)
        if call.finished and delta:
            raise self._reject(
                Reason.CONTENT_AFTER_FINISH, "function call arguments arrived after they were done"
            )
        if delta:
            call.arguments.append(delta)
            self.content_events += 1
            self.content_chars += len(delta)

    def _finish_call(self, call: _FunctionCall, final: object) -> None:
        """Check a call's final arguments (the event's own, else the assembled deltas)."""
        if final is not None and not isinstance(final, str):
            raise self._reject(Reason.INVALID_SHAPE, "function call arguments are not a string")
        arguments = final if isinstance(final, str) else "".join(call.arguments)
        self._check_arguments(arguments)
        call.arguments = [arguments] if arguments else []
        call.finished = True

    def _check_arguments(self, arguments: str) -> None:
        if not valid_tool_arguments(arguments):
            raise self._reject(
                Reason.INVALID_TOOL_ARGUMENTS, "function call arguments are not valid JSON"
            )

    def _on_arguments_done(self, obj: dict[str, Any]) -> None:
        self._finish_call(self._call_for(obj), obj.get("arguments"))

    def _item_of(self, obj: dict[str, Any]) -> dict[str, Any]:
        item = obj.get("item")
        if not isinstance(item, dict):
            raise self._reject(Reason.INVALID_SHAPE, f"{obj.get('type')}.item is not an object")
        return item

    def _on_item_added(self, obj: dict[str, Any]) -> None:
        item = self._item_of(obj)
        kind = item.get("type")
        if kind == "function_call":
            call = self._call_for(obj, item.get("id"))
            for attr in ("call_id", "name"):
                value = item.get(attr)
                if isinstance(value, str):
                    setattr(call, attr, value)
        elif kind in _CLIENT_TOOL_ITEMS:
            self._other_tool_items += 1
        index = obj.get("output_index")
        if _is_index(index) and index not in self._finished_items:
            self._open_items.add(index)

    def _on_item_done(self, obj: dict[str, Any]) -> None:
        item = self._item_of(obj)
        if item.get("type") == "function_call":
            call = self._call_for(obj, item.get("id"))
            if not call.finished:
                self._finish_call(call, item.get("arguments"))
        index = obj.get("output_index")
        if _is_index(index):
            self._finished_items.add(index)
            self._open_items.discard(index)

    # -- terminal events ---------------------------------------------------------

    def _response_of(self, obj: dict[str, Any]) -> dict[str, Any]:
        response = obj.get("response")
        if not isinstance(response, dict):
            raise self._reject(Reason.INVALID_SHAPE, f"{obj.get('type')}.response is not an object")
        return response

    def _take_usage(self, obj: dict[str, Any], *, strict: bool = True) -> None:
        response = obj.get("response")
        if not isinstance(response, dict):
            return
        raw = response.get("usage")
        if raw is None:
            return
        usage = responses_usage(raw)
        if usage is None:
            if strict:
                raise self._reject(Reason.INVALID_SHAPE, "response.usage is not an object")
            return
        self.usage = usage

    def _on_completed(self, obj: dict[str, Any]) -> Action:
        response = self._response_of(obj)
        output = response.get("output")
        if output is None:
            output = []
        elif not isinstance(output, list):
            raise self._reject(Reason.INVALID_SHAPE, "response.output is not a list")
        for call in self._calls.values():
            if not call.finished and call.arguments:  # deltas but no .done event
                self._finish_call(call, None)
        if self._open_items:
            raise self._reject(
                Reason.MISSING_FINISH,
                f"output item {min(self._open_items)} was added but never done",
            )
        listed = 0
        for index, item in enumerate(output):
            if not isinstance(item, dict):
                raise self._reject(Reason.INVALID_SHAPE, "a response.output item is not an object")
            kind = item.get("type")
            status = item.get("status")
            if status is not None and status != "completed" and kind in _MODEL_ITEMS:
                raise self._reject(
                    Reason.MISSING_FINISH, f"output item {index} ({kind}) is {status!r}"
                )
            if kind == "function_call":
                arguments = item.get("arguments")
                if isinstance(arguments, str):
                    self._check_arguments(arguments)
            listed += kind in _CLIENT_TOOL_ITEMS
        self._take_usage(obj)
        self._output_tool_items = listed
        wants_tools = self.tool_calls > 0
        raw = "tool_calls" if wants_tools else "stop"
        self.finish_reasons[0] = raw
        return self._complete(Reason.TOOL_CALLS if wants_tools else Reason.STOP)

    def _on_incomplete(self, obj: dict[str, Any]) -> Action:
        response = self._response_of(obj)
        details = response.get("incomplete_details")
        raw = details.get("reason") if isinstance(details, dict) else None
        if not isinstance(raw, str) or not raw:
            raw = "incomplete"
        self._take_usage(obj)
        self.finish_reasons[0] = raw
        return self._complete(_INCOMPLETE.get(raw, Reason.OTHER))
