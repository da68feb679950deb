"""Plain JSON answers of known length are read whole first: a cut or broken one is a 502.

The upstream is a raw socket (``raw_upstream``) that announces a ``Content-Length``
and sends fewer bytes, or sends bytes that are no JSON; the clients are the real
openai and anthropic SDKs, which must raise their server error, not a JSONDecodeError.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator

import httpx
import pytest

from tests import web
from tests.conftest import ServerThread
from tests.integration.helpers import access_log_line, gateway_for
from tests.integration.raw_upstream import RawRequest, raw_upstream
from tests.sdk import anthropic, ollama, openai

ANSWER = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello " * 40},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 40, "total_tokens": 43},
    }
).encode()
MESSAGE = json.dumps(
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": "hello " * 40}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 3, "output_tokens": 40},
    }
).encode()
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _answer(body: bytes, announced: int | None = None, chunked: bool = False) -> object:
    """A responder: ``body`` with ``announced`` as Content-Length (default: its length)."""

    async def respond(
        request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
        if chunked:
            writer.write(head + b"transfer-encoding: chunked\r\n\r\n")
            writer.write(b"%x\r\n%s\r\n" % (len(body), body))  # and no last chunk: a cut
        else:
            length = len(body) if announced is None else announced
            writer.write(head + b"content-length: %d\r\n\r\n" % length + body)
        await writer.drain()

    return respond


@pytest.fixture(params=["aiohttp", "httpx"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@contextlib.contextmanager
def _gateway(respond: object, transport: str, **settings: object) -> Iterator[ServerThread]:
    with (
        raw_upstream(respond) as upstream,  # type: ignore[arg-type]
        gateway_for(
            upstream.url + "/v1", upstream_transport=transport, access_log=True, **settings
        ) as gw,
    ):
        yield gw


def test_a_whole_answer_goes_out_unchanged(transport: str) -> None:
    with _gateway(_answer(ANSWER), transport) as gw:
        response = web.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert response.status_code == 200
        assert response.content == ANSWER
        assert response.headers["content-length"] == str(len(ANSWER))
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        answer = client.chat.completions.create(**CHAT)
        assert answer.usage.completion_tokens == 40


def test_a_cut_answer_is_a_502_the_openai_sdk_raises(
    transport: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with _gateway(_answer(ANSWER[:60], announced=len(ANSWER)), transport) as gw:
        response = web.post(
            gw.url + "/v1/chat/completions", json=CHAT, headers={"x-request-id": "cut-1"}
        )
        assert response.status_code == 502
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("upstream_error", "upstream_disconnect")
        assert "cut-1" in error["message"]
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.InternalServerError) as raised:
            client.chat.completions.create(**CHAT)
        assert raised.value.status_code == 502
        assert raised.value.code == "upstream_disconnect"
    entry = access_log_line(capsys, "cut-1")
    assert (entry["status"], entry["error"]) == (502, "upstream_disconnect")


def test_an_unparseable_answer_is_a_502_with_invalid_json(
    transport: str, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = ANSWER[:-3] + b"xyz"
    with _gateway(_answer(broken), transport) as gw:
        response = web.post(
            gw.url + "/v1/chat/completions", json=CHAT, headers={"x-request-id": "bad-1"}
        )
        assert response.status_code == 502
        assert response.json()["error"]["code"] == "invalid_json"
    entry = access_log_line(capsys, "bad-1")
    assert (entry["status"], entry["error"]) == (502, "invalid_json")


def test_a_cut_messages_answer_is_a_502_in_anthropics_shape(transport: str) -> None:
    with _gateway(_answer(MESSAGE[:50], announced=len(MESSAGE)), transport) as gw:
        response = web.post(gw.url + "/v1/messages", json={**CHAT, "max_tokens": 10})
        assert response.status_code == 502
        body = response.json()
        assert body["type"] == "error"
        assert body["error"]["type"] == "api_error"
        assert body["error"]["details"]["error_code"] == "upstream_disconnect"
        client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.InternalServerError) as raised:
            client.messages.create(model="m", max_tokens=10, messages=CHAT["messages"])
        assert raised.value.status_code == 502


def test_answers_over_the_bound_or_of_unknown_length_are_relayed_as_they_come(
    transport: str,
) -> None:
    """Beyond ``max_buffered_answer_bytes`` (or chunked) the head goes out first, as before:
    a cut then breaks the connection after a 200 (documented)."""
    limits = {"max_buffered_answer_bytes": 100}
    with _gateway(_answer(ANSWER[:60], announced=len(ANSWER)), transport, limits=limits) as gw:
        _assert_200_then_cut(gw.url)
    with _gateway(_answer(ANSWER[:60], chunked=True), transport) as gw:
        _assert_200_then_cut(gw.url)


def _assert_200_then_cut(url: str) -> None:
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", url + "/v1/chat/completions", json=CHAT) as response,
    ):
        assert response.status_code == 200
        with pytest.raises(httpx.HTTPError):
            response.read()


def test_a_head_answer_announces_a_length_and_has_no_body(transport: str) -> None:
    async def head_only(
        request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n" % len(ANSWER)
        )
        await writer.drain()

    with _gateway(head_only, transport) as gw:
        response = httpx.head(gw.url + "/v1/models", timeout=30)
    assert response.status_code == 200
    assert response.headers["content-length"] == str(len(ANSWER))


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        (_answer(ANSWER[:60], announced=len(ANSWER)), "upstream_disconnect"),
        (_answer(b"{x" * 30), "invalid_json"),
    ],
    ids=["cut", "invalid-json"],
)
def test_a_broken_answer_is_retried_on_the_pool_before_anything_went_out(
    broken: object, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Nothing of a buffered answer went out: another upstream of the pool may answer it.
    with raw_upstream(broken) as bad, raw_upstream(_answer(ANSWER)) as good:  # type: ignore[arg-type]
        route = {
            "name": "pool",
            "prefix": "/v1",
            "max_attempts": 3,  # an answer the upstream broke goes to the next tier first
            "upstreams": [
                {"name": "bad", "url": bad.url + "/v1", "priority": 0},
                {"name": "good", "url": good.url + "/v1", "priority": 1},
            ],
        }
        with gateway_for("", routes=[route], access_log=True) as gw:
            response = web.post(
                gw.url + "/v1/chat/completions", json=CHAT, headers={"x-request-id": "retried"}
            )
            assert response.status_code == 200
            assert response.content == ANSWER
            alone = {**route, "upstreams": route["upstreams"][:1]}  # type: ignore[index]
        with gateway_for("", routes=[alone], access_log=True) as gw:
            response = web.post(gw.url + "/v1/chat/completions", json=CHAT)
            assert response.status_code == 502
            assert response.json()["error"]["code"] == reason
    entry = access_log_line(capsys, "retried")
    assert [a["upstream"] for a in entry["attempts"]] == ["bad", "good"]
    assert [a["result"] for a in entry["attempts"]] == ["early_eof", "ok"]
    assert entry["attempts"][0]["retry_cause"] == reason


def test_a_cut_ollama_answer_is_a_502_the_ollama_client_reads() -> None:
    # Ollama's error is a string: the ollama client keeps whatever ``error`` holds.
    whole = json.dumps({"model": "m", "message": {"role": "assistant", "content": "hi"}})
    cut = _answer(whole.encode()[:20], announced=len(whole))
    with raw_upstream(cut) as upstream:  # type: ignore[arg-type]
        route = {"name": "o", "prefix": "/api", "upstream": upstream.url + "/api"}
        with gateway_for("", routes=[{**route, "protocol": "ollama"}]) as gw:
            client = ollama.Client(host=gw.url)
            with pytest.raises(ollama.ResponseError) as raised:
                client.chat(model="m", messages=[{"role": "user", "content": "hi"}], stream=False)
    assert raised.value.status_code == 502
    assert isinstance(raised.value.error, str)
    assert "cut before its end" in raised.value.error
