"""JSON error responses the gateway itself produces, in the route's protocol's shape.

One shaper for every error of the gateway's own (a refused key, a body too
large, an overloaded or draining gateway, a limit, a broken buffered answer),
so that each provider's SDK reads it as its own. The shape is the protocol's
(``ProtocolSpec.error_shape``, declared in ``gateway/protocols/``); errors
with no route, and on every route the 502/504 of an upstream that sent no
response header (the wire contract's), take the default (OpenAI's
``{"error": {"message", "type", "code", "param": null}}``).

Every message names the problem and the request id; never an upstream host,
a credential or an internal exception's text.
"""

from __future__ import annotations

import json

from starlette.types import Send

from gateway.guard import Protocol
from gateway.protocols import ErrorShape, openai_error, spec_for
from gateway.proxy.headers import RawHeaders

__all__ = ["error_body", "error_headers", "send_error"]


def error_body(
    protocol: Protocol | str | None,
    status: int,
    message: str,
    type_: str,
    code: str,
    request_id: str,
) -> bytes:
    """The JSON body of an error of the gateway's own in ``protocol``'s shape (None:
    no route, the OpenAI shape). ``type_`` and ``code`` are the OpenAI shape's; the
    others carry ``code`` where their shape has a place for it."""
    body = _shape(protocol)(status, message, type_, code, request_id)
    return json.dumps(body, separators=(",", ":")).encode()


def _shape(protocol: Protocol | str | None) -> ErrorShape:
    if protocol is None:
        return openai_error
    try:
        return spec_for(protocol).error_shape
    except ValueError:  # not a protocol's name (a route for any path's "auto")
        return openai_error


def error_headers(body: bytes, request_id: str, extra: RawHeaders | None = None) -> RawHeaders:
    headers: RawHeaders = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode()),
        (b"cache-control", b"no-store"),
    ]
    if extra:
        headers.extend(extra)
    return headers


async def send_error(
    send: Send,
    protocol: Protocol | str | None,
    status: int,
    message: str,
    type_: str,
    code: str,
    request_id: str,
    extra: RawHeaders | None = None,
) -> int:
    """Send a whole JSON error response over ASGI; returns the body's length."""
    body = error_body(protocol, status, message, type_, code, request_id)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": error_headers(body, request_id, extra),
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
    return len(body)
