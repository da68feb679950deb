"""JSON error responses the gateway itself produces, in the route's protocol's shape.

One shaper for every error of the gateway's own (a refused key, a body too
large, an overloaded or draining gateway, a limit, a broken buffered answer),
so that each provider's SDK reads it as its own:

- OpenAI family (Chat, Completions, Responses, bare SSE), errors with no
  route, and on every route the 502/504 of an upstream that sent no response
  header (the wire contract's): ``{"error": {"message", "type", "code",
  "param": null}}``.
- Anthropic Messages: ``{"type": "error", "error": {"type", "message",
  "details": {"error_code"}}, "request_id"}``, the type named from the status
  as Anthropic names it (401 ``authentication_error``, 529 ``overloaded_error``).
- Gemini: Google's ``{"error": {"code", "message", "status", "details"}}``, the
  canonical ``google.rpc.Code`` name from the status, the code in a
  ``google.rpc.ErrorInfo`` as the gateway's stream errors carry it.
- Ollama: ``{"error": "<message>"}``: a string, which the ollama client shows.

Every message names the problem and the request id; never an upstream host,
a credential or an internal exception's text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from starlette.types import Send

from gateway.guard import Protocol
from gateway.guard.gemini import google_error
from gateway.proxy.headers import RawHeaders

__all__ = ["error_body", "error_headers", "send_error"]

#: HTTP status -> Anthropic's error type (its "HTTP errors" table; 503 and 504 as
#: the API's overload and timeout).
_ANTHROPIC_TYPES: Final = MappingProxyType(
    {
        400: "invalid_request_error",
        401: "authentication_error",
        402: "billing_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
        502: "api_error",
        503: "overloaded_error",
        504: "timeout_error",
        529: "overloaded_error",
    }
)

#: HTTP status -> the canonical ``google.rpc.Code`` name Google's errors carry
#: (502 has no code of its own: a failed upstream is ``UNAVAILABLE``).
_GOOGLE_STATUS: Final = MappingProxyType(
    {
        400: "INVALID_ARGUMENT",
        401: "UNAUTHENTICATED",
        403: "PERMISSION_DENIED",
        404: "NOT_FOUND",
        409: "ABORTED",
        413: "INVALID_ARGUMENT",
        429: "RESOURCE_EXHAUSTED",
        499: "CANCELLED",
        500: "INTERNAL",
        501: "NOT_IMPLEMENTED",
        502: "UNAVAILABLE",
        503: "UNAVAILABLE",
        504: "DEADLINE_EXCEEDED",
    }
)


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
    shape = _SHAPES.get(str(protocol), _openai)
    body = shape(status, message, type_, code, request_id)
    return json.dumps(body, separators=(",", ":")).encode()


Json = dict[str, Any]


def _openai(status: int, message: str, type_: str, code: str, request_id: str) -> Json:
    text = f"{message} (request_id={request_id})"
    return {"error": {"message": text, "type": type_, "code": code, "param": None}}


def _anthropic(status: int, message: str, type_: str, code: str, request_id: str) -> Json:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    text = f"{message} (request_id={request_id})"
    error = {"type": kind, "message": text, "details": {"error_code": code}}
    return {"type": "error", "error": error, "request_id": request_id}


def _gemini(status: int, message: str, type_: str, code: str, request_id: str) -> Json:
    name = _GOOGLE_STATUS.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
    return google_error(status, name, f"{message} (request_id={request_id})", code, request_id)


def _ollama(status: int, message: str, type_: str, code: str, request_id: str) -> Json:
    return {"error": f"{message} ({code}) (request_id={request_id})"}


_SHAPES: Final[Mapping[str, Callable[[int, str, str, str, str], Json]]] = MappingProxyType(
    {Protocol.MESSAGES: _anthropic, Protocol.GEMINI: _gemini, Protocol.OLLAMA: _ollama}
)


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
