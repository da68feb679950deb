"""The response cache under the official SDKs: each reads a hit as it read the miss.

One gateway caches every protocol family's route in front of one simulator;
each test makes the same request twice through an SDK, checks the second was a
hit (the simulator saw one request) and that the SDK read the same answer: text,
ids, finish reason and usage as the provider reported them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.simulator import create_simulator_app
from tests.conftest import ServerThread, running
from tests.integration.helpers import gateway_for
from tests.sdk import anthropic, genai, genai_types, ollama, openai


@pytest.fixture
def setup() -> Iterator[tuple[ServerThread, ServerThread]]:
    with running(create_simulator_app()) as sim:
        routes = [
            {"name": "r", "prefix": "/v1", "upstream": f"{sim.url}/v1", "cache": True},
            {"name": "g", "prefix": "/v1beta", "upstream": f"{sim.url}/v1beta", "cache": True},
            {
                "name": "o",
                "prefix": "/api",
                "upstream": f"{sim.url}/api",
                "protocol": "ollama",
                "cache": True,
            },
        ]
        with gateway_for("", routes=routes) as gw:
            yield sim, gw


def _count(sim: ServerThread) -> int:
    return len(sim.server.config.app.state.records)


def _twice(sim: ServerThread, read: Any) -> tuple[Any, Any]:
    first, second = read(), read()
    assert _count(sim) == 1  # the second never went upstream
    return first, second


def test_openai_chat_stream(setup: tuple[ServerThread, ServerThread]) -> None:
    sim, gw = setup
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="k", max_retries=0)

    def read() -> list[Any]:
        stream = client.chat.completions.create(
            model="sim-1",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        return [chunk.model_dump() for chunk in stream]

    first, second = _twice(sim, read)
    assert first == second
    assert any(c["choices"] and c["choices"][0]["finish_reason"] == "stop" for c in second)
    assert second[-1]["usage"] is not None


def test_openai_responses_stream_and_plain(setup: tuple[ServerThread, ServerThread]) -> None:
    sim, gw = setup
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="k", max_retries=0)

    def read() -> list[Any]:
        with client.responses.stream(model="sim-1", input="hi") as stream:
            events = [event.model_dump() for event in stream]
        return events

    first, second = _twice(sim, read)
    assert first == second
    assert second[-1]["type"] == "response.completed"
    plain = [
        client.chat.completions.create(
            model="sim-1", messages=[{"role": "user", "content": "plain"}]
        ).model_dump()
        for _ in range(2)
    ]
    assert plain[0] == plain[1]
    assert _count(sim) == 2


def test_anthropic_messages_stream(setup: tuple[ServerThread, ServerThread]) -> None:
    sim, gw = setup
    client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)

    def read() -> tuple[list[Any], Any]:
        with client.messages.stream(
            model="sim-1", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            events = [event.model_dump() for event in stream]
            return events, stream.get_final_message().model_dump()

    first, second = _twice(sim, read)
    assert first == second
    assert second[1]["stop_reason"] == "end_turn"


def test_google_genai_stream(setup: tuple[ServerThread, ServerThread]) -> None:
    sim, gw = setup
    options = genai_types.HttpOptions(base_url=gw.url, api_version="v1beta")
    with genai.Client(api_key="k", http_options=options) as client:

        def read() -> list[Any]:
            chunks = client.models.generate_content_stream(model="sim-1", contents="hi")
            return [chunk.model_dump(exclude={"sdk_http_response"}) for chunk in chunks]

        first, second = _twice(sim, read)
    assert first == second
    assert "".join(c["candidates"][0]["content"]["parts"][0]["text"] for c in second)


def test_ollama_chat_stream(setup: tuple[ServerThread, ServerThread]) -> None:
    sim, gw = setup
    client = ollama.Client(host=gw.url)

    def read() -> list[Any]:
        parts = client.chat(
            model="sim-1", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        return [part.model_dump() for part in parts]

    first, second = _twice(sim, read)
    assert first == second
    assert second[-1]["done"] is True
