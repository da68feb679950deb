"""Structured outputs with the real SDKs against a real gateway (uvicorn) in front of a
scripted upstream or the simulator: on a route with ``schema_check = "end"``
openai-python, anthropic-python, google-genai and ollama-python raise at the violating
event (the events they yielded before it are
counted); in ``record`` mode the client reads the upstream's bytes unchanged and the
trailer says the verdict; a valid answer reads exactly as without the check."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from gateway.simulator import STRUCTURED_SCHEMA
from tests.conftest import ServerThread
from tests.integration.helpers import annotation, gateway_for
from tests.integration.raw_upstream import RawRequest, RawUpstream, chunk, raw_upstream, sse_head
from tests.sdk import anthropic, genai, genai_errors, genai_types, ollama, openai


class Person(BaseModel):
    name: str
    age: int


def _sse(obj: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(choice: dict[str, Any]) -> bytes:
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return _sse({**head, "choices": [choice]})


def chat(*deltas: str) -> bytes:
    events = [_chunk({"index": 0, "delta": {"role": "assistant", "content": ""}})]
    events += [_chunk({"index": 0, "delta": {"content": d}}) for d in deltas]
    events.append(_chunk({"index": 0, "delta": {}, "finish_reason": "stop"}))
    return b"".join(events) + b"data: [DONE]\n\n"


def messages_tool(*partials: str) -> bytes:
    def ev(obj: dict[str, Any]) -> bytes:
        return _sse(obj, obj["type"])

    out = [
        ev(
            {
                "type": "message_start",
                "message": {
                    "id": "m",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude",
                    "content": [],
                    "stop_reason": None,
                    "usage": {"input_tokens": 1, "output_tokens": 0},
                },
            }
        ),
        ev(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": "t", "name": "person", "input": {}},
            }
        ),
    ]
    for partial in partials:
        delta = {"type": "input_json_delta", "partial_json": partial}
        out.append(ev({"type": "content_block_delta", "index": 0, "delta": delta}))
    out.append(ev({"type": "content_block_stop", "index": 0}))
    out.append(
        ev(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use"},
                "usage": {"output_tokens": 5},
            }
        )
    )
    out.append(ev({"type": "message_stop"}))
    return b"".join(out)


@pytest.fixture
def script() -> Iterator[tuple[RawUpstream, list[bytes]]]:
    """A raw upstream answering each request with the next scripted stream."""
    bodies: list[bytes] = []

    async def respond(request: RawRequest, reader: Any, writer: asyncio.StreamWriter) -> None:
        writer.write(sse_head(b"connection: close\r\n") + chunk(bodies.pop(0)) + b"0\r\n\r\n")
        await writer.drain()

    with raw_upstream(respond) as upstream:
        yield upstream, bodies


def _routes(url: str, mode: str) -> list[dict[str, Any]]:
    return [
        {
            "name": "default",
            "prefix": "/v1",
            "upstreams": [{"name": "u", "url": url + "/v1"}],
            "schema_check": mode,
        }
    ]


def test_openai_raises_at_the_violating_event_in_end_mode(
    script: tuple[RawUpstream, list[bytes]],
) -> None:
    upstream, bodies = script
    bodies += [
        chat('{"name": "Ada", ', '"age": "old"', "}"),
        chat('{"name": "Ada", ', '"age": 36}'),
    ]
    with gateway_for("", routes=_routes(upstream.url, "end")) as server:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{server.port}/v1", api_key="k", max_retries=0
        )
        seen: list[str] = []

        def consume() -> None:
            with client.chat.completions.stream(
                model="m", messages=[{"role": "user", "content": "hi"}], response_format=Person
            ) as stream:
                seen.extend(event.type for event in stream)

        with pytest.raises(openai.APIError, match="schema_mismatch"):
            consume()
        assert seen.count("chunk") == 2  # the role chunk and the first delta: the next broke it
        with client.chat.completions.stream(
            model="m", messages=[{"role": "user", "content": "hi"}], response_format=Person
        ) as stream:
            for _ in stream:
                pass
            parsed = stream.get_final_completion().choices[0].message.parsed
        assert parsed == Person(name="Ada", age=36)


def test_record_mode_relays_the_bytes_unchanged_with_the_verdict(
    script: tuple[RawUpstream, list[bytes]],
) -> None:
    upstream, bodies = script
    answer = chat('{"name": "Ada", ', '"age": "old"}')
    bodies.append(answer)
    with gateway_for("", routes=_routes(upstream.url, "record")) as server:
        body = {
            "model": "m",
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "Person", "schema": Person.model_json_schema()},
            },
        }
        response = httpx.post(f"http://127.0.0.1:{server.port}/v1/chat/completions", json=body)
    assert response.content.startswith(answer)
    note = annotation(response.content)
    assert (note["outcome"], note["schema"], note["schema_at"], note["schema_event"]) == (
        "complete",
        "invalid",
        "/age",
        "2",
    )


def test_anthropic_raises_at_a_tool_call_off_its_schema(
    script: tuple[RawUpstream, list[bytes]],
) -> None:
    upstream, bodies = script
    bodies += [messages_tool('{"name": "Ada", ', '"age": "old"}'), messages_tool('{"name": "A"}')]
    tools: list[Any] = [
        {"name": "person", "description": "a person", "input_schema": Person.model_json_schema()}
    ]
    with gateway_for("", routes=_routes(upstream.url, "end")) as server:
        client = anthropic.Anthropic(
            base_url=f"http://127.0.0.1:{server.port}", api_key="k", max_retries=0
        )
        seen: list[str] = []

        def consume() -> None:
            with client.messages.stream(
                model="claude",
                max_tokens=64,
                messages=[{"role": "user", "content": "hi"}],
                tools=tools,
            ) as stream:
                seen.extend(event.type for event in stream)

        with pytest.raises(anthropic.APIError) as raised:
            consume()
        assert seen.count("input_json") == 1
        assert isinstance(raised.value.body, dict)
        assert raised.value.body["error"]["details"]["error_code"] == "schema_mismatch"
        # a required member missing shows only at the call's close: raised there
        seen.clear()
        with pytest.raises(anthropic.APIError, match="schema"):
            consume()
        assert seen.count("input_json") == 1


@pytest.fixture(scope="module")
def sim_gateway(simulator: ServerThread) -> Iterator[ServerThread]:
    """A gateway with ``schema_check = "end"`` in front of the simulator's Gemini and
    Ollama APIs."""
    routes = [
        {
            "name": "gemini",
            "prefix": "/v1beta",
            "upstreams": [{"name": "sim", "url": simulator.url + "/v1beta"}],
            "schema_check": "end",
        },
        {
            "name": "ollama",
            "prefix": "/api",
            "protocol": "ollama",
            "upstreams": [{"name": "sim", "url": simulator.url + "/api"}],
            "schema_check": "end",
        },
    ]
    with gateway_for("", routes=routes) as server:
        yield server


def _gemini(server: ServerThread, shape: str) -> Any:
    options = genai_types.HttpOptions(
        base_url=server.url, api_version="v1beta", headers={"x-sim-structured": shape}
    )
    return genai.Client(api_key="fake-key", http_options=options)


def test_google_genai_raises_at_the_violating_event_and_reads_a_valid_answer(
    sim_gateway: ServerThread,
) -> None:
    config = genai_types.GenerateContentConfig(
        response_mime_type="application/json", response_json_schema=STRUCTURED_SCHEMA
    )
    texts: list[str] = []

    def consume(shape: str) -> None:
        client = _gemini(sim_gateway, shape)  # held: its stream needs it open
        for piece in client.models.generate_content_stream(
            model="gemini-2.5-flash", contents="Invent a person.", config=config
        ):
            texts.append(piece.text or "")

    consume("valid")
    assert json.loads("".join(texts)) == {"name": "Ada Lovelace", "age": 36, "role": "admin"}
    texts.clear()
    with pytest.raises(genai_errors.APIError, match="schema_mismatch"):
        consume("enum")
    # the event that closes "root" (outside the enum) never reached the client
    assert '"root"' not in "".join(texts)


def test_ollama_raises_at_the_violating_event(sim_gateway: ServerThread) -> None:
    texts: list[str] = []

    def consume(shape: str) -> None:
        client = ollama.Client(host=sim_gateway.url, headers={"x-sim-structured": shape})
        for part in client.chat(
            model="sim-model",
            messages=[{"role": "user", "content": "Invent a person."}],
            format=STRUCTURED_SCHEMA,
            stream=True,
        ):
            texts.append(part.message.content or "")

    consume("valid")
    assert json.loads("".join(texts))["role"] == "admin"
    texts.clear()
    with pytest.raises(ollama.ResponseError, match="schema_mismatch"):
        consume("wrong_type")
    # a string's type shows when it closes: the delta that closes "thirty-six" is withheld
    assert '"thirty-six"' not in "".join(texts)
