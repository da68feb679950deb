"""AWS Bedrock Runtime's streams (``converse-stream``, ``invoke-with-response-stream``):
the completion contract, over the event stream framing.

Each frame is one event (``gateway.guard.eventstream``). A frame whose
``:message-type`` is ``exception`` or ``error`` is the upstream's own error
(``modelStreamErrorException``, ``throttlingException``, ...): forwarded,
verdict ``upstream_error``. Which of the two streams it is shows in its
first event, so one contract judges both:

**ConverseStream**: ``messageStart``, then content blocks (a tool block opens
with ``contentBlockStart``, a text or reasoning block with its first
``contentBlockDelta``; each ends with ``contentBlockStop``), ``messageStop``
with a ``stopReason``, and ``metadata`` with ``usage``, the terminator.
Checks, each rejecting the event at which it fails: a JSON object; nothing
before ``messageStart`` and only one of it; a block index that is a
non-negative integer; no delta or stop of a block that stopped
(``content_after_finish``, ``invalid_shape``); a tool block's assembled
``input`` is valid JSON at its stop (empty means ``{}``); ``messageStop``
has a string ``stopReason`` and no block open, unless it is ``max_tokens``
(``missing_finish``); nothing but ``metadata`` after it
(``content_after_finish``). A clean end before ``metadata`` is
``missing_done``. ``stopReason`` maps ``end_turn``/``stop_sequence`` to
``stop``, ``max_tokens`` (and ``model_context_window_exceeded``) to
``length``, ``tool_use`` to ``tool_calls``, ``guardrail_intervened`` and
``content_filtered`` to ``content_filter``.

**InvokeModelWithResponseStream**: ``chunk`` events whose ``bytes`` (base64)
carry the model's own events. An Anthropic model's are the Messages events,
judged by the Messages contract (``gateway.guard.messages``): its verdict is
this stream's. Any other model's stream is complete at the chunk that
carries ``amazon-bedrock-invocationMetrics`` (Bedrock adds it to a model's
last event), its stop reason read from the model's ``stop_reason``,
``stopReason``, ``completionReason`` or ``finish_reason``. The metrics'
token counts are the usage.

An incomplete stream gets one exception frame (``:exception-type:
modelStreamErrorException``, the message naming the reason and the request
id): botocore raises ``EventStreamError`` on it, and the Anthropic Bedrock
clients raise as on an ``error`` event. A binary stream has no comment: a
complete one gets nothing.

Memory: counters, per block its kind and state and a tool block's input.
"""

from __future__ import annotations

import binascii
import json
from dataclasses import dataclass, field
from typing import Any, Final

from gateway.guard.contract import (
    Action,
    Contract,
    Incomplete,
    Protocol,
    parse_json_object,
    valid_tool_arguments,
)
from gateway.guard.decoder import Event
from gateway.guard.eventstream import encode_frame
from gateway.guard.framing import EVENTSTREAM
from gateway.guard.messages import MessagesContract
from gateway.guard.usage import UsageKeys
from gateway.guard.verdict import FINISH_REASONS, Reason, Usage

__all__ = ["BEDROCK_FINISH", "BedrockContract", "bedrock_usage", "exception_frame"]

#: Converse's ``stopReason`` and the invoke models' stop reasons -> the vocabulary.
BEDROCK_FINISH = {
    **FINISH_REASONS,
    "guardrail_intervened": Reason.CONTENT_FILTER,
    "content_filtered": Reason.CONTENT_FILTER,
    "FINISH": Reason.STOP,  # Amazon Titan's completionReason
    "LENGTH": Reason.LENGTH,
    "CONTENT_FILTERED": Reason.CONTENT_FILTER,
}
_METRICS = "amazon-bedrock-invocationMetrics"
_STOP_KEYS = ("stop_reason", "stopReason", "completionReason", "finish_reason")


_CONVERSE_USAGE: Final = UsageKeys(
    "inputTokens",
    "outputTokens",
    cached=(None, "cacheReadInputTokens"),
    cache_write="cacheWriteInputTokens",
)
#: ``amazon-bedrock-invocationMetrics``: ``inputTokenCount``, ``outputTokenCount``.
_METRICS_USAGE: Final = UsageKeys("inputTokenCount", "outputTokenCount")


def bedrock_usage(raw: object) -> Usage | None:
    """Converse's ``usage`` (``inputTokens``, ``outputTokens``, ``cacheReadInputTokens``,
    ``cacheWriteInputTokens``)."""
    return _CONVERSE_USAGE.read(raw)


