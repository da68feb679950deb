"""The shape every protocol contract shares: events in, an action per event, a verdict.

A contract consumes decoded events of one protocol family and decides, for
each, whether the relay forwards it, withholds it, or ends the stream there
(forwarding the event, or rejecting it). Once ``verdict`` is set the contract
is finished and must not be fed again. Contracts are pure: no I/O, no clocks.
"""

from __future__ import annotations

import abc
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gateway.guard.decoder import Event
from gateway.guard.framing import SSE, Framing
from gateway.guard.joint import Joint
from gateway.guard.jsonparse import loads
from gateway.guard.verdict import FINISH_REASONS, Outcome, Reason, Usage, Verdict

__all__ = [
    "Action",
    "Contract",
    "FramingOnly",
    "Incomplete",
    "Protocol",
    "contract_for",
    "data_line",
    "int_or_none",
    "parse_json_object",
    "valid_tool_arguments",
]


@dataclass(frozen=True, slots=True)
class Incomplete:
    """What an incomplete stream's error event says: why, in the gateway's words, for
    which request, and (the Responses API's) the last sequence number relayed."""

    reason: Reason
    message: str
    request_id: str
    last_sequence_number: int | None = None


class Protocol(enum.StrEnum):
    """Protocol families, each with its own termination contract and error shape."""

    CHAT = "chat"
    COMPLETIONS = "completions"
    RESPONSES = "responses"
    MESSAGES = "messages"
    GEMINI = "gemini"
    OLLAMA = "ollama"
    BEDROCK = "bedrock"
    SSE = "sse"  # unknown path: SSE framing only, no completion contract


class Action(enum.Enum):
    FORWARD = "forward"  # relay the event and keep reading
    WITHHOLD = "withhold"  # drop this event, keep reading (the client did not ask for it)
    FINISH = "finish"  # relay the event; the verdict is final
    REJECT = "reject"  # withhold the event; the verdict is final


class _Rejected(Exception):
    """Internal: raised by a contract's parsing code to reject the current event."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def parse_json_object(data: str) -> dict[str, Any]:
    """Parse an event's data as a JSON object, or reject it with a stable reason."""
    try:
        obj = loads(data)
    except ValueError:
        raise _Rejected(Reason.INVALID_JSON, "event data is not valid JSON") from None
    except RecursionError:
        # Valid JSON nested deeper than the parser goes: a limit, not a crash.
        raise _Rejected(Reason.LIMIT_EXCEEDED, "event data is nested too deeply") from None
    if not isinstance(obj, dict):
        raise _Rejected(Reason.INVALID_SHAPE, "event data is not a JSON object")
    return obj


def valid_tool_arguments(arguments: str) -> bool:
    """Assembled tool arguments are valid: JSON, or nothing (a tool without parameters)."""
    if not arguments.strip():
        return True
    try:
        loads(arguments)
    except ValueError:
        return False
    return True


