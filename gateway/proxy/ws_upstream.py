"""Opening the upstream WebSocket of a client's connection: pool choice and failover.

The gateway opens the upstream socket before it accepts the client's, so a
failed connect or handshake is retried on another upstream of the route's
pool (the route's ``retry_on`` and ``max_attempts``, as for an HTTP request)
while nothing has been relayed; when every attempt fails, the client's
handshake is refused with the last attempt's status (502 when nothing
answered). An upstream that answers the handshake with a status other than
101 (a 401, a 404 of a server without the WebSocket mode) is such a failure:
its status and body go back to the client, as an HTTP answer would.

The lease on the chosen upstream is held for the connection's life (it is
one outstanding request to balance against) and handed back by ``done``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI

from gateway.observe import Attempt, Metrics
from gateway.policy.errors import RequestError
from gateway.policy.failover import Result, result_of_status, retryable
from gateway.policy.pool import Health, Lease
from gateway.policy.routing import Endpoint, Route, Target
from gateway.protocols.openai import RESPONSES
from gateway.proxy.headers import RawHeaders, with_credential
from gateway.proxy.tally import attempt_done

__all__ = ["Opened", "Refusal", "open_upstream"]

log = logging.getLogger("gateway")

#: Bounds the closing handshake with the upstream: a client that left closes it within it.
CLOSE_TIMEOUT = 1.0


@dataclass(slots=True)
class Opened:
    ws: ClientConnection
    endpoint: Endpoint
    lease: Lease
    started: float


@dataclass(frozen=True, slots=True)
class Refusal:
    """No upstream socket: the status and body the client's handshake gets."""

    status: int
    error: RequestError  # the access log's classification, and the error's code
    body: bytes | None = None  # the upstream's own answer, relayed as it is


def ws_url(http_url: str) -> str:
    """``http://h/v1/responses`` -> ``ws://h/v1/responses`` (https -> wss)."""
    if http_url.startswith("https://"):
        return "wss://" + http_url[len("https://") :]
    if http_url.startswith("http://"):
        return "ws://" + http_url[len("http://") :]
    return http_url


async def open_upstream(
    route: Route,
    target: Target,
    headers: RawHeaders,
    metrics: Metrics,
    attempts: list[Attempt],
    *,
    max_size: int,
    ping_interval: float,
) -> Opened | Refusal:
    """The first upstream of the pool that completes the handshake, or why none did."""
    tried: list[int] = []
    deadline = time.monotonic() + route.timeouts.total
    lease: Lease | None = route.pool.pick()
    refusal = Refusal(502, RequestError.CONNECT_ERROR)
    while lease is not None:
        tried.append(lease.index)
        endpoint = route.endpoints[lease.index]
        metrics.upstream_started(route.name, endpoint.name)
        started = time.monotonic()
        try:
            ws = await connect(
                ws_url(endpoint.url_for(target)),
                additional_headers=[
                    (k.decode("latin-1"), v.decode("latin-1"))
                    for k, v in with_credential(headers, endpoint, RESPONSES)
                ],
                user_agent_header=None,
                open_timeout=endpoint.timeouts.connect,
                max_size=max_size,
                ping_interval=ping_interval,
                ping_timeout=ping_interval,
                close_timeout=CLOSE_TIMEOUT,
                compression=None,
                proxy=None,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            result = result_of_status(status)
            refusal = Refusal(status, RequestError.UPSTREAM_STATUS, bytes(exc.response.body or b""))
        except TimeoutError:
            result, refusal = Result.CONNECT_ERROR, Refusal(504, RequestError.CONNECT_TIMEOUT)
        except (OSError, InvalidHandshake, InvalidURI):
            result, refusal = Result.CONNECT_ERROR, Refusal(502, RequestError.CONNECT_ERROR)
        else:
            return Opened(ws, endpoint, lease, started)
        attempts.append(Attempt(endpoint.name, result, time.monotonic() - started))
        health = Health.OK if result is Result.STATUS_4XX else Health.FAILED
        attempt_done(route, endpoint, lease, health, metrics)
        if (
            len(tried) >= route.config.max_attempts
            or not retryable(result, route.retry_on)
            or time.monotonic() >= deadline
        ):
            break
        lease = route.pool.pick(tried, panic=False)
    return refusal


async def close_upstream(ws: ClientConnection, code: int, reason: str) -> None:
    """Close the upstream socket, bounded by ``CLOSE_TIMEOUT`` (never raises)."""
    try:
        await asyncio.wait_for(ws.close(code, reason), CLOSE_TIMEOUT + 0.5)
    except Exception:  # already gone, or slow: the transport is dropped either way
        ws.transport.abort()
