"""What the official google-genai SDK accepts on a Gemini stream, proven with the real SDK.

A small Starlette app on a loopback port plays scripted ``streamGenerateContent``
bodies; ``google.genai.Client`` (fake key, ``http_options`` base URL,
``api_version="v1beta"``) reads them, with its sync (httpx) and async
(aiohttp) readers. What the SDK does (``_api_client.py``, 3.x): a ``data: ``
line is event data; any other line, a comment included, is raw JSON to it,
so ``: ...`` raises ``UnknownApiResponseError``; it raises ``APIError``
(``ClientError`` 4xx, ``ServerError`` 5xx) only for an event whose JSON
*starts* with ``{"error":`` and whose ``code`` is an integer.

So: a complete stream reads cleanly; every incomplete reason's
``gemini_error_event`` raises ``APIError`` with the reason in
``err.details`` (the comment line after it is never read); the upstream's
own error raises too; a trailing comment line breaks the SDK, which is why
a complete Gemini stream carries none; an ``error`` that is not first is
silently ignored and one with a string code crashes the SDK, which is why
the contract withholds both and sends its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.guard import Outcome, Protocol, Reason, Verdict, gemini_error_event
from gateway.guard.annotation import comment_line, incomplete_message
from gateway.guard.gemini import google_status
from gateway.guard.verdict import INCOMPLETE_REASONS
from tests.conftest import ServerThread, running
from tests.sdk import genai
from tests.sdk import genai_errors as errors
from tests.sdk import genai_types as types
from tests.unit.gemini_captures import JAPANESE, JAPANESE_TEXT, OVERLOADED, SHORT, ev

pytestmark = pytest.mark.timeout(60)

MODEL = "gemini-2.5-flash"
SHORT_TEXT = "The capital of Wyoming is **Cheyenne**.\n"


def _comment(outcome: Outcome, reason: Reason, request_id: str = "req-g") -> bytes:
    return comment_line(Verdict(outcome=outcome, reason=reason), request_id)


def _cut_with_error(reason: Reason) -> bytes:
    """What the gateway sends for a cut stream: whole events, its error event, the comment."""
    error = gemini_error_event(
        reason, incomplete_message(Protocol.GEMINI, reason, "req-g"), "req-g"
    )
    return b"".join(SHORT[:2]) + error + _comment(Outcome.INCOMPLETE, reason)


BODIES: dict[str, bytes] = {
    "complete": b"".join(SHORT),
    "complete_crlf": b"".join(JAPANESE).replace(b"\n", b"\r\n"),
    "upstream_error": b"".join(SHORT[:2])
    + OVERLOADED
    + _comment(Outcome.INCOMPLETE, Reason.UPSTREAM_ERROR),
    "trailing_comment": b"".join(SHORT) + _comment(Outcome.COMPLETE, Reason.STOP),
    "heartbeat": SHORT[0] + b": ping\n\n" + b"".join(SHORT[1:]),
    "error_not_first": SHORT[0]
    + ev('{"candidates": [], "error": {"code": 500, "message": "lost"}}')
    + b"".join(SHORT[1:]),
    "error_string_code": SHORT[0] + ev('{"error": {"code": "500", "message": "x"}}'),
    **{f"cut_{reason}": _cut_with_error(reason) for reason in INCOMPLETE_REASONS},
}


async def _stream(request: Request) -> Response:
    # The model name picks the body, so one client serves every case.
    return Response(BODIES[request.path_params["model"]], media_type="text/event-stream")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    route = Route("/v1beta/models/{model}:streamGenerateContent", _stream, methods=["POST"])
    with running(Starlette(routes=[route])) as server:
        yield server


def _client(server: ServerThread) -> genai.Client:
    options = types.HttpOptions(base_url=server.url, api_version="v1beta")
    return genai.Client(api_key="fake-key", http_options=options)


@pytest.fixture(scope="module")
def sdk(server: ServerThread) -> Iterator[genai.Client]:
    with _client(server) as client:
        yield client


def read_sync(sdk: genai.Client, body: str, texts: list[str] | None = None) -> list[str]:
    """The text of every chunk the SDK's sync reader yields (into ``texts`` as they come)."""
    texts = [] if texts is None else texts
    for chunk in sdk.models.generate_content_stream(model=body, contents="hi"):
        texts.append(chunk.text or "")
    return texts


