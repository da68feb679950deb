"""Buffered plain answers: a 2xx JSON answer of known, bounded length is read whole first.

Relayed as it arrives, a non-streamed answer that the upstream cuts, or that
does not parse, reaches the client as a ``200`` with broken JSON: the SDKs
raise a ``JSONDecodeError`` instead of an API error, and nothing says why.
So a 2xx ``application/json`` answer (not content-encoded) whose
``Content-Length`` is at most ``limits.max_buffered_answer_bytes`` is read
whole before its head goes out. A whole, parseable one then goes out
unchanged in one piece; a cut one (fewer bytes than announced, or a transport
error) or an unparseable one becomes a ``502`` in the protocol's own error
shape with the reason (``upstream_disconnect``, ``invalid_json``), so the
client's SDK raises its server error (Ollama's: ``{"error": "<message>"}``).

Larger answers, and those of unknown length (chunked), are relayed as they
arrive, as before. For a buffered answer, time to first byte is the time to
the whole answer. The read is bounded by the request's total deadline; memory
by the limit, per answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from gateway.guard import Protocol, Reason
from gateway.guard.jsonparse import loads
from gateway.proxy.errors import error_body, error_headers

__all__ = ["BufferedFailure", "buffered_length", "failure_body", "read_upto", "read_whole"]

_MESSAGES = {
    Reason.UPSTREAM_DISCONNECT: "The upstream's answer was cut before its end.",
    Reason.INVALID_JSON: "The upstream's answer is not valid JSON.",
}


class BufferedFailure(Exception):
    """A buffered answer that must not reach the client as it is."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(str(reason))
        self.reason = reason


def buffered_length(response: httpx.Response, limit: int) -> int | None:
    """The announced length of an answer to read whole first; None: relay it as it comes."""
    if not 200 <= response.status_code < 300 or response.status_code in (204, 205):
        return None
    headers = response.headers
    if "json" not in headers.get("content-type", "") or headers.get("content-encoding"):
        return None
    try:
        length = int(headers.get("content-length", ""))
    except ValueError:
        return None
    return length if 0 < length <= limit else None


async def read_whole(chunks: AsyncIterator[bytes], length: int) -> bytes:
    """The whole body, checked: ``BufferedFailure`` when it is cut or does not parse.

    More bytes than announced are read no further than one chunk past the
    length (and are a cut answer too: the framing is broken).
    """
    body, cut = await read_upto(chunks, length + 1)
    if cut or len(body) != length:
        raise BufferedFailure(Reason.UPSTREAM_DISCONNECT)
    try:
        loads(body)
    except (ValueError, RecursionError):
        raise BufferedFailure(Reason.INVALID_JSON) from None
    return body


async def read_upto(chunks: AsyncIterator[bytes], most: int) -> tuple[bytes, bool]:
    """The chunks read until they hold ``most`` bytes or end (the last one whole, so it
    may pass ``most``), and whether the upstream broke off (a transport error) first."""
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in chunks:
            parts.append(chunk)
            size += len(chunk)
            if size >= most:
                break
    except (httpx.TransportError, OSError):
        return b"".join(parts), True
    return b"".join(parts), False


def failure_body(
    protocol: Protocol, reason: Reason, request_id: str
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The 502's body and headers, in the shape the protocol's SDKs read an error from."""
    message = _MESSAGES.get(reason, "Upstream failure.")
    body = error_body(protocol, 502, message, "upstream_error", str(reason), request_id)
    return body, error_headers(body, request_id)
