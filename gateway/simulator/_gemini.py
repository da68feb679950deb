"""Google Gemini's native wire shape: ``streamGenerateContent?alt=sse`` and ``generateContent``.

Every event is a whole ``GenerateContentResponse``: one candidate per event
(candidates interleave, like chat choices), ``usageMetadata`` with the prompt
count on every event and the candidate count once a candidate finished,
``modelVersion`` and ``responseId``. A candidate ends with an event that
carries its ``finishReason`` (``STOP``, ``MAX_TOKENS``, ``SAFETY``; a
function call also ends with ``STOP``), and the stream ends there: Gemini has
no terminator, so ``drop_before_done`` drops those finishing events and
``done_without_finish`` ends with a usage-only event instead. A function call
comes whole in one part (``functionCall`` with ``args`` as an object), never
streamed in pieces; ``invalid_tool_arguments`` sends ``args`` as a string.
The shapes follow captured Gemini API streams (google-genai and Firebase SDK
test data).
"""

from __future__ import annotations

import json
from typing import Any, Final

from gateway.simulator._protocols import Lane, Plan, Renderer, sim_id
from gateway.simulator._sse import Framer, dumps

__all__ = ["GeminiRenderer"]

#: The neutral finish of a lane -> Gemini's ``finishReason``.
_FINISH: Final = {
    "stop": "STOP",
    "length": "MAX_TOKENS",
    "content_filter": "SAFETY",
    "tool_calls": "STOP",
}
#: What the Gemini API says mid-stream when the model is overloaded.
_OVERLOADED: Final = {
    "code": 503,
    "message": "The model is overloaded. Please try again later.",
    "status": "UNAVAILABLE",
}


class GeminiRenderer(Renderer):
    interleaved = True
    has_terminator = False

    def __init__(self, plan: Plan, framer: Framer) -> None:
        super().__init__(plan, framer)
        self.response_id = sim_id("gemini", plan.seed, 23)

    def _usage(self, *, final: bool) -> dict[str, Any]:
        prompt = self.plan.input_tokens
        usage: dict[str, Any] = {"promptTokenCount": prompt}
        total = prompt
        if final:
            usage["candidatesTokenCount"] = self.plan.output_tokens
            total += self.plan.output_tokens
        usage["totalTokenCount"] = total
        usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": prompt}]
        return usage

    def _event(self, candidates: Any, *, final: bool = False) -> bytes:
        response = {
            "candidates": candidates,
            "usageMetadata": self._usage(final=final),
            "modelVersion": self.plan.model,
            "responseId": self.response_id,
        }
        return self.framer.event(dumps(response))

    @staticmethod
    def _part(lane: Lane, piece: str) -> dict[str, Any]:
        if lane.kind == "text":
            return {"text": piece}
        try:
            args: Any = json.loads(piece)
        except ValueError:
            args = piece  # invalid_tool_arguments: not an object
        return {"functionCall": {"name": lane.tool_name, "args": args}}

    @staticmethod
    def _candidate(lane: Lane, parts: list[dict[str, Any]], finish: str | None = None) -> Any:
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
        if finish is not None:
            candidate["finishReason"] = finish
        candidate["index"] = lane.index
        return candidate

    def open_lane(self, lane: Lane) -> list[bytes]:
        return []

    def delta(self, lane: Lane, piece: str) -> bytes:
        return self._event([self._candidate(lane, [self._part(lane, piece)])])

    def close_lane(self, lane: Lane) -> list[bytes]:
        finishing = self._candidate(lane, [{"text": ""}], _FINISH[lane.finish])
        return [self._event([finishing], final=True)]

    def finish(self, *, stopped: bool) -> list[bytes]:
        if stopped:
            return []
        # done_without_finish: the last word is a usage report, no candidate finished
        response = {
            "usageMetadata": self._usage(final=True),
            "modelVersion": self.plan.model,
            "responseId": self.response_id,
        }
        return [self.framer.event(dumps(response))]

    def terminator(self) -> list[bytes]:
        return []

    def error_event(self) -> bytes:
        return self.framer.event(dumps({"error": _OVERLOADED}))

    def invalid_shape_event(self, lane: Lane) -> bytes:
        return self._event(self._candidate(lane, [{"text": "shape"}]))

    def body(self) -> dict[str, Any]:
        candidates = []
        for lane in self.plan.lanes:  # drained in order, before usage is counted
            text = "".join(lane.pieces)
            lane.emitted = lane.count
            lane.closed = True
            candidates.append(self._candidate(lane, [self._part(lane, text)], _FINISH[lane.finish]))
        return {
            "candidates": candidates,
            "usageMetadata": self._usage(final=True),
            "modelVersion": self.plan.model,
            "responseId": self.response_id,
        }
