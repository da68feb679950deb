"""One attempt against one upstream: send the request, get a response head or a failure.

The request is sent through the pooled ``Upstream``; what comes back is
either the upstream's response (any status: relaying it is the caller's
job) or an ``AttemptFailure`` that says what went wrong before any response
head arrived, with the status and verdict reason the client is owed. The
policy around attempts (how many, against which upstream) is the relay's.
"""

from __future__ import annotations

import asyncio

import httpx

from gateway.guard import Reason
from gateway.policy.errors import AttemptError, RequestError
from gateway.policy.failover import AttemptFailure
from gateway.proxy.timer import Deadline
from gateway.proxy.upstream import Upstream, UpstreamRequest, send_failure

__all__ = ["AttemptFailure", "attempt"]


#: Transport failures before the head. Connected but no valid answer is the HTTP
#: exchange breaking, like a body cut mid-way (``upstream_disconnect``);
#: ``upstream_unavailable`` is "could not connect".
_SEND_FAILURES = {
    error: AttemptFailure(RequestError.of(error), status, reason)
    for error, status, reason in (
        (AttemptError.CONNECT_TIMEOUT, 504, Reason.UPSTREAM_UNAVAILABLE),
        (AttemptError.CONNECT_ERROR, 502, Reason.UPSTREAM_UNAVAILABLE),
        (AttemptError.UPSTREAM_BAD_RESPONSE, 502, Reason.UPSTREAM_DISCONNECT),
    )
}
_FIRST_BYTE = AttemptFailure(None, 504, Reason.FIRST_BYTE_TIMEOUT)
_TOTAL = AttemptFailure(None, 504, Reason.TOTAL_TIMEOUT)


async def attempt(
    upstream: Upstream, request: UpstreamRequest, first_byte: float, total_deadline: float
) -> httpx.Response | AttemptFailure:
    """Send ``request``; the response head within ``first_byte`` seconds (and before
    ``total_deadline``, loop time), or the failure. Cancellation passes through."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task(loop)
    assert task is not None
    deadline = Deadline(loop, task, min(loop.time() + first_byte, total_deadline))
    try:
        return await upstream.send(request)
    except asyncio.CancelledError:
        if not deadline.expired():
            raise
        return _TOTAL if loop.time() >= total_deadline else _FIRST_BYTE
    except (httpx.TransportError, OSError) as exc:
        return _SEND_FAILURES[send_failure(exc)]
    finally:
        deadline.cancel()
