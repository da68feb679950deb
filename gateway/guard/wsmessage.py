"""The WebSocket message framing of the Responses API: one text message is one event.

Over a WebSocket (``GET /v1/responses`` with ``Upgrade: websocket``) the
server answers each ``response.create`` with the same events as the SSE
stream, each one whole in one text message, and no ``event:`` line. So the
framing is trivial and the judging is the Responses contract's:
``MessageGuard`` hands every upstream message to a fresh
``ResponsesContract`` as an ``Event`` whose name is the default
(``message``: the contract then reads the type from the JSON alone), and
says what the relay does with it (forward, finish, reject).

Limits: a message over ``max_message_bytes`` is rejected (``limit_exceeded``)
before it is parsed; messages are never joined or held, so the guard keeps
nothing of the stream but the contract's counters.

The annotation of this framing is ``error_message``: only for an incomplete
response whose error was not the upstream's own, one ``error`` event in the
WebSocket error shape (``{"type": "error", "status": ..., "error": {"type",
"code", "message", "param"}}``, what openai-python's ``connect()`` parses as
``ResponseWsError``), with the reason as ``error.code``. A complete response
gets nothing: WebSocket has no comments, and the next ``response.create``
may follow on the same connection.

Sans-IO: no sockets, no clock; the relay owns both.
"""

from __future__ import annotations

import json

from gateway.guard.annotation import incomplete_message
from gateway.guard.contract import Action, Contract
from gateway.guard.sse import Event
from gateway.guard.stream import ContractGuard
from gateway.guard.verdict import Reason, Verdict

__all__ = ["WS_STATUS", "MessageGuard", "error_message"]

#: The HTTP-like status the error event carries per reason (502 when not listed).
WS_STATUS: dict[str, int] = {
    "idle_timeout": 504,
    "total_timeout": 504,
    "first_byte_timeout": 504,
    "gateway_shutdown": 503,
    "limit_exceeded": 502,
}


def error_message(
    reason: Reason,
    message: str,
    *,
    request_id: str,
    last_sequence_number: int | None = None,
    stream_id: str | None = None,
) -> str:
    """The ``error`` event (one text message) that tells the client its response is cut
    (on the lane ``stream_id`` names, when the response was created with one)."""
    payload: dict[str, object] = {
        "type": "error",
        "status": WS_STATUS.get(str(reason), 502),
        "error": {
            "type": "stream_incomplete",
            "code": str(reason),
            "message": message,
            "param": None,
        },
        "sequence_number": 0 if last_sequence_number is None else last_sequence_number + 1,
        "request_id": request_id,
    }
    if stream_id is not None:
        payload["stream_id"] = stream_id
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=True)


class MessageGuard(ContractGuard):
    """Judge the upstream messages of one response (one ``response.create``)."""

    def __init__(self, contract: Contract, *, max_message_bytes: int | None = None) -> None:
        super().__init__(contract)
        self.max_message_bytes = max_message_bytes
        self.received_bytes = 0

    def feed(self, text: str) -> Action:
        """Judge one upstream text message: FORWARD, FINISH (forward, then the verdict is
        final) or REJECT (withhold it; the verdict is final)."""
        if self.done:
            raise RuntimeError("the response already has a verdict")
        size = len(text)  # characters: a lower bound of the UTF-8 bytes
        if self.max_message_bytes is not None and size > self.max_message_bytes // 4:
            size = len(text.encode("utf-8", "surrogatepass"))
        self.received_bytes += size
        if self.max_message_bytes is not None and size > self.max_message_bytes:
            self.contract.abort(
                Reason.LIMIT_EXCEEDED, f"a message exceeded {self.max_message_bytes} bytes"
            )
            return Action.REJECT
        action = self.contract.on_event(Event(data=text))
        if action is Action.WITHHOLD:  # a protocol option the WebSocket mode does not use
            return Action.FORWARD
        return action

    def eof(self) -> Verdict:
        """The upstream closed cleanly between two messages of this response."""
        return self.contract.on_eof()

    def abort(self, reason: Reason, detail: str = "", *, force: bool = False) -> Verdict:
        """Stop the response for a reason the relay saw (a deadline, a close, a limit)."""
        return self.contract.abort(reason, detail, force=force)

    def error_message(self, request_id: str, stream_id: str | None = None) -> str | None:
        """The annotation: the error event of an incomplete response, None when the
        response is complete or its error was the upstream's own (forwarded already)."""
        verdict = self.contract.verdict
        if verdict is None:
            raise RuntimeError("annotation before the verdict is final")
        if verdict.outcome == "complete" or verdict.error_forwarded:
            return None
        return error_message(
            verdict.reason,
            incomplete_message(self.contract.protocol, verdict.reason, request_id),
            request_id=request_id,
            last_sequence_number=self.contract.last_sequence_number,
            stream_id=stream_id,
        )