def int_or_none(value: object) -> int | None:
    """A token count as reported, or None for anything that is not a plain integer."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def data_line(payload: Mapping[str, object], event: str | None = None) -> bytes:
    """One SSE event: an optional ``event:`` line and one compact ``data:`` line."""
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=True)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {body}\n\n".encode()


_BY_PROTOCOL: dict[Protocol, type[Contract]] = {}


def contract_for(protocol: Protocol) -> type[Contract]:
    """The contract class of a protocol (each registers itself by defining ``protocol``)."""
    return _BY_PROTOCOL[protocol]


class Contract(abc.ABC):
    """Base of the per-protocol contracts: counters, verdict construction, abort.

    A contract class is the guard's whole knowledge of its protocol: how a
    stream ends (``_on_event``), its finish-reason table, its wording of the
    incomplete reasons, the shape of the error event that makes its SDKs
    raise, its framing, and whether a complete stream may carry the comment line.
    """

    protocol: ClassVar[Protocol]
    #: How the stream is cut into events (SSE unless the protocol says otherwise).
    framing: ClassVar[Framing] = SSE
    #: Provider finish/stop reason -> the bounded vocabulary (unknown ones are ``other``).
    finish_table: ClassVar[Mapping[str, Reason]] = FINISH_REASONS
    #: This protocol's own terms for incomplete reasons, over the common wording.
    wording: ClassVar[Mapping[Reason, str]] = {}
    #: Whether a complete stream ends with the comment line (some SDKs reject comments).
    comment_on_complete: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "protocol" in vars(cls):
            _BY_PROTOCOL[cls.protocol] = cls

    @classmethod
    def error_event(cls, incomplete: Incomplete) -> bytes:
        """The error event for an incomplete stream, in this protocol's shape.

        The default is the Chat Completions shape, with no ``event:`` line
        (openai-python 1.0-1.13 ignores named events) and the reason in ``error.code``.
        """
        return data_line(
            {
                "error": {
                    "message": incomplete.message,
                    "type": "stream_incomplete",
                    "code": str(incomplete.reason),
                }
            }
        )

    @classmethod
    def normalize(cls, raw: str) -> Reason:
        """A provider's finish/stop reason in the bounded vocabulary."""
        return cls.finish_table.get(raw, Reason.OTHER)

    def __init__(self) -> None:
        self.verdict: Verdict | None = None
        self.events = 0
        #: Events that carried output (text, refusal, reasoning, tool arguments).
        self.content_events = 0
        self.content_chars = 0
        self.usage: Usage | None = None
        self.finish_reasons: dict[int, str] = {}
        #: The model the upstream says answered (first one reported), for metric labels.
        self.model: str | None = None
        #: The JSON value of the event being judged, as the contract parsed it (None when
        #: it did not): a reader of the same event shares it instead of parsing again.
        self.parsed: Any = None

    def delta_text(self) -> str | None:
        """The answer's text the event just judged carries, when that event is a delta
        of the answer's text and nothing else; None for any other event, or where the
        contract does not say (a reader then reads ``parsed``). Asked by a reader of
        the event (the schema check) while it is offered, never computed unasked."""
        return None

    # -- the interface the stream guard drives -----------------------------

    def on_event(self, event: Event) -> Action:
        """Judge one event; sets ``verdict`` when the action is FINISH or REJECT."""
        if self.verdict is not None:
            raise RuntimeError("contract already has a verdict")
        self.events += 1
        self.parsed = None
        try:
            return self._on_event(event)
        except _Rejected as rejected:
            self._conclude(Outcome.INCOMPLETE, rejected.reason, rejected.detail)
            return Action.REJECT

    def on_eof(self, *, clean: bool = True) -> Verdict:
        """The upstream ended; returns the verdict (``missing_done`` if unfinished).

        ``clean``: the body ended at an event boundary (no unfinished event), so
        a contract that may end without its terminator (``_on_clean_end``) may."""
        if self.verdict is None and clean:
            try:
                self._on_clean_end()
            except _Rejected as rejected:
                self._conclude(Outcome.INCOMPLETE, rejected.reason, rejected.detail)
        if self.verdict is None:
            self._conclude(
                Outcome.INCOMPLETE, Reason.MISSING_DONE, "the stream ended before its terminator"
            )
        assert self.verdict is not None
        return self.verdict

    def abort(self, reason: Reason, detail: str = "", *, force: bool = False) -> Verdict:
        """End the stream for a reason found outside the contract (timeouts, limits, ...).

        A verdict that is already final is kept, unless ``force``: the relay could
        not deliver the bytes that verdict was reached on.
        """
        if self.verdict is None or force:
            self._conclude(Outcome.INCOMPLETE, reason, detail)
        assert self.verdict is not None
        return self.verdict

    # -- for subclasses -------------------------------------------------------

    def _on_clean_end(self) -> None:
        """A clean end before the terminator: conclude here to accept it (default: not)."""
        return None

    @abc.abstractmethod
    def _on_event(self, event: Event) -> Action: ...

    @property
    def tool_calls(self) -> int:
        return 0

    # -- continuation: a declared capability (none by default) ---------------------------

    #: Set by the relay on a route that continues cut streams: keep the answer's text.
    keep_text: bool = False

    def text(self) -> str:
        """The text relayed so far (only with ``keep_text``; "" where none is kept)."""
        return ""

    def continuable(self) -> bool:
        """Whether the answer so far can be continued by another request (never, unless
        the protocol's contract says how)."""
        return False

    def joint(self, cut: Usage) -> Joint | None:
        """The joint a continuation of this stream goes on through (None: not continued)."""
        return None

    def next_joint(self, joint: Joint, cut: Usage) -> Joint:
        """The joint for a continuation of this stream, itself a continuation that broke
        (``joint`` the one it went on through)."""
        return joint.following(0, cut)

    @property
    def last_sequence_number(self) -> int | None:
        return None

    def _normalize_finish(self, index: int, raw: str) -> Reason:
        """The bounded reason for choice ``index``'s raw finish (the shared table here).

        A protocol whose rules differ per choice (Gemini's function calls) overrides this.
        """
        return self.normalize(raw)

    def _note_model(self, value: object) -> None:
        """Remember the first model name the upstream reports."""
        if self.model is None and isinstance(value, str) and value:
            self.model = value

    def _reject(self, reason: Reason, detail: str) -> _Rejected:
        return _Rejected(reason, detail)

    def _complete(self, reason: Reason) -> Action:
        self._conclude(Outcome.COMPLETE, reason, "")
        return Action.FINISH

    def _upstream_error(self, detail: str = "the upstream sent an error event") -> Action:
        """The upstream's own error event: relayed as it is, no second error added."""
        self._conclude(Outcome.INCOMPLETE, Reason.UPSTREAM_ERROR, detail, error_forwarded=True)
        return Action.FINISH

    def _conclude(
        self, outcome: Outcome, reason: Reason, detail: str, *, error_forwarded: bool = False
    ) -> None:
        self.verdict = Verdict(
            outcome=outcome,
            reason=reason,
            finish_reasons={
                i: self._normalize_finish(i, r) for i, r in sorted(self.finish_reasons.items())
            },
            raw_finish_reasons=dict(sorted(self.finish_reasons.items())),
            usage=self.usage,
            events=self.events,
            content_chars=self.content_chars,
            tool_calls=self.tool_calls,
            detail=detail,
            error_forwarded=error_forwarded,
        )


class FramingOnly(Contract):
    """For paths with no known protocol: SSE framing is checked, content is not.

    Such a stream has no terminator to wait for, so a clean EOF is complete
    (reason ``other``).
    """

    protocol = Protocol.SSE

    def _on_event(self, event: Event) -> Action:
        return Action.FORWARD

    def on_eof(self, *, clean: bool = True) -> Verdict:
        if self.verdict is None:
            self._conclude(Outcome.COMPLETE, Reason.OTHER, "")
        assert self.verdict is not None
        return self.verdict
