"""A limited client's answers: the 429 (or 503) in the protocol's own shape, the
x-ratelimit-* headers on every answer, and the cost settled when it ends.

The shapes are the providers' own, so that the official SDKs raise their own
error types (openai's ``RateLimitError``, anthropic's ``RateLimitError``,
google-genai's ``ClientError`` with ``RESOURCE_EXHAUSTED``, ollama's
``ResponseError`` with the message as its ``error``) and their
built-in retries wait ``retry-after-ms`` / ``Retry-After``. A spent budget
(a day's or a month's) is ``insufficient_quota`` with the window's reset
time, and ``x-should-retry: false``: an SDK's retry cannot help before then.
"""

from __future__ import annotations

import math
import time

from starlette.types import Message, Send

from gateway.limits import LimitRefused, TooLarge, Uncapped, Unpriced
from gateway.money.prices import nanos_to_usd
from gateway.observe import RequestRecord
from gateway.policy.quota import Cost, cost_of, output_estimate
from gateway.proxy.errors import error_body, error_headers
from gateway.proxy.headers import RawHeaders

__all__ = ["cost_of_record", "limited_body", "send_limited", "with_headers"]


def _too_large_message(refused: TooLarge) -> str:
    ways = "a lower max_tokens (or the route's default_output_reservation, for a request "
    ways += "that names none)"
    if not refused.strict:
        ways += ', or budget_enforcement = "strict" (the output capped at what is left)'
    return (
        f"This request can never fit this client's {refused.limit} limit of {refused.value} "
        f"tokens: it reserves {refused.input} input and {refused.output} output tokens, "
        f"more than the limit itself. To fit, send a shorter input, {ways}."
    )


def _message(refused: LimitRefused, now: float) -> str:
    if isinstance(refused, TooLarge):
        return _too_large_message(refused)
    if isinstance(refused, Uncapped):
        return (
            "This client's budgets are strict, and the request body is too complex for the "
            "gateway to cap its output at what is left: it is not sent uncapped. Set its "
            f"output limit (max_tokens) to at most {refused.cap} yourself, or send a "
            "simpler body."
        )
    if isinstance(refused, Unpriced):
        return (
            f"The model {refused.model!r} has no price in the gateway's price table or its "
            "[[prices]] overrides, and this client has a money budget: it cannot be charged."
        )
    if refused.never is not None:
        cost, budget = (nanos_to_usd(n) for n in refused.never)
        return (
            f"This request can cost up to ${cost}, more than this client's whole "
            f"{refused.limit} budget of ${budget}: it can never fit. Ask for fewer output tokens."
        )
    if refused.limit is None:
        return "The gateway cannot check this client's limits now; retry shortly."
    if refused.limit.is_budget:
        reset = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + refused.retry_after))
        return f"This client's {refused.limit} budget is spent; it resets at {reset}."
    return (
        f"This client's {refused.limit} limit is reached; retry after {refused.retry_after:.3f} s."
    )


def limited_body(protocol: str, refused: LimitRefused, request_id: str, now: float) -> bytes:
    """The error body in ``protocol``'s shape."""
    limit = refused.limit
    if isinstance(refused, TooLarge):
        type_, code = "invalid_request_error", "request_too_large"
    elif isinstance(refused, Uncapped):
        type_, code = "invalid_request_error", "output_not_capped"
    elif isinstance(refused, Unpriced):
        type_, code = "invalid_request_error", "model_not_priced"
    elif limit is None:
        type_, code = "service_unavailable", "limits_backend_unavailable"
    elif limit.is_budget:
        type_, code = "insufficient_quota", limit.code
    else:
        type_, code = limit.family, limit.code
    return error_body(protocol, refused.status, _message(refused, now), type_, code, request_id)


def limited_headers(refused: LimitRefused, now: float) -> RawHeaders:
    if isinstance(refused, TooLarge | Uncapped):  # nothing to wait for
        return [(b"x-should-retry", b"false")]
    if isinstance(refused, Unpriced) or refused.never is not None:  # nothing to wait for
        return [(b"x-should-retry", b"false"), *refused.headers]
    seconds = refused.retry_after
    headers: RawHeaders = [
        (b"retry-after", str(max(math.ceil(seconds), 1)).encode()),
        (b"retry-after-ms", str(max(math.ceil(seconds * 1000), 1)).encode()),
    ]
    limit = refused.limit
    if limit is not None and limit.is_budget:
        headers.append((b"x-should-retry", b"false"))
    # every x-ratelimit-* header, with what each limit really has left (the refused one's
    # remaining is what it had, which the request did not fit in)
    headers.extend(refused.headers)
    return headers


async def send_limited(send: Send, protocol: str, refused: LimitRefused, request_id: str) -> int:
    """Answer a refused request; returns the body's length."""
    now = time.time()
    body = limited_body(protocol, refused, request_id, now)
    headers = error_headers(body, request_id, limited_headers(refused, now))
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
    return len(body)


def with_headers(send: Send, extra: RawHeaders) -> Send:
    """``send`` with ``extra`` added to the response's head."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return sending


def cost_of_record(record: RequestRecord, estimated_input: int) -> Cost:
    """What a finished request cost: the provider's reported usage, else an estimate
    from its input and the output that reached the client. A request that never
    reached an upstream, or got an error status from it, cost nothing."""
    billed = record.billed
    if billed is not None:
        # Every attempt of a continued stream, each by its reported usage where it had
        # some (a cut Messages stream's message_start) and estimated where not.
        return cost_of(None, None, billed.input_tokens or 0, billed.output_tokens or 0)
    verdict = record.verdict
    usage = record.usage if record.usage is not None else verdict.usage if verdict else None
    if usage is not None and (usage.input_tokens is not None or usage.output_tokens is not None):
        return cost_of(usage.input_tokens, usage.output_tokens, estimated_input, 0)
    if not record.attempts or (record.status >= 400 and record.status != 499):
        return cost_of(None, None, 0, 0)
    if verdict is not None:
        output = output_estimate(True, verdict.events, verdict.content_chars, record.bytes_out)
    else:
        output = output_estimate(False, 0, 0, record.bytes_out if record.status else 0)
    return cost_of(None, None, estimated_input, output)
