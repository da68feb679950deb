"""AWS Bedrock Runtime's streams, in binary event stream frames (AWS event stream).

``bedrock_converse`` (``/model/{id}/converse-stream`` and ``/converse``):
``messageStart``, per text lane its ``contentBlockDelta`` frames (a tool lane
opens with ``contentBlockStart``), ``contentBlockStop``, ``messageStop``
with the ``stopReason``, and ``metadata`` with ``usage`` as the terminator.
``bedrock_invoke`` (``/invoke-with-response-stream`` and ``/invoke``): an
Anthropic model's Messages events, each base64-encoded in a ``chunk``
frame's ``bytes``, the last one carrying ``amazon-bedrock-invocationMetrics``.

Every fault applies in frame terms: ``drop_mid_event`` cuts a frame in its
middle, ``drop_after_text`` between frames, ``error_event`` sends an
exception frame (``modelStreamErrorException``), ``invalid_shape`` a frame
whose message CRC is corrupt, ``done_without_finish`` leaves out
``messageStop``, ``drop_before_done`` the ``metadata`` (invoke: the last
chunk). An event stream has no comment: a heartbeat writes nothing.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from typing import Any, Final

from gateway.simulator._protocols import Lane, MessagesRenderer, Plan, Renderer, sim_id
from gateway.simulator._sse import Framer, dumps

__all__ = ["EVENTSTREAM_TYPE", "BedrockConverseRenderer", "BedrockInvokeRenderer"]

EVENTSTREAM_TYPE: Final = "application/vnd.amazon.eventstream"
#: The neutral finish of the answer -> Converse's ``stopReason``.
_STOP_REASON: Final = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "content_filtered",
}
_ERROR_MESSAGE: Final = (
    "The system encountered an unexpected error during processing. Try your request again."
)


def encode_frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One frame with string headers (written here, not borrowed from the gateway's guard:
    the simulator is the guard's independent counterpart)."""
    head = b""
    for name, value in headers.items():
        key, text = name.encode(), value.encode()
        head += struct.pack(">B", len(key)) + key + b"\x07" + struct.pack(">H", len(text)) + text
    prelude = struct.pack(">II", 16 + len(head) + len(payload), len(head))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + head + payload
    return message + struct.pack(">I", zlib.crc32(message))


def _frame(event_type: str, data: str) -> bytes:
    return encode_frame(
        {":event-type": event_type, ":content-type": "application/json", ":message-type": "event"},
        data.encode(),
    )


def _exception() -> bytes:
    payload = {
        "message": _ERROR_MESSAGE,
        "originalStatusCode": 500,
        "originalMessage": "overloaded",
    }
    return encode_frame(
        {
            ":exception-type": "modelStreamErrorException",
            ":content-type": "application/json",
            ":message-type": "exception",
        },
        json.dumps(payload).encode(),
    )


def _corrupt(frame: bytes) -> bytes:
    """``frame`` with its message CRC wrong."""
    return frame[:-1] + bytes([frame[-1] ^ 0xFF])


class EventStreamFramer(Framer):
    """One frame per event, its ``:event-type`` the event's name; no comments."""

    __slots__ = ()

    def event(self, data: str, name: str | None = None) -> bytes:
        return _frame(name or "message", data)

    def comment(self, text: str) -> bytes:
        return b""


class ChunkFramer(Framer):
    """One ``chunk`` frame per model event: the event's JSON, base64, in ``bytes``."""

    __slots__ = ()

    def event(self, data: str, name: str | None = None) -> bytes:
        encoded = base64.b64encode(data.encode()).decode()
        return _frame("chunk", dumps({"bytes": encoded}))

    def comment(self, text: str) -> bytes:
        return b""


