"""AWS Bedrock Runtime: ``POST /model/{modelId}/converse-stream`` and
``/invoke-with-response-stream`` (AWS event streams), ``/converse`` and ``/invoke``
(whole JSON answers, relayed plain).

A route fronts it with ``protocol = "bedrock"`` (or ``auto``: the paths are
found by their ending) and ``upstream`` the runtime's endpoint
(``https://bedrock-runtime.us-east-1.amazonaws.com``). Its requests are
signed (SigV4, ``gateway.protocols.sigv4``) with the upstream's own AWS
credentials (``credential_style = "sigv4"``, the keys from the environment
variables its ``aws`` table names, and its region), never with a client's.

A stream is never continued. Captures are redacted frame by frame: each
frame's JSON payload (and a ``chunk``'s base64 ``bytes``, decoded, masked
and encoded again) keeps its length, and the message CRC is computed again,
so a frame that was whole and valid stays so and a corrupt one stays
corrupt: the redacted stream is judged as the original was.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, Final
from urllib.parse import quote, unquote

from gateway.guard import BedrockContract, Protocol
from gateway.guard.bedrock import bedrock_usage
from gateway.guard.usage import messages_usage
from gateway.protocols._spec import (
    ClientRequests,
    CredentialStyle,
    ProtocolSpec,
    Redactor,
    Tool,
    UsageBasis,
)
from gateway.protocols.bedrock_structured import BEDROCK_STRUCTURED, ask_bedrock

__all__ = ["BEDROCK", "bedrock_error", "redact_eventstream"]

_PATH = re.compile(
    r"/model/([^/]+)/(converse-stream|invoke-with-response-stream|converse|invoke)/?$"
)
#: The same below a route whose prefix ends in ``/model`` (the probe's simulator route):
#: read only once a path is Bedrock's (a fixed route, or ``_PATH`` matched).
_BELOW = re.compile(r"/([^/]+)/(converse-stream|invoke-with-response-stream|converse|invoke)/?$")
_STREAMS = frozenset({"converse-stream", "invoke-with-response-stream"})

#: HTTP status -> the Bedrock Runtime exception botocore raises for it.
_EXCEPTIONS: Final = MappingProxyType(
    {
        400: "ValidationException",
        401: "AccessDeniedException",
        403: "AccessDeniedException",
        404: "ResourceNotFoundException",
        408: "ModelTimeoutException",
        413: "ValidationException",
        424: "ModelErrorException",
        429: "ThrottlingException",
        500: "InternalServerException",
        502: "ServiceUnavailableException",
        503: "ServiceUnavailableException",
        504: "ModelTimeoutException",
    }
)


def _is_bedrock_path(path: str) -> bool:
    return _PATH.search(path) is not None


def _wants_stream(path: str, body: Any) -> bool:
    match = _BELOW.search(path.split("?", 1)[0])
    return match is not None and match.group(2) in _STREAMS


def _path_model(path: str, body: Any) -> str | None:
    match = _BELOW.search(path.split("?", 1)[0])
    return unquote(match.group(1)) if match else None


def _answer_usage(body: dict[str, Any]) -> Any:
    usage = body.get("usage")
    if isinstance(usage, dict) and "inputTokens" in usage:
        return bedrock_usage(usage)  # Converse
    return messages_usage(usage)  # InvokeModel of an Anthropic model


def bedrock_error(
    status: int, message: str, type_: str, code: str, request_id: str
) -> dict[str, Any]:
    """Bedrock Runtime's REST error: ``{"__type", "message"}``, the type the exception
    botocore raises for the status (``ThrottlingException`` for a 429)."""
    kind = _EXCEPTIONS.get(
        status, "InternalServerException" if status >= 500 else "ValidationException"
    )
    return {
        "__type": kind,
        "message": f"{message} ({code}) (request_id={request_id})",
        "reason": code,
    }


# -- captures ---------------------------------------------------------------------------

_U32 = struct.Struct(">I")


def redact_eventstream(redactor: Redactor, data: bytes) -> bytes:
    """``data`` (an event stream, perhaps cut) with every JSON payload masked, same length,
    each whole frame's message CRC computed again (a wrong one stays as wrong)."""
    out = bytearray(data)
    pos, size = 0, len(data)
    while size - pos >= 12:
        total, header_length, prelude_crc = struct.unpack_from(">III", data, pos)
        if (
            zlib.crc32(data[pos : pos + 8]) != prelude_crc
            or total < 16
            or header_length > total - 16
        ):
            break  # the guard stops at this frame: nothing after it is read
        start = pos + 12 + header_length
        end = pos + total - 4
        if pos + total > size:
            _mask(out, start, min(end, size))  # a torn frame: never judged
            return bytes(out)
        payload = data[start:end]
        masked = _payload(redactor, payload)
        out[start:end] = masked
        (crc,) = _U32.unpack_from(data, end)
        fixed = zlib.crc32(bytes(out[pos:end])) ^ zlib.crc32(data[pos:end]) ^ crc
        out[end : end + 4] = _U32.pack(fixed)
        pos += total
    _mask(out, pos, size)
    return bytes(out)


