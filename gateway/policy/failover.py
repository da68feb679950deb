"""Failover: what one attempt's result is called, whether it may be retried, and what it
says about its upstream's health.

Every attempt ends as exactly one ``Result`` (the ``result`` label of
``gateway_upstream_attempts_total``). Five of them are retry causes a route
can list in ``retry_on``; a request is retried on another upstream only
while nothing of the answer has reached the client (the relay's rule), so a
result from an answer the client already has is never retried whatever it
is. A 4xx other than 429 is the client's fault and travels back unchanged.

``early_eof``: connected, but the upstream closed or broke before a valid
head, or a held answer ended, broke or failed before its first event (a
stream) or first byte (any other body). ``incomplete``: an answer the
client was already getting broke. ``schema_mismatch``: a held answer broke the
request's schema before anything of it went out (a route with
``schema_check = "hold"`` retries it); it says nothing of the upstream's health.
"""

from __future__ import annotations

import email.utils
import enum
import json
from collections.abc import Collection
from dataclasses import dataclass

from gateway.guard import Reason, Verdict
from gateway.policy.errors import RequestError
from gateway.policy.pool import Health

__all__ = [
    "BROKE_ANSWER",
    "RETRY_ELSEWHERE",
    "AttemptFailure",
    "Result",
    "health_of",
    "is_context_length",
    "result_of_answer",
    "result_of_failure",
    "result_of_held",
    "result_of_status",
    "retry_after_ms",
    "retry_after_seconds",
    "retryable",
]


@dataclass(frozen=True, slots=True)
class AttemptFailure:
    """No response head: why, the status the client gets, and the stream's reason."""

    #: The transport's classification, or None for a deadline (the reason says which).
    error: RequestError | None
    status: int
    reason: Reason


class Result(enum.StrEnum):
    OK = "ok"
    CONNECT_ERROR = "connect_error"  # refused, DNS, TLS, connect timeout
    TIMEOUT = "timeout"  # no head, or no first event (first byte) in time
    STATUS_429 = "status_429"
    STATUS_5XX = "status_5xx"
    STATUS_4XX = "status_4xx"
    #: a 400 that says the prompt is too long for the model (opt-in retry on a higher tier)
    CONTEXT_LENGTH = "context_length"
    EARLY_EOF = "early_eof"
    INCOMPLETE = "incomplete"
    #: a held answer broke the request's schema before anything of it went out
    #: (``schema_check = "hold"``; retried whenever a route holds)
    SCHEMA_MISMATCH = "schema_mismatch"


#: Result -> the ``retry_on`` name that allows retrying it.
_CAUSES = {
    Result.CONNECT_ERROR: "connect",
    Result.TIMEOUT: "first_byte_timeout",
    Result.STATUS_429: "429",
    Result.STATUS_5XX: "5xx",
    Result.EARLY_EOF: "early_eof",
    Result.CONTEXT_LENGTH: "context_length",
    Result.SCHEMA_MISMATCH: "schema_mismatch",
}

#: Incomplete reasons that say nothing about the upstream: the client, the gateway,
#: the request's own budget, or the operator's limits.
_BLAMELESS = frozenset(
    {
        Reason.CLIENT_DISCONNECT,
        Reason.CLIENT_STALLED,
        Reason.GATEWAY_SHUTDOWN,
        Reason.TOTAL_TIMEOUT,
        Reason.LIMIT_EXCEEDED,
    }
)
_TIMEOUTS = frozenset({Reason.FIRST_BYTE_TIMEOUT, Reason.IDLE_TIMEOUT, Reason.TOTAL_TIMEOUT})
#: Reasons a stream ends for that blame the upstream's own answer (it stalled, sent
#: garbage, an error, or cut it): its retry or continuation goes first to another
#: upstream, and to the same one only when no other can take it.
BROKE_ANSWER = frozenset(
    {
        Reason.MISSING_DONE,
        Reason.UPSTREAM_DISCONNECT,
        Reason.IDLE_TIMEOUT,
        Reason.INVALID_JSON,
        Reason.INVALID_SHAPE,
        Reason.UPSTREAM_ERROR,
    }
)


#: Reasons a held answer failed for whose retry goes first to another upstream: the
#: upstream broke it, or it broke the request's schema (the next upstream is asked).
RETRY_ELSEWHERE = BROKE_ANSWER | {Reason.SCHEMA_MISMATCH}


