"""Bedrock Runtime streams for the tests, frame by frame, as Bedrock sends them.

Frames are built with the guard's encoder; the tests check each against
botocore's own parser (``EventStreamBuffer``), the independent reference.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from gateway.guard.eventstream import encode_frame

__all__ = [
    "CONVERSE_TEXT",
    "CONVERSE_TOOL",
    "INVOKE_MESSAGES",
    "chunk",
    "converse",
    "exception",
    "frame",
]


def frame(event_type: str, payload: dict[str, Any]) -> bytes:
    """One ``event`` frame with a JSON payload (Bedrock pads with a ``p`` member)."""
    return encode_frame(
        {
            ":event-type": event_type,
            ":content-type": "application/json",
            ":message-type": "event",
        },
        json.dumps({**payload, "p": "abcdefgh"}, separators=(",", ":")).encode(),
    )


def exception(kind: str = "modelStreamErrorException", message: str = "boom") -> bytes:
    return encode_frame(
        {
            ":exception-type": kind,
            ":content-type": "application/json",
            ":message-type": "exception",
        },
        json.dumps({"message": message}).encode(),
    )


def converse(
    *blocks: list[tuple[str, dict[str, Any]]],
    stop: str | None = "end_turn",
    metadata: bool = True,
) -> list[bytes]:
    """A ConverseStream: messageStart, the blocks' frames, messageStop, metadata."""
    frames = [frame("messageStart", {"role": "assistant"})]
    for block in blocks:
        frames += [frame(kind, payload) for kind, payload in block]
    if stop is not None:
        frames.append(frame("messageStop", {"stopReason": stop}))
    if metadata:
        frames.append(
            frame(
                "metadata",
                {
                    "usage": {"inputTokens": 12, "outputTokens": 7, "totalTokens": 19},
                    "metrics": {"latencyMs": 120},
                },
            )
        )
    return frames


def text_block(index: int, *pieces: str) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = [
        ("contentBlockDelta", {"delta": {"text": p}, "contentBlockIndex": index}) for p in pieces
    ]
    out.append(("contentBlockStop", {"contentBlockIndex": index}))
    return out


def tool_block(index: int, *pieces: str, stop: bool = True) -> list[tuple[str, dict[str, Any]]]:
    start = {"toolUse": {"toolUseId": "tooluse_1", "name": "get_weather"}}
    out: list[tuple[str, dict[str, Any]]] = [
        ("contentBlockStart", {"start": start, "contentBlockIndex": index})
    ]
    out += [
        ("contentBlockDelta", {"delta": {"toolUse": {"input": p}}, "contentBlockIndex": index})
        for p in pieces
    ]
    if stop:
        out.append(("contentBlockStop", {"contentBlockIndex": index}))
    return out


def chunk(inner: dict[str, Any]) -> bytes:
    """An InvokeModelWithResponseStream ``chunk``: the model's own event, base64."""
    encoded = base64.b64encode(json.dumps(inner).encode()).decode()
    return frame("chunk", {"bytes": encoded})


def invoke_messages(*, stop: str = "end_turn", last: bool = True) -> list[bytes]:
    """An Anthropic model's Messages events, as InvokeModelWithResponseStream carries them."""
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_bdrk_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-3-haiku-20240307",
                "content": [],
                "stop_reason": None,
                "usage": {"input_tokens": 12, "output_tokens": 1},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
    ]
    if last:
        events.append(
            {
                "type": "message_stop",
                "amazon-bedrock-invocationMetrics": {
                    "inputTokenCount": 12,
                    "outputTokenCount": 5,
                    "invocationLatency": 300,
                    "firstByteLatency": 100,
                },
            }
        )
    return [chunk(e) for e in events]


CONVERSE_TEXT = converse(text_block(0, "Hello", ", world"))
CONVERSE_TOOL = converse(
    text_block(0, "Let me look."), tool_block(1, '{"city"', ': "Paris"}'), stop="tool_use"
)
INVOKE_MESSAGES = invoke_messages()
