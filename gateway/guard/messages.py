"""The Anthropic Messages API (``/messages``) completion contract.

The stream is ``message_start``, then content blocks (``content_block_start``,
``content_block_delta``..., ``content_block_stop``, each naming its
``index``), one or more ``message_delta`` (``stop_reason`` and cumulative
usage), and ``message_stop``, the terminator. ``ping`` may come anywhere;
``error`` (``overloaded_error``, ``api_error``...) is the upstream's own error
event: forwarded, verdict ``upstream_error``.

Checks, each rejecting the event at which it fails: JSON object with a string
``type`` that matches the ``event:`` name (when there is one); nothing but
``ping``/``error`` before ``message_start``, and only one of those; a delta or
stop only for a block that was started (else ``invalid_shape``) and not yet
stopped (a delta after the stop is ``content_after_finish``); no block starts
or deltas after a ``message_delta`` carried the ``stop_reason``
(``content_after_finish``); a tool block's assembled ``partial_json`` is valid
JSON at its ``content_block_stop`` (empty means ``{}``: no-argument tools);
``message_stop`` needs a ``stop_reason`` and no open block
(``missing_finish``), with one exception: a stop reason of the ``length``
family (``max_tokens``) may leave the last started block open, because a cut
can end it mid-way (fine-grained tool streaming cut mid-parameter, as
Anthropic documents); that block's input is then not judged either, the same
rule as tool arguments cut by ``length`` in Chat. Unknown event and delta
types are forwarded and ignored.

Memory: counters, per block its type and state, the tool input JSON of tool
blocks, and the text only with ``keep_text=True``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.guard.contract import (
    Action,
    Contract,
    Incomplete,
    Protocol,
    data_line,
    parse_json_object,
    valid_tool_arguments,
)
from gateway.guard.joint import Joint, MessagesJoint
from gateway.guard.sse import Event
from gateway.guard.usage import messages_usage
from gateway.guard.verdict import Reason, Usage

__all__ = ["MessagesContract", "text_delta"]


@dataclass(slots=True)
class _Block:
    type: str
    open: bool = True
    #: The block takes its input as ``input_json_delta`` (tool_use, server_tool_use, ...).
    tool: bool = False
    id: str = ""
    name: str = ""
    json: list[str] = field(default_factory=list)


#: ``delta`` type -> the field holding its text, for deltas that carry output.
_TEXT_FIELDS = {
    "text_delta": "text",
    "input_json_delta": "partial_json",
    "thinking_delta": "thinking",
}


def text_delta(obj: Any) -> str | None:
    """A ``text_delta``'s text; None for any other event (the common event of an
    answer, read in compiled code by the contract)."""
    if type(obj) is dict and obj.get("type") == "content_block_delta":
        delta = obj.get("delta")
        if type(delta) is dict and delta.get("type") == "text_delta":
            text = delta.get("text")
            if type(text) is str:
                return text
    return None


class MessagesContract(Contract):
    """Anthropic Messages stream contract (``POST /v1/messages`` with ``stream: true``)."""

    protocol = Protocol.MESSAGES
    wording = {
        Reason.MISSING_DONE: "the upstream ended the stream before the message stopped",
        Reason.MISSING_FINISH: (
            "the upstream stopped the message without a stop reason or with a content block open"
        ),
        Reason.CONTENT_AFTER_FINISH: (
            "the upstream sent content after its content block or the message had stopped"
        ),
        Reason.INVALID_TOOL_ARGUMENTS: "the upstream sent tool input that is not valid JSON",
    }

    @classmethod
    def error_event(cls, incomplete: Incomplete) -> bytes:
        """Anthropic's ``event: error`` shape, the reason where the anthropic SDKs read a
        stable cause code (``APIStatusError.error_code`` / ``APIError.errorCode``)."""
        return data_line(
            {
                "type": "error",
                "error": {
                    "type": "api_error",
                    "message": incomplete.message,
                    "details": {"error_code": str(incomplete.reason)},
                },
            },
            event="error",
        )

    def __init__(self, *, keep_text: bool = False) -> None:
        super().__init__()
        self.keep_text = keep_text
        self._started = False
        self._stop_reason: str | None = None
        #: The first tool block whose assembled input is not valid JSON. Judged at the
        #: stop reason: a max_tokens cut may end a tool input mid-way (contract met).
        self._bad_tool_block: int | None = None
        self._blocks: dict[int, _Block] = {}
        #: The index of the block started last: the one a max_tokens cut may leave open.
        self._last_block: int | None = None
        self._text: list[str] = []

    # -- results for callers that asked for them -----------------------------

    def text(self) -> str:
        """The assembled text of all text blocks (only with ``keep_text=True``)."""
        return "".join(self._text)

    def continuable(self) -> bool:
        """Whether the answer so far can be continued by a prefilled request: only text
        blocks, the last one still open, the message not stopped (``keep_text``)."""
        last = self._last_block
        return (
            self.keep_text
            and bool(self._text)
            and self._stop_reason is None
            and last is not None
            and self._blocks[last].open
            and all(block.type == "text" for block in self._blocks.values())
        )

    def joint(self, cut: Usage) -> Joint | None:
        """Messages' joint: a continuation goes on in the open text block."""
        return MessagesJoint(self.open_block, cut)

    def next_joint(self, joint: Joint, cut: Usage) -> Joint:
        return joint.following(self.open_block, cut)

    @property
    def open_block(self) -> int:
        """The index of the block a continuation goes on with (the last one started)."""
        return self._last_block if self._last_block is not None else 0

    def tool_call_arguments(self) -> list[tuple[str, str, str]]:
        """(id, name, input JSON) of each ``tool_use`` block, in index order."""
        return [
            (block.id, block.name, "".join(block.json))
            for _, block in sorted(self._blocks.items())
            if block.type == "tool_use"
        ]

    @property
    def tool_calls(self) -> int:
        """``tool_use`` blocks: tools the client must run (server tools are not counted)."""
        return sum(1 for block in self._blocks.values() if block.type == "tool_use")

    # -- the contract ----------------------------------------------------------

    def delta_text(self) -> str | None:
        """The event's text, when it is a ``text_delta`` (``text_delta``)."""
        return text_delta(self.parsed)

    def _on_event(self, event: Event) -> Action:
        if event.event == "error":
            return self._upstream_error()
        obj = self.parsed = parse_json_object(event.data)
        kind = obj.get("type")
        if not isinstance(kind, str):
            raise self._reject(Reason.INVALID_SHAPE, "event has no string type")
        if kind == "error":
            return self._upstream_error()
        if event.event != "message" and event.event != kind:
            raise self._reject(Reason.INVALID_SHAPE, "event name and data type differ")
        if kind == "ping":
            return Action.FORWARD
        if kind == "message_start":
            return self._on_message_start(obj)
        if not self._started:
            raise self._reject(Reason.INVALID_SHAPE, f"{kind} arrived before message_start")
        if kind == "content_block_start":
            self._on_block_start(obj)
        elif kind == "content_block_delta":
            self._on_block_delta(obj)
        elif kind == "content_block_stop":
            self._on_block_stop(obj)
        elif kind == "message_delta":
            self._on_message_delta(obj)
        elif kind == "message_stop":
            return self._on_message_stop()
        return Action.FORWARD

    # -- message level -----------------------------------------------------------

    def _on_message_start(self, obj: dict[str, Any]) -> Action:
        if self._started:
            raise self._reject(Reason.INVALID_SHAPE, "message_start arrived twice")
        message = obj.get("message")
        if not isinstance(message, dict):
            raise self._reject(Reason.INVALID_SHAPE, "message_start.message is not an object")
        self._take_usage(message.get("usage"))
        self._note_model(message.get("model"))
        self._started = True
        return Action.FORWARD

    def _on_message_delta(self, obj: dict[str, Any]) -> None:
        delta = obj.get("delta")
        if not isinstance(delta, dict):
            raise self._reject(Reason.INVALID_SHAPE, "message_delta.delta is not an object")
        stop_reason = delta.get("stop_reason")
        if stop_reason is not None and not isinstance(stop_reason, str):
            raise self._reject(Reason.INVALID_SHAPE, "message_delta stop_reason is not a string")
        if stop_reason:
            self._check_tool_inputs(stop_reason)
        self._take_usage(obj.get("usage"))
        if stop_reason:
            self._stop_reason = stop_reason
            self.finish_reasons[0] = stop_reason

    def _on_message_stop(self) -> Action:
        unfinished = [index for index, block in sorted(self._blocks.items()) if block.open]
        reason = None if self._stop_reason is None else self.normalize(self._stop_reason)
        if unfinished and not (reason is Reason.LENGTH and unfinished == [self._last_block]):
            raise self._reject(
                Reason.MISSING_FINISH, f"message_stop arrived while block {unfinished[0]} was open"
            )
        if reason is None:
            raise self._reject(Reason.MISSING_FINISH, "message_stop arrived without a stop_reason")
        return self._complete(reason)

    def _check_tool_inputs(self, stop_reason: str) -> None:
        """At the stop reason: broken tool input is the upstream's fault unless it was cut."""
        if self._bad_tool_block is not None and self.normalize(stop_reason) is not Reason.LENGTH:
            raise self._reject(
                Reason.INVALID_TOOL_ARGUMENTS,
                f"content block {self._bad_tool_block} tool input is not valid JSON",
            )

    def _take_usage(self, raw: object) -> None:
        """Merge a usage object: counts are cumulative, a field left out keeps its value."""
        if raw is None:
            return
        if not isinstance(raw, dict):
            raise self._reject(Reason.INVALID_SHAPE, "usage is not an object")
        reported = messages_usage(raw)
        assert reported is not None
        self.usage = reported if self.usage is None else self.usage.merged(reported)

    # -- content blocks ----------------------------------------------------------

    def _index_of(self, obj: dict[str, Any]) -> int:
        index = obj.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise self._reject(Reason.INVALID_SHAPE, f"{obj.get('type')}.index is not an integer")
        return index

    def _check_not_stopped(self, what: str) -> None:
        if self._stop_reason is not None:
            raise self._reject(Reason.CONTENT_AFTER_FINISH, f"{what} arrived after the stop_reason")

    def _on_block_start(self, obj: dict[str, Any]) -> None:
        index = self._index_of(obj)
        self._check_not_stopped("content_block_start")
        if index in self._blocks:
            raise self._reject(Reason.INVALID_SHAPE, f"content block {index} started twice")
        raw = obj.get("content_block")
        if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
            raise self._reject(Reason.INVALID_SHAPE, "content_block is not a typed object")
        kind: str = raw["type"]
        block = self._blocks[index] = _Block(type=kind, tool=kind.endswith("tool_use"))
        self._last_block = index
        for attr in ("id", "name"):
            value = raw.get(attr)
            if isinstance(value, str):
                setattr(block, attr, value)
        initial = raw.get("text") if kind == "text" else None
        if isinstance(initial, str) and initial:
            self._count(initial, text=True)

    def _open_block(self, obj: dict[str, Any]) -> tuple[int, _Block]:
        index = self._index_of(obj)
        block = self._blocks.get(index)
        kind = obj.get("type")
        if block is None:
            raise self._reject(Reason.INVALID_SHAPE, f"{kind} for content block {index} unstarted")
        if not block.open:
            reason = (
                Reason.CONTENT_AFTER_FINISH
                if kind == "content_block_delta"
                else Reason.INVALID_SHAPE
            )
            raise self._reject(reason, f"{kind} for content block {index} after its stop")
        return index, block

    def _on_block_delta(self, obj: dict[str, Any]) -> None:
        _, block = self._open_block(obj)
        self._check_not_stopped("content_block_delta")
        delta = obj.get("delta")
        if not isinstance(delta, dict) or not isinstance(delta.get("type"), str):
            raise self._reject(Reason.INVALID_SHAPE, "content_block_delta.delta is not typed")
        kind: str = delta["type"]
        key = _TEXT_FIELDS.get(kind)
        if key is None:  # signature_delta, citations_delta, future types: no text
            return
        piece = delta.get(key)
        if not isinstance(piece, str):
            raise self._reject(Reason.INVALID_SHAPE, f"{kind}.{key} is not a string")
        if kind == "input_json_delta":
            block.tool = True
            if piece:
                block.json.append(piece)
        if piece:
            self._count(piece, text=kind == "text_delta")

    def _count(self, piece: str, *, text: bool) -> None:
        self.content_events += 1
        self.content_chars += len(piece)
        if text and self.keep_text:
            self._text.append(piece)

    def _on_block_stop(self, obj: dict[str, Any]) -> None:
        index, block = self._open_block(obj)
        if block.tool:
            arguments = "".join(block.json)
            if self._bad_tool_block is None and not valid_tool_arguments(arguments):
                self._bad_tool_block = index
            block.json = [arguments] if arguments else []
        block.open = False