_CONNECT_ERRORS = frozenset({RequestError.CONNECT_ERROR, RequestError.CONNECT_TIMEOUT})
#: Errors of a relayed body that make its answer incomplete.
_BROKEN_BODY = frozenset(
    {RequestError.UPSTREAM_DISCONNECT, RequestError.UPSTREAM_TIMEOUT, RequestError.CLIENT_STALLED}
)


def retryable(result: Result, retry_on: Collection[str]) -> bool:
    """Whether a route with ``retry_on`` retries an attempt that ended as ``result``."""
    cause = _CAUSES.get(result)
    return cause is not None and cause in retry_on


def result_of_failure(failure: AttemptFailure) -> Result:
    """No response head came back."""
    if failure.error in _CONNECT_ERRORS:
        return Result.CONNECT_ERROR
    if failure.error is None:
        return Result.TIMEOUT
    return Result.EARLY_EOF  # connected, but no valid head


def result_of_status(status: int) -> Result:
    """A response head came back with ``status``."""
    if status == 429:
        return Result.STATUS_429
    if status >= 500:
        return Result.STATUS_5XX
    if status >= 400:
        return Result.STATUS_4XX
    return Result.OK


def result_of_held(reason: Reason) -> Result:
    """A held answer failed for ``reason`` before anything of it was sent."""
    if reason is Reason.SCHEMA_MISMATCH:
        return Result.SCHEMA_MISMATCH
    if reason in _TIMEOUTS:
        return Result.TIMEOUT
    if reason in _BLAMELESS:
        return Result.INCOMPLETE
    return Result.EARLY_EOF


def result_of_answer(status: int, verdict: Verdict | None, error: RequestError | None) -> Result:
    """An answer relayed to the client: its status, a stream's verdict, a body's error."""
    result = result_of_status(status)
    if result is not Result.OK:
        return result
    if verdict is not None and not verdict.complete:
        # No first byte in time is a timeout, held or not.
        if verdict.reason is Reason.FIRST_BYTE_TIMEOUT:
            return Result.TIMEOUT
        return Result.INCOMPLETE
    if error in _BROKEN_BODY:
        return Result.INCOMPLETE
    return Result.OK


def health_of(
    result: Result, reason: Reason | None = None, error: RequestError | None = None
) -> Health:
    """What an attempt says about its upstream (``reason``: the stream's or the failure's)."""
    if result in (Result.OK, Result.STATUS_4XX, Result.CONTEXT_LENGTH):
        return Health.OK
    if result is Result.SCHEMA_MISMATCH:  # the model's answer, not the upstream's health
        return Health.NEUTRAL
    if reason is not None and reason in _BLAMELESS:
        return Health.NEUTRAL
    if result is Result.INCOMPLETE and reason is None and error is RequestError.CLIENT_STALLED:
        return Health.NEUTRAL
    return Health.FAILED


def retry_after_seconds(value: bytes | str | None, now: float, ceiling: float) -> float | None:
    """A ``Retry-After`` header's wait in seconds (delta-seconds or an HTTP date, against
    the wall-clock ``now``), at most ``ceiling``; None when absent, invalid or past."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if text.isdigit():
        seconds = float(int(text[:12]))
    else:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - now
    if seconds <= 0:
        return None
    return min(seconds, ceiling)


def is_context_length(body: bytes) -> bool:
    """Whether a 400's JSON body says the prompt is too long for the model: OpenAI's
    ``context_length_exceeded`` code, or Anthropic's "prompt is too long"
    ``invalid_request_error``."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return False
    error = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(error, dict):
        return False
    if error.get("code") == "context_length_exceeded":
        return True
    message = error.get("message")
    return (
        error.get("type") == "invalid_request_error"
        and isinstance(message, str)
        and message.lower().startswith("prompt is too long")
    )


def retry_after_ms(value: bytes | str | None, ceiling: float) -> float | None:
    """A ``retry-after-ms`` header's wait in seconds (OpenAI's), at most ``ceiling``."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    try:
        seconds = float(text.strip()) / 1000.0
    except ValueError:
        return None
    if not seconds > 0 or seconds != seconds:
        return None
    return min(seconds, ceiling)
