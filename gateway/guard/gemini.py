"""Google Gemini's native streaming API: its contract, finish table, usage and error event.

``POST .../models/{model}:streamGenerateContent?alt=sse`` answers with ``data:``
events, each a whole ``GenerateContentResponse``: ``candidates`` (each with
``content.parts``, an ``index`` that proto3 JSON leaves out when it is 0, and
a ``finishReason`` on its last chunk), ``usageMetadata`` snapshots,
``modelVersion``. There is no terminator and no event name: the upstream
closes the stream after the candidates carried their ``finishReason``. So the
verdict is reached at the clean end of the body (``on_eof``), not at an event:

- complete when every candidate that appeared has a ``finishReason`` (the
  lowest index names the reason, see ``GEMINI_FINISH``; ``STOP`` on a
  candidate that made a ``functionCall`` is ``tool_calls``), or when the
  prompt was blocked (``promptFeedback.blockReason``: ``content_filter``, the
  provider's own answer to the request);
- ``missing_done`` when the body ends before that: no candidate at all, or
  one without its ``finishReason``. Gemini's end of stream *is* its
  terminator, so a clean EOF before the finish is "ended before the
  terminator", the same cut that ``missing_done`` names on every other
  protocol (a truncation); ``missing_finish`` stays "the upstream declared the
  end, yet a choice never finished", which Gemini has no way to say.

Checks, each rejecting the event at which it fails: JSON object
(``invalid_json``); ``candidates`` a list of objects with a non-negative
integer ``index``, ``content.parts`` a list of objects, ``text`` a string,
``functionCall`` an object, ``finishReason`` a string, ``usageMetadata`` and
``promptFeedback`` objects (``invalid_shape``); ``functionCall.args`` an
object (``invalid_tool_arguments``); output (text, a function call, inline
data, code) for a candidate after its ``finishReason`` or after the prompt
was blocked (``content_after_finish``). An ``error`` object first in the
event, with an integer ``code``, is the upstream's own error: forwarded,
verdict ``upstream_error``. Any other ``error`` is one the google-genai SDK
would not raise on (it checks that the event *starts* with ``{"error":`` and
compares ``code`` to integers), so it is withheld and replaced by ours.

Usage: ``promptTokenCount`` is input (cached content included, as Google
reports it), ``candidatesTokenCount`` output (thoughts excluded, as Google
reports it), ``thoughtsTokenCount`` reasoning, ``cachedContentTokenCount``
cached input. Every report is a whole snapshot and replaces the last one.

The error event (``gemini_error_event``) is Google's own error object, the
only shape the SDK raises ``APIError`` on. The SDK also rejects any line that
is not ``data: ...`` (``UnknownApiResponseError``), comments included, so a
complete Gemini stream carries no gateway comment line.

Memory: counters, per candidate its finish and its function calls (name and
parsed arguments), the text only with ``keep_text=True``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from gateway.guard.contract import (
    Action,
    Contract,
    Incomplete,
    Protocol,
    data_line,
    int_or_none,
    parse_json_object,
)
from gateway.guard.sse import Event
from gateway.guard.verdict import Outcome, Reason, Usage, Verdict

__all__ = [
    "GEMINI_ERROR_DOMAIN",
    "GEMINI_FINISH",
    "GeminiContract",
    "gemini_answer_usage",
    "gemini_error_event",
    "gemini_usage",
    "gemini_wants_stream",
    "google_error",
    "google_status",
    "is_gemini_path",
    "normalize_gemini_finish",
]

_C = Reason.CONTENT_FILTER

#: Gemini ``finishReason`` values with a reason of their own; every other one
#: (``MALFORMED_FUNCTION_CALL``, ``LANGUAGE``, ``OTHER``, ``UNEXPECTED_TOOL_CALL``,
#: ``TOO_MANY_TOOL_CALLS``, ``NO_IMAGE``, ...) is ``other``. From the API's
#: ``FinishReason`` enum (google-genai ``types.FinishReason``).
GEMINI_FINISH: Final[Mapping[str, Reason]] = MappingProxyType(
    {
        "STOP": Reason.STOP,
        "MAX_TOKENS": Reason.LENGTH,
        # the per-request token limit was reached; a continuation token can resume it
        "CONTINUATION": Reason.LENGTH,
        "SAFETY": _C,
        "RECITATION": _C,
        "BLOCKLIST": _C,
        "PROHIBITED_CONTENT": _C,
        "SPII": _C,
        "IMAGE_SAFETY": _C,
        "IMAGE_PROHIBITED_CONTENT": _C,
        "IMAGE_RECITATION": _C,
        "MODEL_ARMOR": _C,
        "ESCALATION": _C,  # filtered by an escalation rule
    }
)

#: ``finishReason`` values that mean "not finished yet" (the enum's zero value).
_UNFINISHED: Final = frozenset({"", "FINISH_REASON_UNSPECIFIED"})
#: ``blockReason`` values that mean "not blocked".
_NOT_BLOCKED: Final = frozenset({"", "BLOCKED_REASON_UNSPECIFIED"})
#: Part fields that carry output other than text and function calls.
_OTHER_OUTPUT: Final = ("inlineData", "fileData", "executableCode", "codeExecutionResult")

GENERATE: Final = ":generateContent"
STREAM_GENERATE: Final = ":streamGenerateContent"


def normalize_gemini_finish(raw: str) -> Reason:
    """A Gemini ``finishReason`` on the bounded vocabulary (``other`` when unknown)."""
    return GEMINI_FINISH.get(raw.upper(), Reason.OTHER)


# -- recognising requests and reading whole answers -------------------------------------


def _path_only(path: str) -> str:
    return path.split("?", 1)[0].rstrip("/")


def is_gemini_path(path: str) -> bool:
    """``.../models/{model}:generateContent`` or ``:streamGenerateContent`` (query ignored)."""
    return _path_only(path).endswith((GENERATE, STREAM_GENERATE))


def gemini_wants_stream(path: str) -> bool:
    """The request asks for a stream in its URL (``:streamGenerateContent``).

    Only ``alt=sse`` makes it an event stream; without it Google streams one
    JSON array (``application/json``), which is relayed like a plain answer.
    """
    return _path_only(path).endswith(STREAM_GENERATE)


def gemini_usage(raw: object) -> Usage | None:
    """A ``usageMetadata`` object, or None when it is not an object."""
    if not isinstance(raw, dict):
        return None
    return Usage(
        input_tokens=int_or_none(raw.get("promptTokenCount")),
        output_tokens=int_or_none(raw.get("candidatesTokenCount")),
        cached_input_tokens=int_or_none(raw.get("cachedContentTokenCount")),
        reasoning_tokens=int_or_none(raw.get("thoughtsTokenCount")),
    )


def gemini_answer_usage(body: object) -> Usage | None:
    """The usage of a whole answer: a ``generateContent`` response's ``usageMetadata``,
    or the last one reported in the JSON array ``streamGenerateContent`` sends without
    ``alt=sse`` (every report is a snapshot)."""
    if isinstance(body, list):
        reports = [item for item in body if isinstance(item, dict) and "usageMetadata" in item]
        body = reports[-1] if reports else None
    return gemini_usage(body.get("usageMetadata")) if isinstance(body, dict) else None


# -- the error event ---------------------------------------------------------------------

#: The ``google.rpc.ErrorInfo`` domain of the errors the gateway itself adds.
GEMINI_ERROR_DOMAIN: Final = "gateway"

_UNAVAILABLE: Final = (503, "UNAVAILABLE")  # transient: the upstream cut or failed
_DEADLINE: Final = (504, "DEADLINE_EXCEEDED")
_INTERNAL: Final = (500, "INTERNAL")  # the upstream broke the protocol
_STATUS: Final[Mapping[Reason, tuple[int, str]]] = MappingProxyType(
    {
        Reason.MISSING_DONE: _UNAVAILABLE,
        Reason.MISSING_FINISH: _UNAVAILABLE,
        Reason.UPSTREAM_ERROR: _UNAVAILABLE,
        Reason.UPSTREAM_STATUS: _UNAVAILABLE,
        Reason.UPSTREAM_UNAVAILABLE: _UNAVAILABLE,
        Reason.UPSTREAM_DISCONNECT: _UNAVAILABLE,
        Reason.GATEWAY_SHUTDOWN: _UNAVAILABLE,
        Reason.FIRST_BYTE_TIMEOUT: _DEADLINE,
        Reason.IDLE_TIMEOUT: _DEADLINE,
        Reason.TOTAL_TIMEOUT: _DEADLINE,
        Reason.INVALID_JSON: _INTERNAL,
        Reason.INVALID_SHAPE: _INTERNAL,
        Reason.CONTENT_AFTER_FINISH: _INTERNAL,
        Reason.INVALID_TOOL_ARGUMENTS: _INTERNAL,
        Reason.LIMIT_EXCEEDED: (429, "RESOURCE_EXHAUSTED"),
        Reason.CLIENT_DISCONNECT: (499, "CANCELLED"),
        Reason.CLIENT_STALLED: (499, "CANCELLED"),
    }
)


def google_status(reason: Reason) -> tuple[int, str]:
    """The HTTP status and canonical ``google.rpc.Code`` name that stand for ``reason``."""
    return _STATUS.get(reason, _INTERNAL)


def gemini_error_event(reason: Reason, message: str, request_id: str) -> bytes:
    """The error event that makes the google-genai SDK raise ``APIError``.

    One ``data:`` line and a blank line, holding Google's error object with
    ``error`` first (the SDK checks that the event starts with ``{"error":``)
    and an integer ``code`` (it raises ``ClientError``/``ServerError`` by
    comparing it). The reason is machine-readable the way Google APIs carry
    one: a ``google.rpc.ErrorInfo`` whose ``reason`` is ours in Google's
    UPPER_SNAKE_CASE (AIP-193), with the exact metric label value in
    ``metadata.reason``, and a ``google.rpc.RequestInfo`` with the request id.
    The SDK exposes the whole object as ``APIError.details``.
    """
    code, status = google_status(reason)
    payload = google_error(code, status, message, str(reason), request_id)
    return data_line(payload)  # no event: line: the SDK reads only data: lines


def google_error(
    code: int, status: str, message: str, reason: str, request_id: str
) -> dict[str, Any]:
    """Google's error object for an error of the gateway's own: ``reason`` (a metric
    label value) in a ``google.rpc.ErrorInfo``, the request id in a ``RequestInfo``."""
    return {
        "error": {
            "code": code,
            "message": message,
            "status": status,
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": reason.upper(),
                    "domain": GEMINI_ERROR_DOMAIN,
                    "metadata": {"reason": reason},
                },
                {
                    "@type": "type.googleapis.com/google.rpc.RequestInfo",
                    "requestId": request_id,
                },
            ],
        }
    }


# -- the contract ------------------------------------------------------------------------


@dataclass(slots=True)
class _Candidate:
    finish: str | None = None
    #: (id, name, args) of each function call, in order of appearance.
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    text: list[str] = field(default_factory=list)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class GeminiContract(Contract):
    """Gemini ``streamGenerateContent?alt=sse`` stream contract (see the module docstring)."""

    protocol = Protocol.GEMINI
    finish_table = GEMINI_FINISH
    # google-genai rejects any line that is not ``data:``: a complete stream ends bare.
    comment_on_complete = False
    wording = {
        Reason.MISSING_DONE: (
            "the upstream ended the stream before every candidate had a finish reason"
        ),
        Reason.CONTENT_AFTER_FINISH: "the upstream sent content after a candidate had finished",
    }

    @classmethod
    def normalize(cls, raw: str) -> Reason:
        return normalize_gemini_finish(raw)

    @classmethod
    def error_event(cls, incomplete: Incomplete) -> bytes:
        return gemini_error_event(incomplete.reason, incomplete.message, incomplete.request_id)

    def __init__(self, *, keep_text: bool = False) -> None:
        super().__init__()
        self.keep_text = keep_text
        self._candidates: dict[int, _Candidate] = {}
        #: The prompt's ``promptFeedback.blockReason`` once the upstream blocked it.
        self.block_reason: str | None = None

    # -- results for callers that asked for them -----------------------------

    def text(self, index: int = 0) -> str:
        """The answer text of one candidate, thoughts left out (only with ``keep_text``)."""
        candidate = self._candidates.get(index)
        return "".join(candidate.text) if candidate else ""

    def tool_call_arguments(self, index: int = 0) -> list[tuple[str, str, str]]:
        """(id, name, arguments as JSON) of each function call of one candidate."""
        candidate = self._candidates.get(index)
        if candidate is None:
            return []
        return [(i, name, json.dumps(args)) for i, name, args in candidate.calls]

    @property
    def tool_calls(self) -> int:
        return sum(len(candidate.calls) for candidate in self._candidates.values())

    # -- the contract ----------------------------------------------------------

    def _on_event(self, event: Event) -> Action:
        obj = self.parsed = parse_json_object(event.data)
        if obj.get("error") is not None:
            return self._on_error(obj)
        usage_raw = obj.get("usageMetadata")
        usage = gemini_usage(usage_raw)
        if usage_raw is not None and usage is None:
            raise self._reject(Reason.INVALID_SHAPE, "usageMetadata is not an object")
        candidates = obj.get("candidates")
        if candidates is None:
            candidates = []
        elif not isinstance(candidates, list):
            raise self._reject(Reason.INVALID_SHAPE, "candidates is not a list")
        carried = False
        for position, raw in enumerate(candidates):
            carried |= self._on_candidate(position, raw)
        self._on_prompt_feedback(obj.get("promptFeedback"))
        # Taken once the event passed every check: a rejected event reports nothing.
        if usage is not None:
            self.usage = usage
        self._note_model(obj.get("modelVersion"))
        if carried:
            self.content_events += 1
        return Action.FORWARD

    def on_eof(self, *, clean: bool = True) -> Verdict:
        """The upstream closed the stream: Gemini's only end-of-stream signal."""
        if self.verdict is None:
            self._conclude_at_eof()
        assert self.verdict is not None
        return self.verdict

    def _conclude_at_eof(self) -> None:
        if self.block_reason is not None:
            self._complete(Reason.CONTENT_FILTER)
            return
        unfinished = [i for i, c in sorted(self._candidates.items()) if c.finish is None]
        if not self._candidates:
            detail = "the stream ended before any candidate"
        elif unfinished:
            detail = f"the stream ended while candidate {unfinished[0]} had no finishReason"
        else:
            lowest = min(self.finish_reasons)
            self._complete(self._normalize_finish(lowest, self.finish_reasons[lowest]))
            return
        self._conclude(Outcome.INCOMPLETE, Reason.MISSING_DONE, detail)

    def _normalize_finish(self, index: int, raw: str) -> Reason:
        reason = normalize_gemini_finish(raw)
        candidate = self._candidates.get(index)
        if reason is Reason.STOP and candidate is not None and candidate.calls:
            return Reason.TOOL_CALLS  # Gemini reports function calls with STOP
        return reason

    def _on_error(self, obj: dict[str, Any]) -> Action:
        error = obj["error"]
        if next(iter(obj)) == "error" and isinstance(error, dict) and _is_int(error.get("code")):
            return self._upstream_error()
        raise self._reject(
            Reason.UPSTREAM_ERROR, "the upstream sent an error object its SDK would not raise on"
        )

    def _on_prompt_feedback(self, raw: object) -> None:
        if raw is None:
            return
        if not isinstance(raw, dict):
            raise self._reject(Reason.INVALID_SHAPE, "promptFeedback is not an object")
        block = raw.get("blockReason")
        if block is None:
            return
        if not isinstance(block, str):
            raise self._reject(Reason.INVALID_SHAPE, "blockReason is not a string")
        if block not in _NOT_BLOCKED and self.block_reason is None:
            self.block_reason = block

    def _on_candidate(self, position: int, raw: object) -> bool:
        """Judge one candidate of an event; True when it carried output."""
        if not isinstance(raw, dict):
            raise self._reject(Reason.INVALID_SHAPE, "a candidate is not an object")
        index = raw.get("index")
        if index is None:
            index = position  # proto3 JSON leaves a zero index out
        elif not _is_int(index) or index < 0:
            raise self._reject(Reason.INVALID_SHAPE, "candidate index is not an integer")
        finish = raw.get("finishReason")
        if finish is not None and not isinstance(finish, str):
            raise self._reject(Reason.INVALID_SHAPE, "finishReason is not a string")
        texts, calls, other = self._parts_of(index, raw.get("content"))
        carried = bool(texts) or bool(calls) or other
        state = self._candidates.get(index)
        if state is None:
            state = self._candidates[index] = _Candidate()
        if carried and (state.finish is not None or self.block_reason is not None):
            after = "its finishReason" if state.finish is not None else "the prompt was blocked"
            raise self._reject(
                Reason.CONTENT_AFTER_FINISH, f"candidate {index} sent content after {after}"
            )
        for text, thought in texts:
            self.content_chars += len(text)
            if self.keep_text and not thought:
                state.text.append(text)
        state.calls.extend(calls)
        if finish is not None and finish not in _UNFINISHED and state.finish is None:
            state.finish = finish
            self.finish_reasons[index] = finish
        return carried

    def _parts_of(
        self, index: int, content: object
    ) -> tuple[list[tuple[str, bool]], list[tuple[str, str, dict[str, Any]]], bool]:
        """(text, is_thought) pieces, function calls, and whether other output came."""
        texts: list[tuple[str, bool]] = []
        calls: list[tuple[str, str, dict[str, Any]]] = []
        other = False
        if content is None:
            return texts, calls, other
        if not isinstance(content, dict):
            raise self._reject(Reason.INVALID_SHAPE, "candidate content is not an object")
        parts = content.get("parts")
        if parts is None:
            return texts, calls, other
        if not isinstance(parts, list):
            raise self._reject(Reason.INVALID_SHAPE, "content.parts is not a list")
        for part in parts:
            if not isinstance(part, dict):
                raise self._reject(Reason.INVALID_SHAPE, "a part is not an object")
            text = part.get("text")
            if text is not None:
                if not isinstance(text, str):
                    raise self._reject(Reason.INVALID_SHAPE, "part text is not a string")
                if text:
                    texts.append((text, part.get("thought") is True))
            call = part.get("functionCall")
            if call is not None:
                other |= self._on_function_call(index, call, calls)
            other |= any(part.get(key) is not None for key in _OTHER_OUTPUT)
        return texts, calls, other

    def _on_function_call(
        self, index: int, call: object, calls: list[tuple[str, str, dict[str, Any]]]
    ) -> bool:
        """Record one ``functionCall``; True when it is output without a name (streamed
        arguments, ``partialArgs``), which is not a call of its own."""
        if not isinstance(call, dict):
            raise self._reject(Reason.INVALID_SHAPE, "functionCall is not an object")
        name = call.get("name")
        if name is not None and not isinstance(name, str):
            raise self._reject(Reason.INVALID_SHAPE, "functionCall name is not a string")
        args = call.get("args")
        if args is not None and not isinstance(args, dict):
            raise self._reject(
                Reason.INVALID_TOOL_ARGUMENTS, f"candidate {index} function call args not an object"
            )
        if name:
            call_id = call.get("id")
            calls.append((call_id if isinstance(call_id, str) else "", name, args or {}))
            return False
        return bool(call.get("partialArgs"))
