"""The Chat Completions completion contract (and legacy Completions, its sibling).

A stream is complete when ``data: [DONE]`` arrives and every choice that
appeared has a ``finish_reason``. Each choice has its own state; tool calls
are assembled per choice and per tool-call index and their arguments must be
valid JSON when the choice finishes. Text is counted, not stored, unless the
caller asks for it (``keep_text=True``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.guard.contract import (
    Action,
    Contract,
    Protocol,
    parse_json_object,
    valid_tool_arguments,
)
from gateway.guard.joint import ChatJoint, Joint
from gateway.guard.sse import Event
from gateway.guard.usage import chat_usage
from gateway.guard.verdict import ERROR_FINISHES, Reason, Usage

__all__ = ["ChatContract", "CompletionsContract", "lone_text"]


@dataclass(slots=True)
class _ToolCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Choice:
    finish: str | None = None
    text: list[str] = field(default_factory=list)
    #: Tool calls by slot, in order of appearance.
    tools: dict[int, _ToolCall] = field(default_factory=dict)
    #: The slot each wire ``index`` currently refers to (see ``_slot_for``).
    slots: dict[int, int] = field(default_factory=dict)
    last_slot: int | None = None


#: Delta fields that make an answer more than text (not continued after a cut).
_NOT_TEXT = ("refusal", "reasoning_content", "reasoning", "audio")


def lone_text(obj: Any) -> str | None:
    """A chunk of one choice (the first) whose delta is text and nothing else,
    unfinished: its text; None for any other chunk (the common chunk of an answer,
    read in compiled code by the contract and by the schema check's parts reader)."""
    if type(obj) is not dict:
        return None
    choices = obj.get("choices")
    if type(choices) is not list or len(choices) != 1:
        return None
    choice = choices[0]
    if type(choice) is not dict:
        return None
    delta = choice.get("delta")
    if (
        type(delta) is not dict
        or len(delta) != 1
        or choice.get("finish_reason")  # "" (some servers' "not yet") is unfinished
        or choice.get("index", 0) != 0
    ):
        return None
    content = delta.get("content")
    return content if type(content) is str else None


def _is_done(data: str) -> bool:
    return data == "[DONE]" or data.strip() == "[DONE]"


class ChatContract(Contract):
    """OpenAI Chat Completions stream contract.

    ``require_finish_reason=False`` accepts ``[DONE]`` alone for providers that
    never send a finish reason (some Ollama versions). ``end_on_finish=True``
    (a route's ``termination = "finish"``) accepts a clean end of the body in
    place of ``[DONE]`` once every choice has finished, for servers that never
    send it; every other check stays as strict. ``withhold_usage=True``
    drops usage-only chunks (``choices: []``) from what the client receives,
    for requests where the gateway injected ``include_usage`` itself.
    """

    protocol = Protocol.CHAT
    wording = {
        Reason.MISSING_FINISH: "the upstream ended the stream while a choice had no finish reason",
        Reason.CONTENT_AFTER_FINISH: "the upstream sent content after a choice had finished",
        Reason.INVALID_TOOL_ARGUMENTS: (
            "the upstream sent tool call arguments that are not valid JSON"
        ),
    }

    def __init__(
        self,
        *,
        require_finish_reason: bool = True,
        withhold_usage: bool = False,
        keep_text: bool = False,
        end_on_finish: bool = False,
    ) -> None:
        super().__init__()
        self.require_finish_reason = require_finish_reason
        self.end_on_finish = end_on_finish
        self.withhold_usage = withhold_usage
        self.keep_text = keep_text
        self._choices: dict[int, _Choice] = {}
        #: With ``keep_text``: the first chunk's id, created, model and
        #: system_fingerprint (a continuation's chunks are rewritten to them), and
        #: whether anything but ``content`` (a refusal, reasoning, audio) was seen.
        self.first_ids: dict[str, Any] = {}
        self.other_content = False

    # -- results for callers that asked for them -----------------------------

    def text(self, index: int = 0) -> str:
        """The assembled text of one choice (only with ``keep_text=True``)."""
        choice = self._choices.get(index)
        return "".join(choice.text) if choice else ""

    def tool_call_arguments(self, index: int = 0) -> list[tuple[str, str, str]]:
        """(id, name, arguments) of each tool call of one choice, in index order."""
        choice = self._choices.get(index)
        if choice is None:
            return []
        return [
            (call.id, call.name, "".join(call.arguments))
            for _, call in sorted(choice.tools.items())
        ]

    @property
    def tool_calls(self) -> int:
        return sum(len(choice.tools) for choice in self._choices.values())

    def delta_text(self) -> str | None:
        """The event's text, when it is a lone text delta (``lone_text``)."""
        return lone_text(self.parsed)

    # -- the contract ----------------------------------------------------------

    def _on_event(self, event: Event) -> Action:
        data = event.data
        if _is_done(data):
            return self._on_done()
        if event.event == "error":
            return self._upstream_error()
        obj = self.parsed = parse_json_object(data)
        if obj.get("error") is not None:
            return self._upstream_error()
        if self.model is None:
            self._note_model(obj.get("model"))
            if self.keep_text and not self.first_ids:
                self.first_ids = {
                    k: obj[k] for k in ("id", "created", "model", "system_fingerprint") if k in obj
                }
        choices = obj.get("choices")
        if choices is None:
            choices = []
        elif not isinstance(choices, list):
            raise self._reject(Reason.INVALID_SHAPE, "choices is not a list")
        has_usage = obj.get("usage") is not None
        if has_usage:
            usage = chat_usage(obj["usage"])
            if usage is None:
                raise self._reject(Reason.INVALID_SHAPE, "usage is not an object")
            self.usage = usage
        carried = False
        for position, raw_choice in enumerate(choices):
            carried |= self._on_choice(position, raw_choice)
        if carried:
            self.content_events += 1
        if not choices and has_usage and self.withhold_usage:
            return Action.WITHHOLD
        return Action.FORWARD

    def _on_done(self) -> Action:
        unfinished = [i for i, c in sorted(self._choices.items()) if c.finish is None]
        if self.require_finish_reason and (unfinished or not self._choices):
            detail = (
                f"[DONE] arrived while choice {unfinished[0]} had no finish_reason"
                if unfinished
                else "[DONE] arrived without any choice"
            )
            raise self._reject(Reason.MISSING_FINISH, detail)
        failed = [(i, r) for i, r in sorted(self.finish_reasons.items()) if r in ERROR_FINISHES]
        if failed:
            # The provider says the choice ended by an error, then sends [DONE] as if
            # all were well: withhold [DONE] so the client's SDK sees our error first.
            index, raw = failed[0]
            raise self._reject(
                Reason.UPSTREAM_ERROR, f"choice {index} finished with the error reason {raw!r}"
            )
        if not self.finish_reasons:
            return self._complete(Reason.OTHER)
        lowest = min(self.finish_reasons)
        return self._complete(self.normalize(self.finish_reasons[lowest]))

    def joint(self, cut: Usage) -> Joint | None:
        """Chat's joint: a continuation's chunks take this stream's first ids."""
        return ChatJoint(dict(self.first_ids), cut)

    def continuable(self) -> bool:
        """Whether the answer so far can be continued by another request: one choice,
        only text (no tool call, refusal, reasoning or audio), not finished, or finished
        with ``stop`` (its text is whole, only its end is missing: a continuation with
        nothing more proves it). Reads what the contract keeps with ``keep_text``."""
        choice = self._choices.get(0)
        return (
            self.keep_text
            and len(self._choices) == 1
            and choice is not None
            and choice.finish in (None, "stop")
            and not choice.tools
            and not self.other_content
            and bool(choice.text)
        )

    def _on_clean_end(self) -> None:
        if (
            self.end_on_finish
            and self._choices
            and all(c.finish is not None for c in self._choices.values())
        ):
            self._on_done()

    def _content_of(self, choice: dict[str, Any]) -> tuple[list[str], list[Any] | None]:
        """Text pieces and raw tool-call deltas of one choice (chat: from ``delta``)."""
        delta = choice.get("delta")
        if delta is None:
            return [], None
        if not isinstance(delta, dict):
            raise self._reject(Reason.INVALID_SHAPE, "delta is not an object")
        pieces: list[str] = []
        for key in ("content", "refusal", "reasoning_content", "reasoning"):
            value = delta.get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                raise self._reject(Reason.INVALID_SHAPE, f"delta.{key} is not a string")
            if value:
                pieces.append(value)
        if self.keep_text and not self.other_content:
            self.other_content = any(delta.get(key) for key in _NOT_TEXT)
        tools = delta.get("tool_calls")
        legacy = delta.get("function_call")
        if tools is None and isinstance(legacy, dict):
            tools = [{"index": 0, "function": legacy}]
        if tools is not None and not isinstance(tools, list):
            raise self._reject(Reason.INVALID_SHAPE, "delta.tool_calls is not a list")
        return pieces, tools

    def _on_choice(self, position: int, raw: object) -> bool:
        if not isinstance(raw, dict):
            raise self._reject(Reason.INVALID_SHAPE, "a choice is not an object")
        index = raw.get("index", position)
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise self._reject(Reason.INVALID_SHAPE, "choice index is not an integer")
        state = self._choices.get(index)
        if state is None:
            state = self._choices[index] = _Choice()
        pieces, tools = self._content_of(raw)
        carried = bool(pieces) or self._has_tool_content(tools)
        if carried and state.finish is not None:
            raise self._reject(
                Reason.CONTENT_AFTER_FINISH, f"choice {index} sent content after finishing"
            )
        for piece in pieces:
            self.content_chars += len(piece)
            if self.keep_text:
                state.text.append(piece)
        if tools:
            self._on_tool_deltas(state, tools)
        finish = raw.get("finish_reason")
        if finish:  # None, and the "" some servers send on every chunk, mean "not yet"
            if not isinstance(finish, str):
                raise self._reject(Reason.INVALID_SHAPE, "finish_reason is not a string")
            if state.finish is None:
                # A length cut may end a tool call mid-arguments: that is the provider's
                # contract met (reason "length"), not broken arguments.
                if self.normalize(finish) is not Reason.LENGTH:
                    self._check_tool_arguments(index, state)
                state.finish = finish
                self.finish_reasons[index] = finish
        return carried

    @staticmethod
    def _has_tool_content(tools: list[Any] | None) -> bool:
        if not tools:
            return False
        for call in tools:
            if isinstance(call, dict):
                function = call.get("function")
                if isinstance(function, dict) and (
                    function.get("arguments") or function.get("name")
                ):
                    return True
        return False

    def _on_tool_deltas(self, state: _Choice, tools: list[Any]) -> None:
        for raw in tools:
            if not isinstance(raw, dict):
                raise self._reject(Reason.INVALID_SHAPE, "a tool call delta is not an object")
            index = raw.get("index")
            if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
                raise self._reject(Reason.INVALID_SHAPE, "tool call index is not an integer")
            call_id = raw.get("id")
            if not isinstance(call_id, str):
                call_id = ""
            call = state.tools[self._slot_for(state, index, call_id)]
            if call_id:
                call.id = call_id
            function = raw.get("function")
            if function is None:
                continue
            if not isinstance(function, dict):
                raise self._reject(Reason.INVALID_SHAPE, "tool call function is not an object")
            name = function.get("name")
            if isinstance(name, str) and name and not call.name:
                call.name = name
            arguments = function.get("arguments")
            if arguments is not None:
                if not isinstance(arguments, str):
                    raise self._reject(Reason.INVALID_SHAPE, "tool call arguments not a string")
                if arguments:
                    call.arguments.append(arguments)
                    self.content_chars += len(arguments)

    @staticmethod
    def _slot_for(state: _Choice, index: int | None, call_id: str) -> int:
        """Which tool call a delta belongs to.

        OpenAI numbers calls with ``index`` and sends the ``id`` once. Some servers
        omit ``index`` (Gemini's compatible endpoint) or send every call as index
        0 with its own ``id``: a new ``id`` starts a new call, a delta without one
        continues the call its index (or, without an index, the last call) refers to.
        """
        if index is not None:
            slot = state.slots.get(index)
            if slot is not None and call_id and state.tools[slot].id not in ("", call_id):
                slot = None
        elif state.last_slot is not None and (
            not call_id or state.tools[state.last_slot].id in ("", call_id)
        ):
            slot = state.last_slot
        else:
            slot = None
        if slot is None:
            slot = len(state.tools)
            state.tools[slot] = _ToolCall()
            if index is not None:
                state.slots[index] = slot
        state.last_slot = slot
        return slot

    def _check_tool_arguments(self, index: int, state: _Choice) -> None:
        for tool_index, call in sorted(state.tools.items()):
            if not valid_tool_arguments("".join(call.arguments)):
                raise self._reject(
                    Reason.INVALID_TOOL_ARGUMENTS,
                    f"choice {index} tool call {tool_index} arguments are not valid JSON",
                )


class CompletionsContract(ChatContract):
    """Legacy Completions (``/completions``): ``choices[].text`` instead of a delta."""

    protocol = Protocol.COMPLETIONS

    def _content_of(self, choice: dict[str, Any]) -> tuple[list[str], list[Any] | None]:
        text = choice.get("text")
        if text is None:
            return [], None
        if not isinstance(text, str):
            raise self._reject(Reason.INVALID_SHAPE, "choice text is not a string")
        return ([text] if text else []), None
