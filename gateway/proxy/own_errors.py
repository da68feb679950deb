"""Errors of the gateway's own, sent before any byte of an answer: a request stopped
(the drain, a client gone) or failed (no upstream answered) before its response."""

from __future__ import annotations

from starlette.types import Scope

from gateway.guard import Reason
from gateway.observe import RequestRecord
from gateway.policy.failover import AttemptFailure
from gateway.proxy.connection import edge_refusal
from gateway.proxy.errors import send_error
from gateway.proxy.exchange import Exchange, bare_verdict
from gateway.proxy.headers import RawHeaders

__all__ = ["client_left", "fail_before_response", "send_own_error", "stopped_before_response"]

_MESSAGES = {
    Reason.UPSTREAM_UNAVAILABLE: "The upstream could not be reached.",
    Reason.UPSTREAM_DISCONNECT: "The upstream did not send a valid answer.",
    Reason.FIRST_BYTE_TIMEOUT: "The upstream did not answer in time (first byte).",
    Reason.TOTAL_TIMEOUT: "The upstream did not answer before the total deadline.",
}


async def stopped_before_response(exchange: Exchange) -> None:
    """The exchange was stopped before any response byte: record it, and tell the
    client why unless it is the one who left."""
    record, reason = exchange.record, exchange.stop_reason
    assert reason is not None
    if record.stream and record.verdict is None:
        record.verdict = bare_verdict(reason)
    if record.status != 0:
        return
    if reason is Reason.CLIENT_DISCONNECT:
        client_left(record, exchange.scope)
        return
    message = (
        "The gateway is shutting down; retry on another instance."
        if reason is Reason.GATEWAY_SHUTDOWN
        else "The request was stopped before the upstream answered."
    )
    await send_own_error(
        exchange,
        503,
        message,
        "service_unavailable",
        str(reason),
        [(b"retry-after", b"1"), (b"connection", b"close")],
    )


async def fail_before_response(exchange: Exchange, failure: AttemptFailure) -> None:
    record = exchange.record
    if failure.error is not None:
        record.error = failure.error
    if record.stream:
        record.verdict = bare_verdict(failure.reason)
    # OpenAI-shaped on every route (the wire contract's 502/504 before any response
    # header); every SDK raises on the status.
    await send_own_error(
        exchange,
        failure.status,
        _MESSAGES.get(failure.reason, "Upstream failure."),
        "upstream_error",
        str(failure.reason),
        openai_shaped=True,
    )


async def send_own_error(
    exchange: Exchange,
    status: int,
    message: str,
    type_: str,
    code: str,
    extra: RawHeaders | None = None,
    *,
    openai_shaped: bool = False,
) -> None:
    """Send an error of the gateway's own, in the shape of the request's protocol
    (OpenAI's whatever the protocol when ``openai_shaped``)."""
    record = exchange.record
    record.status = status
    record.bytes_out += await send_error(
        exchange.send,
        None if openai_shaped else exchange.spec.name,
        status,
        message,
        type_,
        code,
        record.request_id,
        extra,
    )


def client_left(record: RequestRecord, scope: Scope) -> None:
    """A client gone before any answer: 499, or the edge's refusal of its stalled body."""
    refused = edge_refusal(scope)
    if refused is None:
        record.status = 499
    else:
        record.status, record.rejected = refused