def exception_frame(exception_type: str, payload: dict[str, Any]) -> bytes:
    """One ``:message-type: exception`` frame with a JSON payload."""
    return encode_frame(
        {
            ":exception-type": exception_type,
            ":content-type": "application/json",
            ":message-type": "exception",
        },
        json.dumps(payload, separators=(",", ":")).encode(),
    )


@dataclass(slots=True)
class _Block:
    tool: bool = False
    open: bool = True
    input: list[str] = field(default_factory=list)


class BedrockContract(Contract):
    """Bedrock Runtime's ConverseStream and InvokeModelWithResponseStream contract."""

    protocol = Protocol.BEDROCK
    framing = EVENTSTREAM
    finish_table = BEDROCK_FINISH
    comment_on_complete = False
    wording = {
        Reason.MISSING_DONE: (
            "the upstream ended the stream before the message and its usage were whole"
        ),
        Reason.MISSING_FINISH: (
            "the upstream stopped the message without a stop reason or with a content block open"
        ),
        Reason.CONTENT_AFTER_FINISH: (
            "the upstream sent content after its content block or the message had stopped"
        ),
        Reason.INVALID_TOOL_ARGUMENTS: "the upstream sent tool input that is not valid JSON",
        Reason.INVALID_SHAPE: "the upstream sent a frame or event of an invalid shape",
    }

    @classmethod
    def error_event(cls, incomplete: Incomplete) -> bytes:
        """A ``modelStreamErrorException`` frame, on which botocore raises ``EventStreamError``
        (its message the gateway's; ``gateway`` carries the reason for a program)."""
        return exception_frame(
            "modelStreamErrorException",
            {
                "message": incomplete.message,
                "gateway": {"outcome": "incomplete", "reason": str(incomplete.reason)},
                "request_id": incomplete.request_id,
            },
        )

    def __init__(self) -> None:
        super().__init__()
        #: "converse" or "invoke", from the first event.
        self.kind = ""
        self._started = False
        self._stopped = False
        self._blocks: dict[int, _Block] = {}
        self._inner: MessagesContract | None = None
        self._tool_calls = 0

    @property
    def tool_calls(self) -> int:
        return self._inner.tool_calls if self._inner is not None else self._tool_calls

    def _on_event(self, event: Event) -> Action:
        if event.id in ("exception", "error"):
            return self._upstream_error(f"the upstream sent an {event.id} frame ({event.event})")
        if event.id != "event":
            raise self._reject(Reason.INVALID_SHAPE, "a frame that is no event")
        if not self.kind:
            self.kind = "invoke" if event.event == "chunk" else "converse"
        if self.kind == "invoke":
            return self._on_chunk(event)
        obj = self.parsed = parse_json_object(event.data)
        return self._on_converse(event.event, obj)

    # -- ConverseStream -------------------------------------------------------------

    def _on_converse(self, kind: str, obj: dict[str, Any]) -> Action:
        if kind == "messageStart":
            if self._started:
                raise self._reject(Reason.INVALID_SHAPE, "a second messageStart")
            self._started = True
            return Action.FORWARD
        if not self._started:
            raise self._reject(Reason.INVALID_SHAPE, f"{kind} before messageStart")
        if kind == "metadata":
            if not self._stopped:
                raise self._reject(Reason.MISSING_FINISH, "metadata before the message stopped")
            usage = bedrock_usage(obj.get("usage"))
            if usage is not None:
                self.usage = usage
            return self._complete(self.normalize(self.finish_reasons[0]))
        if self._stopped:
            raise self._reject(Reason.CONTENT_AFTER_FINISH, f"{kind} after the message stopped")
        if kind == "contentBlockStart":
            self._block_start(obj)
        elif kind == "contentBlockDelta":
            self._block_delta(obj)
        elif kind == "contentBlockStop":
            self._block_stop(obj)
        elif kind == "messageStop":
            self._message_stop(obj)
        return Action.FORWARD  # unknown event types are forwarded and ignored

    def _index(self, obj: dict[str, Any], kind: str) -> int:
        index = obj.get("contentBlockIndex")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise self._reject(Reason.INVALID_SHAPE, f"{kind}.contentBlockIndex is not an index")
        return index

    def _block_start(self, obj: dict[str, Any]) -> None:
        index = self._index(obj, "contentBlockStart")
        if index in self._blocks:
            raise self._reject(Reason.INVALID_SHAPE, f"content block {index} started twice")
        start = obj.get("start")
        tool = isinstance(start, dict) and isinstance(start.get("toolUse"), dict)
        self._blocks[index] = _Block(tool=tool)
        if tool:
            self._tool_calls += 1

    def _block_delta(self, obj: dict[str, Any]) -> None:
        index = self._index(obj, "contentBlockDelta")
        block = self._blocks.get(index)
        if block is None:  # a text or reasoning block opens with its first delta
            block = self._blocks[index] = _Block()
        elif not block.open:
            raise self._reject(
                Reason.CONTENT_AFTER_FINISH, f"a delta of content block {index} after its stop"
            )
        delta = obj.get("delta")
        if not isinstance(delta, dict):
            raise self._reject(Reason.INVALID_SHAPE, "contentBlockDelta.delta is not an object")
        piece = ""
        text = delta.get("text")
        tool = delta.get("toolUse")
        reasoning = delta.get("reasoningContent")
        if isinstance(text, str):
            piece = text
        elif isinstance(tool, dict):
            if not block.tool:
                raise self._reject(Reason.INVALID_SHAPE, f"tool input in content block {index}")
            piece = tool.get("input", "")
            if not isinstance(piece, str):
                raise self._reject(Reason.INVALID_SHAPE, "toolUse.input is not a string")
            block.input.append(piece)
        elif isinstance(reasoning, dict) and isinstance(reasoning.get("text"), str):
            piece = reasoning["text"]
        if piece:
            self.content_events += 1
            self.content_chars += len(piece)

    def _block_stop(self, obj: dict[str, Any]) -> None:
        index = self._index(obj, "contentBlockStop")
        block = self._blocks.get(index)
        if block is None or not block.open:
            raise self._reject(Reason.INVALID_SHAPE, f"a stop of content block {index} not open")
        block.open = False
        if block.tool:
            arguments = "".join(block.input)
            block.input = []
            if not valid_tool_arguments(arguments):
                raise self._reject(
                    Reason.INVALID_TOOL_ARGUMENTS, f"content block {index}'s tool input"
                )

    def _message_stop(self, obj: dict[str, Any]) -> None:
        reason = obj.get("stopReason")
        if not isinstance(reason, str) or not reason:
            raise self._reject(Reason.MISSING_FINISH, "messageStop without a stopReason")
        self.finish_reasons[0] = reason
        open_blocks = [i for i, block in self._blocks.items() if block.open]
        if open_blocks and self.normalize(reason) is not Reason.LENGTH:
            raise self._reject(
                Reason.MISSING_FINISH,
                f"the message stopped with content block {open_blocks[0]} open",
            )
        self._stopped = True

    # -- InvokeModelWithResponseStream -----------------------------------------------

    def _on_chunk(self, event: Event) -> Action:
        if event.event != "chunk":
            return Action.FORWARD  # no other event type is known: forwarded and ignored
        obj = parse_json_object(event.data)
        encoded = obj.get("bytes")
        if not isinstance(encoded, str):
            raise self._reject(Reason.INVALID_SHAPE, "a chunk without its bytes")
        try:
            inner_text = binascii.a2b_base64(encoded.encode("ascii"), strict_mode=True).decode()
        except (binascii.Error, UnicodeError, ValueError):
            raise self._reject(
                Reason.INVALID_SHAPE, "a chunk's bytes are not base64 UTF-8"
            ) from None
        inner = parse_json_object(inner_text)
        metrics = _METRICS_USAGE.read(inner.get(_METRICS))
        kind = inner.get("type")
        if self._inner is None and self.events == 1 and kind == "message_start":
            self._inner = MessagesContract()
        if self._inner is not None:
            return self._on_messages(str(kind), inner_text, metrics)
        if metrics is None:
            self.content_events += 1
            return Action.FORWARD
        self.usage = metrics
        for key in _STOP_KEYS:
            raw = inner.get(key)
            if isinstance(raw, str) and raw:
                self.finish_reasons[0] = raw
                return self._complete(self.normalize(raw))
        return self._complete(Reason.OTHER)

    def _on_messages(self, kind: str, data: str, metrics: Usage | None) -> Action:
        """One Anthropic Messages event, judged by the Messages contract."""
        inner = self._inner
        assert inner is not None
        action = inner.on_event(Event(kind, data))
        self.content_events = inner.content_events
        self.content_chars = inner.content_chars
        self.finish_reasons = dict(inner.finish_reasons)
        self._note_model(inner.model)
        usage = inner.usage
        if metrics is not None:
            usage = usage.merged(metrics) if usage is not None else metrics
        self.usage = usage
        verdict = inner.verdict
        if verdict is None:
            return action
        if verdict.error_forwarded:
            return self._upstream_error(verdict.detail)
        if verdict.complete:
            return self._complete(verdict.reason)
        raise self._reject(verdict.reason, verdict.detail)