def read_async(server: ServerThread, body: str, texts: list[str] | None = None) -> list[str]:
    """The same with the SDK's async reader (aiohttp), in an event loop of its own."""
    texts = [] if texts is None else texts

    async def main() -> None:
        client = _client(server)
        try:
            stream = await client.aio.models.generate_content_stream(model=body, contents="hi")
            async for chunk in stream:
                texts.append(chunk.text or "")
        finally:
            await client.aio.aclose()

    asyncio.run(main())
    return texts


def test_a_complete_stream_reads_cleanly(sdk: genai.Client, server: ServerThread) -> None:
    assert "".join(read_sync(sdk, "complete")) == SHORT_TEXT
    assert "".join(read_sync(sdk, "complete_crlf")) == JAPANESE_TEXT
    assert "".join(read_async(server, "complete")) == SHORT_TEXT
    chunks = list(sdk.models.generate_content_stream(model="complete", contents="hi"))
    last = chunks[-1]
    assert last.candidates is not None
    assert last.candidates[0].finish_reason == "STOP"
    assert last.usage_metadata is not None
    assert last.usage_metadata.candidates_token_count == 10


def _check_error(error: errors.APIError, reason: Reason) -> None:
    code, status = google_status(reason)
    assert isinstance(error, errors.ServerError if code >= 500 else errors.ClientError)
    assert (error.code, error.status) == (code, status)
    assert error.message is not None
    assert str(reason) in error.message
    info, request = error.details["error"]["details"]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    assert info["reason"] == str(reason).upper()
    assert info["metadata"]["reason"] == str(reason)
    assert info["domain"] == "gateway"
    assert request["requestId"] == "req-g"


@pytest.mark.parametrize("reason", sorted(INCOMPLETE_REASONS), ids=str)
def test_every_incomplete_reason_raises_api_error_with_the_reason(
    sdk: genai.Client, reason: Reason
) -> None:
    texts: list[str] = []
    with pytest.raises(errors.APIError) as caught:
        read_sync(sdk, f"cut_{reason}", texts)
    assert "".join(texts) == "The capital of Wyoming"  # what came before the cut was delivered
    _check_error(caught.value, reason)


def test_the_async_reader_raises_the_same(server: ServerThread) -> None:
    texts: list[str] = []
    with pytest.raises(errors.APIError) as caught:
        read_async(server, f"cut_{Reason.MISSING_DONE}", texts)
    assert "".join(texts) == "The capital of Wyoming"
    _check_error(caught.value, Reason.MISSING_DONE)
    with pytest.raises(errors.UnknownApiResponseError):
        read_async(server, "trailing_comment")


def test_the_upstreams_own_error_raises(sdk: genai.Client) -> None:
    with pytest.raises(errors.ServerError) as caught:
        read_sync(sdk, "upstream_error")
    assert caught.value.code == 503
    assert caught.value.status == "UNAVAILABLE"


@pytest.mark.parametrize("body", ["trailing_comment", "heartbeat"])
def test_a_comment_line_breaks_the_sdk(sdk: genai.Client, body: str) -> None:
    """Why a complete Gemini stream carries no gateway comment line (and why an upstream's
    comment heartbeat would break a Gemini client too)."""
    texts: list[str] = []
    with pytest.raises(errors.UnknownApiResponseError, match="Failed to parse response as JSON"):
        read_sync(sdk, body, texts)
    assert texts  # the events before the comment were read


def test_an_error_that_is_not_first_is_silently_ignored(sdk: genai.Client) -> None:
    """Why GeminiContract withholds such an error and sends its own."""
    assert "".join(read_sync(sdk, "error_not_first")) == SHORT_TEXT


def test_an_error_with_a_string_code_crashes_the_sdk(sdk: genai.Client) -> None:
    with pytest.raises(TypeError):
        read_sync(sdk, "error_string_code")
