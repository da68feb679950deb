"""The trailer appended to every guarded stream (docs/wire-contract.md, "Complete
stream" and "Incomplete stream").

Complete: one SSE comment line ended by a single LF. Incomplete: an error
event in the protocol's own error shape (one ``data:`` line, a blank line),
so the official SDKs raise, then the same comment line. When the upstream's
own error event was forwarded (``upstream_error``), no second error is added.

Every error event carries the reason where that protocol's SDKs expose a
machine-readable code: ``error.code`` for Chat, Completions and Responses,
``error.details.error_code`` for Anthropic Messages. Its message is worded in
the protocol's own terms (choice, output item, content block) and names the
reason and the request id, never hosts, keys or text, and never a terminator
literal (``[DONE]``, ``message_stop``, ``response.completed``): a client that
looks for one by substring must not take the error for the end of a stream.

A framing without comment lines (NDJSON) gets the error event alone, and a
complete or upstream-errored stream gets nothing.
"""

from __future__ import annotations

from gateway.guard.contract import Incomplete, Protocol, contract_for
from gateway.guard.verdict import Reason, Verdict

__all__ = ["comment_line", "error_event", "incomplete_message", "render_annotation"]

#: Messages that read the same in every protocol.
_COMMON: dict[Reason, str] = {
    Reason.MISSING_DONE: "the upstream ended the stream before its terminator",
    Reason.MISSING_FINISH: "the upstream ended the stream before the answer had finished",
    Reason.UPSTREAM_ERROR: "the upstream reported an error",
    Reason.UPSTREAM_STATUS: "the upstream answered with an error status",
    Reason.UPSTREAM_UNAVAILABLE: "the upstream could not be reached",
    Reason.INVALID_JSON: "the upstream sent an event that is not valid JSON",
    Reason.INVALID_SHAPE: "the upstream sent an event of an invalid shape",
    Reason.CONTENT_AFTER_FINISH: "the upstream sent content after the answer had finished",
    Reason.INVALID_TOOL_ARGUMENTS: "the upstream sent tool arguments that are not valid JSON",
    Reason.LIMIT_EXCEEDED: "the stream exceeded a gateway limit",
    Reason.UPSTREAM_DISCONNECT: "the upstream connection broke in the middle of the stream",
    Reason.FIRST_BYTE_TIMEOUT: "the upstream sent nothing before the first-byte deadline",
    Reason.IDLE_TIMEOUT: "the upstream went silent longer than the idle deadline",
    Reason.TOTAL_TIMEOUT: "the stream exceeded the total deadline",
    Reason.CLIENT_DISCONNECT: "the client disconnected",
    Reason.CLIENT_STALLED: "the client stopped reading past the send timeout",
    Reason.GATEWAY_SHUTDOWN: "the gateway shut down before the stream finished",
    Reason.CANCELLED: "the stream was cancelled by its client",
    Reason.OWNER_LOST: "the gateway process relaying the stream was lost",
    Reason.SCHEMA_MISMATCH: "the answer does not fit the schema the request asked for",
}


def incomplete_message(protocol: Protocol, reason: Reason, request_id: str) -> str:
    """The human-readable message of the error event, in the protocol's own terms."""
    what = contract_for(protocol).wording.get(reason) or _COMMON.get(
        reason, "the stream did not finish"
    )
    return f"Stream incomplete: {what} ({reason}). request_id={request_id}"


def comment_line(verdict: Verdict, request_id: str, continued: int = 0, words: str = "") -> bytes:
    """``: gateway outcome=... reason=... [continued=N] [words] request_id=...``;
    ``continued`` only when the answer was continued after a cut (N > 0); ``words``:
    what the request's stages add (``key=value`` words, e.g. ``schema=valid``)."""
    more = f" continued={continued}" if continued > 0 else ""
    if words:
        more += " " + words
    return (
        f": gateway outcome={verdict.outcome} reason={verdict.reason}{more}"
        f" request_id={request_id}\n"
    ).encode()


def error_event(
    protocol: Protocol,
    reason: Reason,
    request_id: str,
    *,
    last_sequence_number: int | None = None,
) -> bytes:
    """The protocol-shaped error event for an incomplete stream."""
    message = incomplete_message(protocol, reason, request_id)
    return contract_for(protocol).error_event(
        Incomplete(reason, message, request_id, last_sequence_number)
    )


def render_annotation(
    protocol: Protocol,
    verdict: Verdict,
    request_id: str,
    *,
    last_sequence_number: int | None = None,
    continued: int = 0,
    words: str = "",
) -> bytes:
    contract = contract_for(protocol)
    comments = contract.framing.comments
    if verdict.complete or verdict.error_forwarded:
        # An SDK that rejects comment lines gets none on a complete stream.
        forwarded_error = not verdict.complete
        if comments and (forwarded_error or contract.comment_on_complete):
            return comment_line(verdict, request_id, continued, words)
        return b""
    error = error_event(
        protocol, verdict.reason, request_id, last_sequence_number=last_sequence_number
    )
    return error + comment_line(verdict, request_id, continued, words) if comments else error
