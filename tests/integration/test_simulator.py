"""The built-in simulator, served by a real uvicorn on a loopback port.

The official ``openai``, ``anthropic`` (with strict response validation) and
``google-genai`` SDKs must parse every complete stream; raw httpx checks that
each fault puts exactly the promised bytes on the wire (for Gemini, with the
GeminiContract as the judge: a stream without a terminator is complete or not
only by what its events say).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from gateway.guard import GeminiContract, Reason, StreamGuard
from gateway.simulator import (
    FAULTS,
    RunningSimulator,
    create_simulator_app,
    expected_text,
    start_in_background,
    tool_arguments,
)
from gateway.simulator._script import HEARTBEAT_INTERVAL
from tests import web
from tests.sdk import anthropic, genai, genai_errors, genai_types, openai

pytestmark = pytest.mark.timeout(60)

TEXT_20 = expected_text(20)


# -- fixture: the simulator in a background thread with its own event loop ------------


@dataclass
class Sim:
    base_url: str
    loop: asyncio.AbstractEventLoop
    running: RunningSimulator
    http: httpx.Client  # one pooled client: a new one per request costs an SSL context

    def record(self, request_id: str) -> dict[str, Any]:
        response = self.http.get(f"{self.base_url}/_sim/requests/{request_id}")
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result


@pytest.fixture(scope="module")
def sim() -> Iterator[Sim]:
    started: dict[str, Any] = {}
    ready = threading.Event()

    def run() -> None:
        async def main() -> None:
            running = await start_in_background("127.0.0.1", 0)
            started["loop"] = asyncio.get_running_loop()
            started["running"] = running
            ready.set()
            await running.task

        try:
            asyncio.run(main())
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="simulator", daemon=True)
    thread.start()
    assert ready.wait(10), "the simulator did not start in time"
    assert "running" in started, "the simulator failed to start"
    running: RunningSimulator = started["running"]
    assert running.port > 0
    with web.client(timeout=10) as http:
        yield Sim(base_url=running.base_url, loop=started["loop"], running=running, http=http)
    asyncio.run_coroutine_threadsafe(running.stop(), started["loop"]).result(10)
    thread.join(10)


@pytest.fixture
def oai(sim: Sim) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(
        base_url=f"{sim.base_url}/v1",
        api_key="sk-sim",
        max_retries=0,
        _strict_response_validation=True,
    )
    yield client
    client.close()


@pytest.fixture(scope="module")
def gemini(sim: Sim) -> Iterator[genai.Client]:
    options = genai_types.HttpOptions(base_url=sim.base_url, api_version="v1beta")
    with genai.Client(api_key="sim-gemini-key", http_options=options) as client:
        yield client


@pytest.fixture
def claude(sim: Sim) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(
        base_url=sim.base_url,
        api_key="sk-ant-sim",
        max_retries=0,
        _strict_response_validation=True,
    )
    yield client
    client.close()


# -- helpers -----------------------------------------------------------------------------


def post(sim: Sim, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    sim_headers = {k.replace("_", "-"): v for k, v in headers.items()}
    return sim.http.post(f"{sim.base_url}{path}", json=body, headers=sim_headers)


def events(raw: bytes) -> list[tuple[str | None, str]]:
    """Complete events (event name, data) of an LF- or CRLF-framed body."""
    text = raw.decode("utf-8", errors="replace").replace("\r\n", "\n")
    out: list[tuple[str | None, str]] = []
    for block in text.split("\n\n")[:-1]:
        name = None
        data: list[str] = []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if data:
            out.append((name, "\n".join(data)))
    return out


def chat_chunks(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(data) for _, data in events(raw) if data != "[DONE]"]


CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
COMPLETIONS = {"model": "sim-model", "prompt": "hi", "stream": True}
RESPONSES = {"model": "sim-model", "input": "hi", "stream": True}
MESSAGES = {
    "model": "sim-claude",
    "max_tokens": 1024,
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
}
BODIES = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
    "/v1/responses": RESPONSES,
    "/v1/messages": MESSAGES,
}


# -- the official SDKs parse complete streams ----------------------------------------------


def test_openai_chat_stream(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model="sim-model",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finishes, usage = [], [], None
    for chunk in stream:
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
    assert "".join(text) == TEXT_20
    assert any(len(ch.encode()) > 1 for ch in TEXT_20)  # multibyte UTF-8 in the deltas
    assert finishes == ["stop"]
    assert usage is not None
    assert usage.completion_tokens == 20


def test_openai_chat_stream_helper_and_tools(oai: openai.OpenAI) -> None:
    with oai.chat.completions.stream(
        model="sim-model", messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.content == TEXT_20

    tools: Any = [
        {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    ]
    stream = oai.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "hi"}], tools=tools, stream=True
    )
    arguments, names, finish, pieces = [], [], None, 0
    for chunk in stream:
        choice = chunk.choices[0]
        for call in choice.delta.tool_calls or []:
            assert call.function is not None
            if call.function.name:
                names.append(call.function.name)
            if call.function.arguments:
                pieces += 1
                arguments.append(call.function.arguments)
        finish = choice.finish_reason or finish
    assert names == ["lookup"]
    assert "".join(arguments) == tool_arguments(0)
    assert json.loads("".join(arguments))
    assert pieces > 5
    assert finish == "tool_calls"


def test_openai_chat_n_and_max_tokens(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model="sim-model",
        messages=[{"role": "user", "content": "hi"}],
        n=3,
        max_tokens=7,
        stream=True,
    )
    texts: dict[int, str] = {0: "", 1: "", 2: ""}
    finishes: dict[int, str] = {}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts == {i: expected_text(7, choice=i) for i in range(3)}
    assert finishes == {0: "length", 1: "length", 2: "length"}


def test_openai_legacy_completions_stream(sim: Sim) -> None:
    # Not strict: the SDK's Completion type forbids the ``finish_reason: null`` that
    # the real API sends in every chunk but the last.
    oai = openai.OpenAI(base_url=f"{sim.base_url}/v1", api_key="sk-sim", max_retries=0)
    stream = oai.completions.create(model="sim-model", prompt="hi", stream=True)
    text, finish = [], None
    for chunk in stream:
        for choice in chunk.choices:
            text.append(choice.text)
            finish = choice.finish_reason or finish
    assert "".join(text) == TEXT_20
    assert finish == "stop"


def test_openai_responses_stream(oai: openai.OpenAI) -> None:
    stream = oai.responses.create(model="sim-model", input="hi", stream=True)
    kinds, deltas, sequence = [], [], []
    final = None
    for event in stream:
        kinds.append(event.type)
        sequence.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type == "response.completed":
            final = event.response
    assert "".join(deltas) == TEXT_20
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.completed"
    assert sequence == list(range(len(sequence)))
    assert final is not None
    assert final.output_text == TEXT_20
    assert final.usage is not None
    assert final.usage.output_tokens == 20

    with oai.responses.stream(model="sim-model", input="hi") as helper:
        response = helper.get_final_response()
    assert response.output_text == TEXT_20


def test_openai_responses_function_call(oai: openai.OpenAI) -> None:
    tools: Any = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
    with oai.responses.stream(model="sim-model", input="hi", tools=tools) as helper:
        response = helper.get_final_response()
    call = response.output[0]
    assert call.type == "function_call"
    assert call.name == "lookup"
    assert call.arguments == tool_arguments(0)


def test_anthropic_messages_stream(claude: anthropic.Anthropic) -> None:
    stream = claude.messages.create(
        model="sim-claude",
        max_tokens=1024,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
    )
    kinds, text, stop = [], [], None
    for event in stream:
        kinds.append(event.type)
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            text.append(event.delta.text)
        if event.type == "message_delta":
            stop = event.delta.stop_reason
    assert "".join(text) == TEXT_20
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert stop == "end_turn"

    with claude.messages.stream(
        model="sim-claude", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    ) as helper:
        message = helper.get_final_message()
    assert message.content[0].type == "text"
    assert message.content[0].text == expected_text(5)
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 5


def test_anthropic_tool_use_stream(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model="sim-claude",
        max_tokens=1024,
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"name": "lookup", "input_schema": {"type": "object"}}],
    ) as helper:
        message = helper.get_final_message()
    block = message.content[0]
    assert block.type == "tool_use"
    assert block.name == "lookup"
    assert block.input == json.loads(tool_arguments(0))
    assert message.stop_reason == "tool_use"


def test_non_streamed_answers(oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    chat = oai.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "hi"}]
    )
    assert chat.choices[0].message.content == TEXT_20
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 20
    legacy = oai.completions.create(model="sim-model", prompt="hi")
    assert legacy.choices[0].text == TEXT_20
    response = oai.responses.create(model="sim-model", input="hi")
    assert response.output_text == TEXT_20
    message = claude.messages.create(
        model="sim-claude", max_tokens=1024, messages=[{"role": "user", "content": "hi"}]
    )
    assert message.content[0].type == "text"
    assert message.content[0].text == TEXT_20
    # Not strict: the SDK asks for base64 and validates before it decodes.
    loose = openai.OpenAI(base_url=str(oai.base_url), api_key="sk-sim", max_retries=0)
    embeddings = loose.embeddings.create(model="sim-embed", input=["a", "b"])
    assert len(embeddings.data) == 2
    assert len(embeddings.data[0].embedding) == 8
    floats = oai.embeddings.create(model="sim-embed", input="a", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(embeddings.data[0].embedding, abs=1e-6)
    assert [model.id for model in oai.models.list()][:1] == ["sim-model"]
    assert [model.id for model in claude.models.list()][:1] == ["sim-model"]


def test_sdks_raise_on_error_events_and_status(
    oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    stream = oai.chat.completions.create(
        model="sim-model",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        extra_headers={"x-sim-fault": "error_event"},
    )
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass
    stream2 = claude.messages.create(
        model="sim-claude",
        max_tokens=10,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        extra_headers={"x-sim-fault": "error_event"},
    )
    with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
        for _ in stream2:
            pass
    with pytest.raises(openai.RateLimitError):
        oai.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-sim-fault": "status", "x-sim-status": "429"},
        )
    with pytest.raises(anthropic.InternalServerError):
        claude.messages.create(
            model="sim-claude",
            max_tokens=10,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-sim-fault": "status"},
        )


# -- faults on the wire (raw httpx) ----------------------------------------------------------


def test_drop_mid_event_ends_inside_an_event(sim: Sim) -> None:
    response = post(sim, "/v1/chat/completions", CHAT, x_sim_fault="drop_mid_event")
    assert response.status_code == 200
    raw = response.content
    assert not raw.endswith(b"\n\n")
    assert b"[DONE]" not in raw
    tail = raw[raw.rindex(b"\n\n") + 2 :]
    assert tail.startswith(b"data: {")
    assert len(tail) > 20
    assert len(chat_chunks(raw)) == 4  # the role chunk and three deltas


def test_drop_mid_utf8_ends_inside_a_character(sim: Sim) -> None:
    for path, body in BODIES.items():
        raw = post(sim, path, body, x_sim_fault="drop_mid_utf8").content
        with pytest.raises(UnicodeDecodeError):
            raw.decode()
        raw[:-1].decode()  # everything before the cut lead byte is whole


def _read_all(sim: Sim, path: str, headers: dict[str, str], into: bytearray) -> None:
    with sim.http.stream(
        "POST", f"{sim.base_url}{path}", json=BODIES[path], headers=headers
    ) as response:
        assert response.status_code == 200
        for chunk in response.iter_raw():
            into += chunk


def test_abort_mid_body_is_a_transport_error(sim: Sim) -> None:
    for path in BODIES:
        received = bytearray()
        headers = {"x-sim-fault": "abort_mid_body", "x-request-id": f"abort{len(path)}"}
        with pytest.raises(httpx.RemoteProtocolError):
            _read_all(sim, path, headers, received)
        assert events(bytes(received)), path
        record = sim.record(f"abort{len(path)}")
        assert record["aborted"] is True
        assert record["completed"] is False


def test_error_events_per_protocol(sim: Sim) -> None:
    last = {
        path: events(post(sim, path, body, x_sim_fault="error_event").content)[-1]
        for path, body in BODIES.items()
    }
    assert "error" in json.loads(last["/v1/chat/completions"][1])
    assert "error" in json.loads(last["/v1/completions"][1])
    name, data = last["/v1/responses"]
    assert name == "response.failed"
    assert json.loads(data)["response"]["status"] == "failed"
    name, data = last["/v1/messages"]
    assert name == "error"
    assert json.loads(data)["error"]["type"] == "overloaded_error"


def test_status_fault(sim: Sim) -> None:
    response = post(sim, "/v1/chat/completions", CHAT, x_sim_fault="status", x_sim_status="429")
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert response.headers["x-upstream-sim-id"].startswith("req_sim_")
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    response = post(sim, "/v1/messages", MESSAGES, x_sim_fault="status", x_sim_status="529")
    assert response.status_code == 529
    assert response.json()["error"]["type"] == "overloaded_error"
    response = post(sim, "/v1/chat/completions", CHAT, x_sim_fault="no_such_fault")
    assert response.status_code == 400


def test_finish_and_terminator_faults_chat(sim: Sim) -> None:
    def run(fault: str, **extra: str) -> tuple[list[dict[str, Any]], bytes]:
        raw = post(sim, "/v1/chat/completions", CHAT, x_sim_fault=fault, **extra).content
        return chat_chunks(raw), raw

    def finishes(chunks: list[dict[str, Any]]) -> list[tuple[int, str]]:
        return [
            (c["index"], c["finish_reason"])
            for chunk in chunks
            for c in chunk["choices"]
            if c["finish_reason"]
        ]

    chunks, raw = run("length")
    assert finishes(chunks) == [(0, "length")]
    assert raw.endswith(b"data: [DONE]\n\n")
    chunks, _ = run("content_filter")
    assert finishes(chunks) == [(0, "content_filter")]
    chunks, raw = run("drop_before_done")
    assert finishes(chunks) == [(0, "stop")]
    assert b"[DONE]" not in raw
    assert raw.endswith(b"\n\n")
    chunks, raw = run("done_without_finish")
    assert finishes(chunks) == []
    assert raw.endswith(b"data: [DONE]\n\n")
    chunks, raw = run("drop_after_text")
    assert finishes(chunks) == []
    assert b"[DONE]" not in raw
    assert len(chunks) == 4
    chunks, _ = run("choices_2")
    assert finishes(chunks) == [(1, "stop"), (0, "stop")]
    assert all(len(chunk["choices"]) == 1 for chunk in chunks)
    chunks, _ = run("content_after_finish")
    seen_finish = False
    after = []
    for chunk in chunks:
        choice = chunk["choices"][0]
        if seen_finish and choice["delta"].get("content"):
            after.append(choice["delta"]["content"])
        seen_finish = seen_finish or bool(choice["finish_reason"])
    assert after == ["after finish "]
    chunks, _ = run("invalid_tool_arguments")
    args = "".join(
        call["function"].get("arguments", "")
        for chunk in chunks
        for call in chunk["choices"][0]["delta"].get("tool_calls") or []
    )
    with pytest.raises(json.JSONDecodeError):
        json.loads(args)
    assert finishes(chunks) == [(0, "tool_calls")]


def test_invalid_events_then_the_stream_goes_on(sim: Sim) -> None:
    raw = post(sim, "/v1/chat/completions", CHAT, x_sim_fault="invalid_json").content
    datas = [data for _, data in events(raw)]
    bad = [data for data in datas if data != "[DONE]" and not _is_json(data)]
    assert len(bad) == 1
    assert datas[-1] == "[DONE]"
    raw = post(sim, "/v1/chat/completions", CHAT, x_sim_fault="invalid_shape").content
    shapes = [type(chunk["choices"]).__name__ for chunk in chat_chunks(raw)]
    assert shapes.count("dict") == 1
    assert raw.endswith(b"data: [DONE]\n\n")
    for path in ("/v1/responses", "/v1/messages"):
        raw = post(sim, path, BODIES[path], x_sim_fault="invalid_json").content
        assert sum(not _is_json(data) for _, data in events(raw)) == 1


def _is_json(data: str) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def test_heartbeats_huge_event_crlf_and_pacing(sim: Sim) -> None:
    started = time.monotonic()
    raw = post(
        sim, "/v1/messages", MESSAGES, x_sim_fault="heartbeats_forever", x_sim_stall_seconds="0.35"
    ).content
    # the stall knob bounds the heartbeats: one per interval for 0.35 s, then the end
    assert time.monotonic() - started >= 0.3  # a lower bound only: load can only add
    assert raw.count(b": ping\n\n") == math.ceil(0.35 / HEARTBEAT_INTERVAL)
    assert b"message_stop" not in raw

    raw = post(
        sim, "/v1/chat/completions", CHAT, x_sim_fault="huge_event", x_sim_chunk_bytes="300000"
    ).content
    sizes = sorted(len(data) for _, data in events(raw))
    assert sizes[-1] > 300_000 > sizes[-2]
    assert raw.endswith(b"data: [DONE]\n\n")

    raw = post(sim, "/v1/responses", RESPONSES, x_sim_crlf="1", x_sim_tokens="3").content
    assert raw.count(b"\r\n") == 3 * raw.count(b"\r\n\r\n")
    assert b"\n" not in raw.replace(b"\r\n", b"")
    assert events(raw)[-1][0] == "response.completed"

    started = time.monotonic()
    raw = post(sim, "/v1/chat/completions", CHAT, x_sim_tokens="6", x_sim_tps="40").content
    assert time.monotonic() - started >= 5 / 40 * 0.9
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chat_chunks(raw))
    assert text == expected_text(6)

    body = dict(CHAT, sim={"tokens": 3, "chunk_bytes": 1000, "seed": 9})
    raw = post(sim, "/v1/chat/completions", body).content
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chat_chunks(raw))
    assert text == expected_text(3, seed=9, chunk_bytes=1000)
    assert len(text) > 2900


@pytest.mark.parametrize("path", list(BODIES))
def test_random_partition_gives_identical_bytes(sim: Sim, path: str) -> None:
    body = BODIES[path]
    for crlf in ("0", "1"):
        plain = post(sim, path, body, x_sim_seed="7", x_sim_crlf=crlf).content
        chunks = []
        with sim.http.stream(
            "POST",
            f"{sim.base_url}{path}",
            json=body,
            headers={"x-sim-seed": "7", "x-sim-crlf": crlf, "x-sim-partition": "random"},
        ) as response:
            chunks = list(response.iter_raw())
        assert b"".join(chunks) == plain
        assert plain != post(sim, path, body, x_sim_seed="8", x_sim_crlf=crlf).content


TERMINATORS = {"[DONE]", "response.completed", "response.incomplete", "message_stop"}
UNTERMINATED = {
    "drop_before_done",
    "drop_after_text",
    "drop_mid_event",
    "drop_mid_utf8",
    "error_event",
    "heartbeats_forever",
}
BROKEN_JSON_BODY = {
    "invalid_json",
    "drop_before_done",
    "drop_after_text",
    "drop_mid_event",
    "drop_mid_utf8",
}


@pytest.mark.parametrize("path", list(BODIES))
def test_every_fault_streamed_and_not(sim: Sim, path: str) -> None:
    """Every fault renders on every protocol; the stream ends with its terminator or not."""
    for fault in FAULTS:
        headers = {"x-sim-fault": fault, "x-sim-tokens": "6", "x-sim-stall-seconds": "0.05"}
        if fault == "huge_event":
            headers["x-sim-chunk-bytes"] = "2000"
        for stream in (True, False):
            url = f"{sim.base_url}{path}"
            body = dict(BODIES[path], stream=stream)
            if fault == "abort_mid_body":
                with pytest.raises(httpx.RemoteProtocolError):
                    sim.http.post(url, json=body, headers=headers)
                continue
            response = sim.http.post(url, json=body, headers=headers)
            if fault == "status":
                assert response.status_code == 500
                assert "error" in response.json()
                continue
            assert response.status_code == 200, (fault, stream)
            if stream:
                found = events(response.content)
                last = found[-1][0] if found[-1][0] in TERMINATORS else found[-1][1]
                assert (last in TERMINATORS) == (fault not in UNTERMINATED), (fault, last)
            else:
                assert _is_json(response.text) == (fault not in BROKEN_JSON_BODY), fault


def test_app_serves_from_several_event_loops() -> None:
    """The ASGI app holds no loop-bound state (TestClient runs each request in a new loop)."""
    client = TestClient(create_simulator_app(default_tokens=3))
    for _ in range(3):
        response = client.post("/v1/chat/completions", json=CHAT, headers={"x-sim-seed": "1"})
        assert response.status_code == 200
        assert response.content.endswith(b"data: [DONE]\n\n")


# -- Gemini (streamGenerateContent?alt=sse, generateContent) ----------------------------------

GEMINI_STREAM = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
GEMINI_UNARY = "/v1beta/models/gemini-2.5-flash:generateContent"
GEMINI_BODY: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}

#: What the GeminiContract makes of each fault's stream. Gemini has no terminator, so
#: drop_before_done drops the finishing events and done_without_finish ends with a
#: usage report instead: both are a stream that ended before its finish (missing_done).
GEMINI_VERDICTS = {
    "none": Reason.STOP,
    "length": Reason.LENGTH,
    "content_filter": Reason.CONTENT_FILTER,
    "tool_calls": Reason.TOOL_CALLS,
    "choices_2": Reason.STOP,
    "drop_before_done": Reason.MISSING_DONE,
    "drop_after_text": Reason.MISSING_DONE,
    "drop_mid_event": Reason.MISSING_DONE,
    "drop_mid_utf8": Reason.MISSING_DONE,
    "done_without_finish": Reason.MISSING_DONE,
    "error_event": Reason.UPSTREAM_ERROR,
    "invalid_json": Reason.INVALID_JSON,
    "invalid_shape": Reason.INVALID_SHAPE,
    "content_after_finish": Reason.CONTENT_AFTER_FINISH,
    "invalid_tool_arguments": Reason.INVALID_TOOL_ARGUMENTS,
    "stall_before_headers": Reason.STOP,
    "stall_mid_stream": Reason.STOP,
    "heartbeats_forever": Reason.MISSING_DONE,
    "huge_event": Reason.STOP,
    "done_after_cut": Reason.MISSING_DONE,  # no terminator: a clean end after a few deltas
}


def gemini_verdict(body: bytes) -> Reason:
    guard = StreamGuard(GeminiContract())
    guard.feed(body)
    return guard.verdict.reason if guard.verdict is not None else guard.eof().reason


def gemini_events(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(data) for _, data in events(raw)]


def test_gemini_stream_with_the_sdk(gemini: genai.Client) -> None:
    chunks = list(gemini.models.generate_content_stream(model="gemini-2.5-flash", contents="hi"))
    assert "".join(chunk.text or "" for chunk in chunks) == TEXT_20
    last = chunks[-1]
    assert last.candidates is not None
    assert last.candidates[0].finish_reason == genai_types.FinishReason.STOP
    assert last.usage_metadata is not None
    assert last.usage_metadata.candidates_token_count == 20
    assert last.model_version == "gemini-2.5-flash"
    # every event but the last reports the prompt only, as the Gemini API does
    assert all(
        c.usage_metadata and c.usage_metadata.candidates_token_count is None for c in chunks[:-1]
    )


def test_gemini_answer_with_the_sdk(gemini: genai.Client) -> None:
    config = genai_types.GenerateContentConfig(max_output_tokens=5, candidate_count=2)
    response = gemini.models.generate_content(
        model="gemini-2.5-flash", contents="hi", config=config
    )
    assert response.candidates is not None
    texts = [c.content.parts[0].text for c in response.candidates if c.content and c.content.parts]
    assert texts == [expected_text(5, choice=0), expected_text(5, choice=1)]
    assert [c.finish_reason for c in response.candidates] == ["MAX_TOKENS", "MAX_TOKENS"]
    assert response.usage_metadata is not None
    assert response.usage_metadata.candidates_token_count == 10


def test_gemini_function_call_with_the_sdk(gemini: genai.Client) -> None:
    declaration = genai_types.FunctionDeclaration(name="lookup", parameters_json_schema={})
    config = genai_types.GenerateContentConfig(
        tools=[genai_types.Tool(function_declarations=[declaration])],
        automatic_function_calling=genai_types.AutomaticFunctionCallingConfig(disable=True),
    )
    chunks = list(
        gemini.models.generate_content_stream(
            model="gemini-2.5-flash", contents="hi", config=config
        )
    )
    calls = [call for chunk in chunks for call in chunk.function_calls or []]
    assert [(call.name, call.args) for call in calls] == [("lookup", json.loads(tool_arguments(0)))]
    assert chunks[-1].candidates is not None
    assert chunks[-1].candidates[0].finish_reason == "STOP"
    none = genai_types.GenerateContentConfig(
        tools=config.tools,
        tool_config=genai_types.ToolConfig(
            function_calling_config=genai_types.FunctionCallingConfig(mode="NONE")
        ),
    )
    answer = gemini.models.generate_content(model="gemini-2.5-flash", contents="hi", config=none)
    assert answer.text == TEXT_20


def test_gemini_sdk_raises_on_the_error_event_and_status(gemini: genai.Client) -> None:
    faulty = genai_types.GenerateContentConfig(
        http_options=genai_types.HttpOptions(headers={"x-sim-fault": "error_event"})
    )
    with pytest.raises(genai_errors.ServerError) as caught:
        for _ in gemini.models.generate_content_stream(
            model="gemini-2.5-flash", contents="hi", config=faulty
        ):
            pass
    assert (caught.value.code, caught.value.status) == (503, "UNAVAILABLE")
    limited = genai_types.GenerateContentConfig(
        http_options=genai_types.HttpOptions(
            headers={"x-sim-fault": "status", "x-sim-status": "429"}
        )
    )
    with pytest.raises(genai_errors.ClientError) as client_error:
        gemini.models.generate_content(model="gemini-2.5-flash", contents="hi", config=limited)
    assert (client_error.value.code, client_error.value.status) == (429, "RESOURCE_EXHAUSTED")


def test_gemini_every_fault_streamed_and_not(sim: Sim) -> None:
    """Every fault renders on Gemini; the GeminiContract reads the intended verdict."""
    assert set(GEMINI_VERDICTS) | {"abort_mid_body", "status"} == set(FAULTS)
    for fault in FAULTS:
        headers = {"x-sim-fault": fault, "x-sim-tokens": "6", "x-sim-stall-seconds": "0.05"}
        if fault == "huge_event":
            headers["x-sim-chunk-bytes"] = "2000"
        for url in (GEMINI_STREAM, GEMINI_UNARY):
            if fault == "abort_mid_body":
                with pytest.raises(httpx.RemoteProtocolError):
                    post(sim, url, GEMINI_BODY, **headers)
                continue
            response = post(sim, url, GEMINI_BODY, **headers)
            if fault == "status":
                assert response.status_code == 500
                assert response.json() == {
                    "error": {
                        "code": 500,
                        "message": "Simulated upstream error (status 500).",
                        "status": "INTERNAL",
                    }
                }
                continue
            assert response.status_code == 200, (fault, url)
            if url == GEMINI_STREAM:
                assert response.headers["content-type"].startswith("text/event-stream")
                assert gemini_verdict(response.content) is GEMINI_VERDICTS[fault], fault
            else:
                assert _is_json(response.text) == (fault not in BROKEN_JSON_BODY), fault


def test_gemini_fault_shapes(sim: Sim) -> None:
    def stream(fault: str) -> bytes:
        return post(sim, GEMINI_STREAM, GEMINI_BODY, x_sim_fault=fault, x_sim_tokens="6").content

    found = gemini_events(stream("done_without_finish"))
    assert "candidates" not in found[-1]
    assert found[-1]["usageMetadata"]["candidatesTokenCount"] == 6
    assert all("finishReason" not in c for e in found[:-1] for c in e["candidates"])
    found = gemini_events(stream("drop_before_done"))
    assert [c.get("finishReason") for e in found for c in e["candidates"]] == [None] * 6
    found = gemini_events(stream("content_filter"))
    assert found[-1]["candidates"][0]["finishReason"] == "SAFETY"
    found = gemini_events(stream("error_event"))
    assert list(found[-1]) == ["error"]
    assert found[-1]["error"]["code"] == 503
    found = gemini_events(stream("invalid_tool_arguments"))
    args = found[0]["candidates"][0]["content"]["parts"][0]["functionCall"]["args"]
    assert isinstance(args, str)
    found = gemini_events(stream("choices_2"))
    finishes = [(c["index"], c.get("finishReason")) for e in found for c in e["candidates"]]
    assert [(i, f) for i, f in finishes if f] == [(1, "STOP"), (0, "STOP")]  # 1 is shorter
    raw = stream("drop_mid_utf8")
    with pytest.raises(UnicodeDecodeError):
        raw.decode()
    raw[:-1].decode()


def test_gemini_random_partition_and_crlf(sim: Sim) -> None:
    for crlf in ("0", "1"):
        base = {"x-sim-seed": "7", "x-sim-crlf": crlf}
        plain = post(sim, GEMINI_STREAM, GEMINI_BODY, **base).content
        with sim.http.stream(
            "POST",
            f"{sim.base_url}{GEMINI_STREAM}",
            json=GEMINI_BODY,
            headers=base | {"x-sim-partition": "random"},
        ) as response:
            chunks = list(response.iter_raw())
        assert b"".join(chunks) == plain
        assert gemini_verdict(plain) is Reason.STOP
    assert b"\r\n\r\n" in plain


def test_gemini_routes_need_sse_and_hide_the_key(sim: Sim) -> None:
    url = GEMINI_STREAM.split("?")[0]
    response = post(sim, url, GEMINI_BODY)
    assert response.status_code == 400
    assert response.json()["error"]["status"] == "INVALID_ARGUMENT"
    post(sim, GEMINI_UNARY, GEMINI_BODY, x_goog_api_key="AIza-secret", x_request_id="gem-1")
    record = sim.record("gem-1")
    assert record["headers"]["x-goog-api-key"]["present"] is True
    assert "AIza-secret" not in json.dumps(record)


# -- observation: records and disconnects -------------------------------------------------


def test_request_records(sim: Sim) -> None:
    response = sim.http.post(
        f"{sim.base_url}/v1/chat/completions?x=1",
        json=CHAT,
        headers={"x-request-id": "rec-1", "authorization": "Bearer sk-secret"},
    )
    record = sim.record("rec-1")
    assert record["completed"] is True
    assert record["disconnected"] is False
    assert record["bytes_sent"] == len(response.content)
    assert record["path"] == "/v1/chat/completions"
    assert record["query"] == "x=1"
    assert record["body"] == CHAT
    assert record["headers"]["authorization"]["present"] is True
    assert "sk-secret" not in json.dumps(record)
    assert record["ended"] >= record["started"]
    assert sim.http.get(f"{sim.base_url}/_sim/requests/nope").status_code == 404
    listing = sim.http.get(f"{sim.base_url}/_sim/requests?limit=1").json()
    assert [item["request_id"] for item in listing["data"]] == ["rec-1"]


def test_disconnect_during_stall_is_recorded(sim: Sim) -> None:
    # The stalls last an hour (the default): only the client leaving can end these
    # requests, so a record that ended after the client began to leave, while the
    # stall still had most of an hour to run, ended because the client left.
    with (
        web.client(timeout=10) as client,
        client.stream(
            "POST",
            f"{sim.base_url}/v1/chat/completions",
            json=CHAT,
            headers={"x-sim-fault": "stall_mid_stream", "x-request-id": "stall-1"},
        ) as response,
    ):
        received = b""
        for chunk in response.iter_raw():
            received += chunk
            if received.count(b"\n\n") >= 4:
                # leaving starts with the break: it ends the iterator, which closes
                # the connection (the body was not read to its end)
                leaving = time.monotonic()
                break
        else:
            pytest.fail("the stream ended instead of stalling")
    record = _wait_for(sim, "stall-1", lambda r: r["disconnected"])
    assert record["ended"] is not None
    assert record["ended"] >= leaving
    assert record["completed"] is False

    leaving = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        web.post(
            f"{sim.base_url}/v1/messages",
            json=MESSAGES,
            headers={"x-sim-fault": "stall_before_headers", "x-request-id": "stall-2"},
            timeout=0.3,
        )
    record = _wait_for(sim, "stall-2", lambda r: r["disconnected"])
    assert record["ended"] >= leaving
    assert record["status"] is None


def _wait_for(sim: Sim, request_id: str, ready: Any) -> dict[str, Any]:
    """The request's record, once ``ready(record)`` holds (bounded: 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        record = sim.record(request_id)
        if ready(record) or time.monotonic() > deadline:
            assert ready(record), record
            return record
        time.sleep(0.02)


def test_the_app_maker_takes_and_shows_the_simulators_options() -> None:
    import inspect

    from gateway.simulator import create_simulator_app

    shown = inspect.signature(create_simulator_app).parameters
    assert {"store", "default_tps", "default_fault", "default_structured"} <= set(shown)
    with pytest.raises(TypeError, match="default_tpz"):
        create_simulator_app(default_tpz=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="unknown fault"):
        create_simulator_app(default_fault="vibes")