class BedrockConverseRenderer(Renderer):
    """ConverseStream: typed frames; blocks indexed by ``contentBlockIndex``."""

    def __init__(self, plan: Plan, framer: Framer) -> None:
        super().__init__(plan, EventStreamFramer())

    def _event(self, kind: str, **fields: Any) -> bytes:
        return self.framer.event(dumps(fields), name=kind)

    def _tool_id(self, lane: Lane) -> str:
        return f"tooluse_sim{sim_id('tooluse', self.plan.seed * 64 + lane.index, 22)}"

    def start(self) -> list[bytes]:
        return [self._event("messageStart", role="assistant")]

    def open_lane(self, lane: Lane) -> list[bytes]:
        if lane.kind != "tool":
            return []  # a text block opens with its first delta
        start = {"toolUse": {"toolUseId": self._tool_id(lane), "name": lane.tool_name}}
        return [self._event("contentBlockStart", start=start, contentBlockIndex=lane.index)]

    def delta(self, lane: Lane, piece: str) -> bytes:
        delta = {"toolUse": {"input": piece}} if lane.kind == "tool" else {"text": piece}
        return self._event("contentBlockDelta", delta=delta, contentBlockIndex=lane.index)

    def close_lane(self, lane: Lane) -> list[bytes]:
        return [self._event("contentBlockStop", contentBlockIndex=lane.index)]

    def _usage(self) -> dict[str, int]:
        out = self.plan.output_tokens
        return {
            "inputTokens": self.plan.input_tokens,
            "outputTokens": out,
            "totalTokens": self.plan.input_tokens + out,
        }

    def finish(self, *, stopped: bool) -> list[bytes]:
        if not stopped:
            return []
        return [self._event("messageStop", stopReason=_STOP_REASON[self.plan.finish])]

    def terminator(self) -> list[bytes]:
        return [self._event("metadata", usage=self._usage(), metrics={"latencyMs": 42})]

    def error_event(self) -> bytes:
        return _exception()

    def invalid_json_event(self, lane: Lane, piece: str) -> bytes:
        data = dumps({"delta": {"text": piece}, "contentBlockIndex": lane.index})
        return _frame("contentBlockDelta", data[:-2])

    def invalid_shape_event(self, lane: Lane) -> bytes:
        return _corrupt(self.delta(lane, "shape"))

    def body(self) -> dict[str, Any]:
        content: list[Any] = []
        for lane in self.plan.lanes:
            text = "".join(lane.pieces)
            lane.emitted = lane.count
            lane.closed = True
            if lane.kind == "tool":
                try:
                    parsed = json.loads(text)
                except ValueError:
                    parsed = {"_raw": text}
                tool = {"toolUseId": self._tool_id(lane), "name": lane.tool_name, "input": parsed}
                content.append({"toolUse": tool})
            else:
                content.append({"text": text})
        return {
            "output": {"message": {"role": "assistant", "content": content}},
            "stopReason": _STOP_REASON[self.plan.finish],
            "usage": self._usage(),
            "metrics": {"latencyMs": 42},
        }


class BedrockInvokeRenderer(MessagesRenderer):
    """InvokeModelWithResponseStream of an Anthropic model: Messages events in chunks."""

    def __init__(self, plan: Plan, framer: Framer) -> None:
        super().__init__(plan, ChunkFramer())

    def terminator(self) -> list[bytes]:
        metrics = {
            "inputTokenCount": self.plan.input_tokens,
            "outputTokenCount": self.plan.output_tokens,
            "invocationLatency": 42,
            "firstByteLatency": 7,
        }
        return [self._event("message_stop", **{"amazon-bedrock-invocationMetrics": metrics})]

    def error_event(self) -> bytes:
        return _exception()

    def invalid_json_event(self, lane: Lane, piece: str) -> bytes:
        data = dumps({"type": "content_block_delta", "index": lane.index, "delta": piece})
        return self.framer.event(data[:-2])

    def invalid_shape_event(self, lane: Lane) -> bytes:
        return _corrupt(self.delta(lane, "shape"))
