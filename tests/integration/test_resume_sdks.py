"""With resume on, the SDKs read the original stream exactly as before; and
openai-python's ``responses.retrieve(id, stream=True, starting_after=N)`` is answered
from the log, in front of an upstream (the simulator) that keeps nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ServerThread
from tests.integration.helpers import gateway_for
from tests.sdk import anthropic, genai, genai_types, ollama, openai

SEED = {"x-sim-seed": "11", "x-sim-tokens": "30"}


def _routes(simulator: ServerThread, resume: bool) -> list[dict[str, Any]]:
    return [
        {"name": "v1", "prefix": "/v1", "upstream": simulator.url + "/v1", "resume": resume},
        {"name": "gem", "prefix": "/v1beta", "upstream": simulator.url + "/v1beta",
         "resume": resume},
        {"name": "oll", "prefix": "/api", "upstream": simulator.url + "/api",
         "protocol": "ollama", "resume": resume},
    ]  # fmt: skip


@pytest.fixture(scope="module")
def gateways(simulator: ServerThread) -> Iterator[tuple[ServerThread, ServerThread]]:
    with (
        gateway_for("", routes=_routes(simulator, True)) as on,
        gateway_for("", routes=_routes(simulator, False)) as off,
    ):
        yield on, off


def _openai(gw: ServerThread) -> list[Any]:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-x", default_headers=SEED)
    chat = client.chat.completions.create(model="sim-model", messages=[], stream=True)
    raw = client.chat.completions.with_raw_response.create(
        model="sim-model", messages=[], stream=True
    )
    texts = [c.choices[0].delta.content for c in chat if c.choices]
    responses = [e.type for e in client.responses.create(model="sim-model", input="p", stream=True)]
    return [texts, responses, "x-gateway-stream-id" in raw.headers]


def _anthropic(gw: ServerThread) -> list[Any]:
    client = anthropic.Anthropic(base_url=gw.url, api_key="sk-x", default_headers=SEED)
    with client.messages.stream(model="sim-model", max_tokens=64, messages=[]) as stream:
        return [list(stream.text_stream), stream.get_final_message().stop_reason]


def _genai(gw: ServerThread) -> list[Any]:
    options = genai_types.HttpOptions(base_url=gw.url, api_version="v1beta", headers=SEED)
    with genai.Client(api_key="fake-key", http_options=options) as client:
        chunks = client.models.generate_content_stream(model="sim-model", contents="hi")
        return [chunk.text for chunk in chunks]


def _ollama(gw: ServerThread) -> list[Any]:
    client = ollama.Client(host=gw.url, headers=SEED)
    return [p.message.content for p in client.chat(model="sim-model", messages=[], stream=True)]


@pytest.mark.parametrize("read", [_openai, _anthropic, _genai, _ollama])
def test_the_sdks_read_the_same_stream_with_resume_on(
    gateways: tuple[ServerThread, ServerThread], read: Any
) -> None:
    on, off = gateways
    with_resume, without = read(on), read(off)
    if read is _openai:
        assert with_resume.pop() is True
        assert without.pop() is False
    assert with_resume == without
    assert any(with_resume[0])


def test_responses_retrieve_with_starting_after(
    gateways: tuple[ServerThread, ServerThread],
) -> None:
    on, _ = gateways
    client = openai.OpenAI(base_url=on.url + "/v1", api_key="sk-x", default_headers=SEED)
    events = list(client.responses.create(model="sim-model", input="p", stream=True))
    response_id = events[0].response.id
    assert len(events) > 6
    for n in (0, 3, events[-2].sequence_number):
        again = list(client.responses.retrieve(response_id, stream=True, starting_after=n))
        assert [e.model_dump() for e in again] == [
            e.model_dump() for e in events if e.sequence_number > n
        ]
    # Someone else's: not answered from the log (the simulator keeps nothing: 404).
    other = openai.OpenAI(base_url=on.url + "/v1", api_key="sk-other")
    with pytest.raises(openai.APIStatusError):
        list(other.responses.retrieve(response_id, stream=True, starting_after=0))
