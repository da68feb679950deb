"""The gateway's own errors in the route's protocol's shape, read by each provider's SDK.

A real gateway in front of the simulator with a client key, a small body limit
and one stream at a time per route: a bad key (401), a body over the limit (413)
and a second concurrent stream (503) on an Anthropic, an Ollama and a Gemini
route, each raised by the real SDK as its own error with the gateway's message;
and the one exception, an unreachable upstream's 502, OpenAI-shaped everywhere.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests import web
from tests.conftest import ServerThread
from tests.integration.helpers import gateway_for
from tests.sdk import anthropic, genai, genai_errors, genai_types, ollama

KEY = "sk-shapes-0123"
LIMIT = 4096
BIG = "x" * (2 * LIMIT)
GEMINI_MODEL = "gemini-2.5-flash"
#: A stream the simulator holds open (a comment or a pause, then nothing for a while).
HOLD = {"x-sim-fault": "stall_mid_stream", "x-sim-stall-seconds": "20"}
HELLO = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    routes = [
        {"name": "a", "prefix": "/anthropic", "upstream": simulator.url, "protocol": "messages"},
        {"name": "o", "prefix": "/api", "upstream": simulator.url + "/api", "protocol": "ollama"},
        {"name": "g", "prefix": "/v1beta", "upstream": simulator.url + "/v1beta"},
    ]
    for route in routes:
        route["max_concurrent_streams"] = 1
    return {
        "routes": routes,
        "client_key_sha256": [hashlib.sha256(KEY.encode()).hexdigest()],
        "limits": {"max_request_bytes": LIMIT},
    }


@contextmanager
def _held(url: str, body: dict[str, Any]) -> Iterator[None]:
    """One stream open on the route (its first bytes read) while the block runs."""
    headers = {**HOLD, "authorization": f"Bearer {KEY}"}
    with web.stream("POST", url, json=body, headers=headers, timeout=30) as first:
        assert first.status_code == 200
        chunks = first.iter_raw()  # kept: a dropped iterator closes the response
        next(chunks)
        yield


# ------------------------------------------------------------------------ Anthropic


def _anthropic(gw: ServerThread, key: str = KEY) -> Any:
    return anthropic.Anthropic(base_url=gw.url + "/anthropic", api_key=key, max_retries=0)


def _messages(content: str = "hi") -> dict[str, Any]:
    return {"model": "sim", "max_tokens": 20, "messages": [{"role": "user", "content": content}]}


def _anthropic_raises(error: type[Exception], call: Callable[[], object]) -> dict[str, Any]:
    with pytest.raises(error) as raised:
        call()
    body = raised.value.body  # type: ignore[attr-defined]
    assert isinstance(body, dict)
    assert body["type"] == "error"
    return body


def test_anthropic_sdk_reads_a_bad_key_as_its_authentication_error(gateway: ServerThread) -> None:
    client = _anthropic(gateway, key="sk-wrong")
    body = _anthropic_raises(
        anthropic.AuthenticationError, lambda: client.messages.create(**_messages())
    )
    assert body["error"]["type"] == "authentication_error"
    assert body["error"]["message"].startswith("Missing or invalid API key.")
    assert body["error"]["details"] == {"error_code": "unauthorized"}
    assert body["request_id"]


def test_anthropic_sdk_reads_a_body_too_large(gateway: ServerThread) -> None:
    client = _anthropic(gateway)
    call = lambda: client.messages.create(**_messages(BIG))  # noqa: E731
    body = _anthropic_raises(anthropic.ContentTooLargeError, call)
    assert body["error"]["type"] == "request_too_large"
    assert f"limit of {LIMIT} bytes" in body["error"]["message"]


def test_anthropic_sdk_reads_an_overloaded_gateway(gateway: ServerThread) -> None:
    client = _anthropic(gateway)
    with _held(gateway.url + "/anthropic/v1/messages", {**_messages(), "stream": True}):
        call = lambda: client.messages.create(**_messages(), stream=True)  # noqa: E731
        body = _anthropic_raises(anthropic.ServiceUnavailableError, call)
    assert body["error"]["type"] == "overloaded_error"
    assert body["error"]["message"].startswith("Too many concurrent streams")
    assert body["error"]["details"] == {"error_code": "overloaded"}


# --------------------------------------------------------------------------- Ollama


def _ollama(gw: ServerThread, key: str = KEY) -> Any:
    return ollama.Client(host=gw.url, headers={"authorization": f"Bearer {key}"})


def _ollama_raises(status: int, call: Callable[[], object]) -> str:
    with pytest.raises(ollama.ResponseError) as raised:
        call()
    assert raised.value.status_code == status
    error = raised.value.error
    assert isinstance(error, str)  # the message itself, not a JSON object's text
    assert "request_id=" in error
    return error


def test_ollama_client_reads_a_bad_key_as_a_message(gateway: ServerThread) -> None:
    client = _ollama(gateway, key="sk-wrong")
    error = _ollama_raises(401, lambda: client.chat(model="sim", messages=HELLO))
    assert error.startswith("Missing or invalid API key. (unauthorized)")


def test_ollama_client_reads_a_body_too_large(gateway: ServerThread) -> None:
    client = _ollama(gateway)
    error = _ollama_raises(413, lambda: client.generate(model="sim", prompt=BIG))
    assert error.startswith(f"Request body exceeds the gateway limit of {LIMIT} bytes.")


def test_ollama_client_reads_an_overloaded_gateway(gateway: ServerThread) -> None:
    client = _ollama(gateway)
    with _held(gateway.url + "/api/chat", {"model": "sim", "messages": HELLO}):
        error = _ollama_raises(
            503, lambda: list(client.chat(model="sim", messages=HELLO, stream=True))
        )
    assert error.startswith("Too many concurrent streams; retry shortly. (overloaded)")


# --------------------------------------------------------------------------- Gemini


def _genai(gw: ServerThread, key: str = KEY) -> Any:
    options = genai_types.HttpOptions(base_url=gw.url, api_version="v1beta")
    return genai.Client(api_key=key, http_options=options)


def _genai_raises(
    gw: ServerThread, status: str, code: int, call: Callable[[Any], object], key: str = KEY
) -> Any:
    with pytest.raises(genai_errors.APIError) as raised:
        call(_genai(gw, key))
    error = raised.value
    assert (error.code, error.status) == (code, status)
    assert "request_id=" in (error.message or "")
    return error


def test_genai_reads_a_bad_key_as_unauthenticated(gateway: ServerThread) -> None:
    def call(client: Any) -> object:
        return client.models.generate_content(model=GEMINI_MODEL, contents="hi")

    error = _genai_raises(gateway, "UNAUTHENTICATED", 401, call, key="sk-wrong")
    assert isinstance(error, genai_errors.ClientError)
    assert error.message.startswith("Missing or invalid API key.")
    (info, _) = error.details["error"]["details"]
    assert info["metadata"] == {"reason": "unauthorized"}


def test_genai_reads_a_body_too_large(gateway: ServerThread) -> None:
    def call(client: Any) -> object:
        return client.models.generate_content(model=GEMINI_MODEL, contents=BIG)

    error = _genai_raises(gateway, "INVALID_ARGUMENT", 413, call)
    assert f"limit of {LIMIT} bytes" in error.message


def test_genai_reads_an_overloaded_gateway(gateway: ServerThread) -> None:
    path = f"/v1beta/models/{GEMINI_MODEL}:streamGenerateContent?alt=sse"

    def call(client: Any) -> object:
        return list(client.models.generate_content_stream(model=GEMINI_MODEL, contents="hi"))

    with _held(gateway.url + path, {"contents": [{"parts": [{"text": "hi"}]}]}):
        error = _genai_raises(gateway, "UNAVAILABLE", 503, call)
    assert isinstance(error, genai_errors.ServerError)
    assert error.message.startswith("Too many concurrent streams")


# ------------------------------------------------- an upstream that never answered


def test_an_unreachable_upstream_is_openai_shaped_on_every_route(dead_port: int) -> None:
    # The wire contract's 502 before any response header: one shape whatever the
    # route's protocol; the anthropic SDK raises on the status.
    dead = f"http://127.0.0.1:{dead_port}"  # nothing listens there
    routes = [{"name": "a", "prefix": "/anthropic", "upstream": dead, "protocol": "messages"}]
    with gateway_for("", routes=routes) as gw:
        client = anthropic.Anthropic(base_url=gw.url + "/anthropic", api_key="k", max_retries=0)
        with pytest.raises(anthropic.InternalServerError) as raised:
            client.messages.create(**_messages())
    assert raised.value.status_code == 502
    error = raised.value.body["error"]  # type: ignore[index]
    assert (error["type"], error["code"]) == ("upstream_error", "upstream_unavailable")
    assert "could not be reached" in error["message"]
