"""OpenAI-shaped JSON error responses the gateway itself produces.

They name the problem and the request id; never an upstream host, a
credential or an internal exception's text.
"""

from __future__ import annotations

import json

from starlette.types import Send

from gateway.proxy.headers import RawHeaders

__all__ = ["error_body", "error_headers", "send_error"]


def error_body(message: str, type_: str, code: str, request_id: str) -> bytes:
    return json.dumps(
        {
            "error": {
                "message": f"{message} (request_id={request_id})",
                "type": type_,
                "code": code,
                "param": None,
            }
        },
        separators=(",", ":"),
    ).encode()


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
    status: int,
    message: str,
    type_: str,
    code: str,
    request_id: str,
    extra: RawHeaders | None = None,
) -> int:
    """Send a whole JSON error response over ASGI; returns the body's length."""
    body = error_body(message, type_, code, request_id)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": error_headers(body, request_id, extra),
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
    return len(body)
