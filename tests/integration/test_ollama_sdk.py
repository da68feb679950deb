"""Ollama's native API end to end: the real ``ollama`` client through a real gateway.

The gateway fronts the simulator's Ollama API with the documented route
(``prefix = "/api"``, ``protocol = "ollama"``), and ``ollama.Client`` points
at the gateway's root. A complete chat or generate stream reads cleanly and
gets nothing appended (NDJSON has no comment line); a cut one ends with one
error line on which the client raises ``ResponseError`` naming the reason;
Ollama's own error line raises with its message and gets nothing added;
``"stream": false`` and the plain endpoints (``/api/tags``) are relayed as
they are, and a whole answer is read for usage, not logged as invalid JSON.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway.simulator import expected_text
from tests import web
from tests.conftest import ServerThread
from tests.integration.helpers import access_log_line, gateway_for, metric_value
from tests.sdk import ollama

pytestmark = pytest.mark.timeout(120)

MODEL = "sim-model"
HELLO = [{"role": "user", "content": "hi"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _routes(simulator: ServerThread) -> list[dict[str, object]]:
    upstream = simulator.url + "/api"
    return [{"name": "ollama", "prefix": "/api", "upstream": upstream, "protocol": "ollama"}]


@pytest.fixture(scope="module")
def gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    return {"routes": _routes(simulator), "access_log": True}


def _client(gw: ServerThread, **headers: str) -> ollama.Client:
    return ollama.Client(host=gw.url, headers=headers)


def _streams(gw: ServerThread, **labels: str) -> float:
    text = web.get(gw.url + "/metrics").text
    return metric_value(text, "gateway_streams_total", route="ollama", **labels)


def test_a_complete_chat_and_generate_stream_read_cleanly(gateway: ServerThread) -> None:
    before = _streams(gateway, outcome="complete", reason="stop")
    client = _client(gateway)
    parts = list(client.chat(model=MODEL, messages=HELLO, stream=True))
    assert "".join(p.message.content or "" for p in parts) == expected_text(20)
    assert parts[-1].done is True
    assert parts[-1].done_reason == "stop"
    generated = list(client.generate(model=MODEL, prompt="hi", stream=True))
    assert "".join(p.response for p in generated) == expected_text(20)
    assert generated[-1].eval_count == 20
    assert _streams(gateway, outcome="complete", reason="stop") == before + 2


def test_a_complete_stream_gets_nothing_appended(gateway: ServerThread) -> None:
    raw = web.post(gateway.url + "/api/chat", json={"model": MODEL, "messages": []}, timeout=30)
    assert raw.headers["content-type"].startswith("application/x-ndjson")
    lines = raw.content.split(b"\n")
    assert lines[-1] == b""  # the body ends with the done line's LF
    last = json.loads(lines[-2])
    assert last["done"] is True
    assert "gateway" not in last


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("drop_after_text", "missing_done"),
        ("drop_mid_event", "missing_done"),
        ("drop_before_done", "missing_done"),
        ("abort_mid_body", "upstream_disconnect"),
        ("invalid_json", "invalid_json"),
        ("invalid_shape", "invalid_shape"),
        ("done_without_finish", "missing_finish"),
        ("invalid_tool_arguments", "invalid_tool_arguments"),
    ],
)
def test_a_cut_stream_raises_with_the_reason(
    gateway: ServerThread, fault: str, reason: str
) -> None:
    before = _streams(gateway, outcome="incomplete", reason=reason)
    client = _client(gateway, **{"x-sim-fault": fault, "x-request-id": f"cut-{fault}"})
    with pytest.raises(ollama.ResponseError) as caught:
        for _ in client.chat(model=MODEL, messages=HELLO, stream=True):
            pass
    message = str(caught.value)
    assert f"({reason})" in message
    assert f"request_id=cut-{fault}" in message
    assert _streams(gateway, outcome="incomplete", reason=reason) == before + 1


def test_the_cut_is_one_error_line_with_the_verdict(gateway: ServerThread) -> None:
    raw = web.post(
        gateway.url + "/api/generate",
        json={"model": MODEL, "prompt": "hi"},
        headers={"x-sim-fault": "drop_mid_event", "x-request-id": "cut-raw"},
        timeout=30,
    )
    *lines, end = raw.content.split(b"\n")
    assert end == b""
    assert all(json.loads(line)["done"] is False for line in lines[:-1])  # whole lines only
    trailer = json.loads(lines[-1])
    assert trailer["gateway"] == {
        "outcome": "incomplete",
        "reason": "missing_done",
        "request_id": "cut-raw",
    }
    assert trailer["error"].startswith("Stream incomplete: ")


def test_the_upstreams_error_line_raises_and_nothing_is_added(gateway: ServerThread) -> None:
    before = _streams(gateway, reason="upstream_error")
    client = _client(gateway, **{"x-sim-fault": "error_event"})
    with pytest.raises(ollama.ResponseError, match="server overloaded"):
        for _ in client.generate(model=MODEL, prompt="hi", stream=True):
            pass
    raw = web.post(
        gateway.url + "/api/chat",
        json={"model": MODEL, "messages": []},
        headers={"x-sim-fault": "error_event"},
        timeout=30,
    )
    last = json.loads(raw.content.rstrip(b"\n").split(b"\n")[-1])
    assert set(last) == {"error"}  # Ollama's own line is the last: no second error
    assert _streams(gateway, reason="upstream_error") == before + 2


def test_a_tool_call_is_tool_calls(gateway: ServerThread) -> None:
    before = _streams(gateway, outcome="complete", reason="tool_calls")
    client = _client(gateway)
    parts = list(
        client.chat(
            model=MODEL,
            messages=[{"role": "user", "content": "weather in Paris?"}],
            tools=[TOOL],
            stream=True,
        )
    )
    calls = [call for p in parts for call in p.message.tool_calls or []]
    assert [call.function.name for call in calls] == ["get_weather"]
    assert isinstance(calls[0].function.arguments, dict)
    assert _streams(gateway, outcome="complete", reason="tool_calls") == before + 1


def test_stream_false_is_a_plain_answer_read_for_usage(
    gateway: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    client = _client(gateway, **{"x-request-id": "ollama-plain"})
    answer = client.chat(model=MODEL, messages=HELLO, stream=False)
    assert answer.message.content == expected_text(20)
    assert answer.done is True
    line = access_log_line(capsys, "ollama-plain")
    assert line["error"] is None
    assert line["stream"] is False
    assert line["usage"]["output"] == 20


def test_a_stream_is_logged_without_error_and_plain_endpoints_pass(
    gateway: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    client = _client(gateway, **{"x-request-id": "ollama-stream"})
    for _ in client.generate(model=MODEL, prompt="hi", stream=True):
        pass
    line = access_log_line(capsys, "ollama-stream")
    assert line["error"] is None
    assert line["outcome"] == "complete"
    assert line["upstream_model"] == MODEL
    assert line["usage"]["output"] == 20
    listed = client.list()
    assert [m.model for m in listed.models] == [MODEL]


def test_serve_simulator_serves_its_ollama_api_to_a_client_of_the_gateways_root() -> None:
    with gateway_for("", simulator=True) as gw:
        client = _client(gw, **{"x-sim-tokens": "5"})
        parts = list(client.chat(model=MODEL, messages=HELLO, stream=True))
        assert "".join(p.message.content or "" for p in parts) == expected_text(5)
        cut = _client(gw, **{"x-sim-fault": "drop_after_text"})
        with pytest.raises(ollama.ResponseError, match=r"\(missing_done\)"):
            for _ in cut.generate(model=MODEL, prompt="hi", stream=True):
                pass
        streams = metric_value(
            web.get(gw.url + "/metrics").text, "gateway_streams_total", route="simulator-ollama"
        )
        assert streams == 2


def test_the_async_client_reads_a_stream_and_raises_on_a_cut(gateway: ServerThread) -> None:
    async def read(**headers: str) -> str:
        client = ollama.AsyncClient(host=gateway.url, headers=headers)
        stream = await client.chat(model=MODEL, messages=HELLO, stream=True)
        return "".join([part.message.content or "" async for part in stream])

    assert asyncio.run(read()) == expected_text(20)
    with pytest.raises(ollama.ResponseError, match=r"\(upstream_disconnect\)"):
        asyncio.run(read(**{"x-sim-fault": "abort_mid_body"}))