def _mask(out: bytearray, start: int, end: int) -> None:
    if end > start:
        out[start:end] = b"x" * (end - start)


def _payload(redactor: Redactor, payload: bytes) -> bytes:
    try:
        tree = json.loads(payload)
    except (ValueError, RecursionError):
        return b"x" * len(payload)
    masked = redactor.json(payload, tree)
    encoded = tree.get("bytes") if isinstance(tree, dict) else None
    if not isinstance(encoded, str):
        return masked
    at = payload.find(encoded.encode())
    if at < 0:
        return masked
    try:
        inner = base64.b64decode(encoded, validate=True)
    except ValueError:
        replaced = b"!" * len(encoded)  # not base64 before, not base64 after
    else:
        replaced = base64.b64encode(_inner(redactor, inner))
    return masked[:at] + replaced + masked[at + len(encoded) :]


def _inner(redactor: Redactor, inner: bytes) -> bytes:
    """The model's own event inside a chunk, masked as any event's JSON (not JSON: all
    of it, still not JSON)."""
    try:
        tree: object = json.loads(inner)
    except RecursionError:
        tree = None  # nested deeper than json goes: keep the nesting, mask its strings
    except ValueError:
        return b"x" * len(inner)
    return redactor.json(inner, tree)


# -- what `gateway probe` sends (Converse) ------------------------------------------------


def _path(model: str, stream: bool) -> str:
    return (
        f"/{quote(model, safe='')}/converse-stream"
        if stream
        else f"/{quote(model, safe='')}/converse"
    )


def _text(model: str, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    # The model and whether to stream are in the path.
    return {
        "messages": [{"role": "user", "content": [{"text": prompt}]}],
        "inferenceConfig": {"maxTokens": max_tokens},
    }


def _tool(body: dict[str, Any], tool: Tool) -> None:
    spec = {
        "name": tool.name,
        "description": tool.description,
        "inputSchema": {"json": tool.parameters},
    }
    body["toolConfig"] = {
        "tools": [{"toolSpec": spec}],
        "toolChoice": {"tool": {"name": tool.name}},
    }


def _redaction(redactor: Redactor) -> Callable[[bytes], bytes]:
    # Converse's own vocabulary: its stop reason stays, a toolUse's string input is masked
    # as tool arguments (valid JSON stays valid), indexed by its content block.
    redactor.learn(
        structural=frozenset({"stopReason"}),
        arguments=frozenset({"input"}),
        indexes=("contentBlockIndex",),
    )
    return lambda data: redact_eventstream(redactor, data)


BEDROCK = ProtocolSpec(
    protocol=Protocol.BEDROCK,
    request_id_headers=("x-amzn-requestid",),
    contract=BedrockContract,
    matches=_is_bedrock_path,
    wants_stream=_wants_stream,
    answer_usage=_answer_usage,
    request_model=_path_model,
    credential=CredentialStyle.SIGV4,
    error_shape=bedrock_error,
    redaction=_redaction,
    continuable=False,
    hosts=("bedrock-runtime",),
    signing_service="bedrock",
    # The probe's path below a route with prefix ``/model`` (the runtime's paths below it).
    requests=ClientRequests(
        path=_path, text=_text, tool=_tool, structured=ask_bedrock, simulator_prefix="/model"
    ),
    # Converse's own field first (added when a request names none); an invoke body is the
    # model's own: Anthropic's (which must name it) has max_tokens.
    output_limit=("inferenceConfig.maxTokens", "max_tokens"),
    genai_operation="chat",
    genai_provider="aws.bedrock",
    price_provider="aws",
    usage_basis=UsageBasis(input_includes_cached=False),
    structured=BEDROCK_STRUCTURED,
)
