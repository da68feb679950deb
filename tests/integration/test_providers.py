"""Responses, legacy Completions and Anthropic Messages through a real gateway, real SDKs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests import web
from tests.conftest import ServerThread
from tests.integration.control import settled_metrics
from tests.integration.helpers import annotation, assert_whole_events, gateway_for, metric_value
from tests.sdk import anthropic, openai


@pytest.fixture(scope="module")
def gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    # deadlines that no stream of these tests comes near, even on a loaded machine
    return {
        "upstream_url": simulator.url + "/v1",
        "timeouts": {"first_byte": 30.0, "idle": 30.0, "total": 60.0},
    }


@pytest.fixture(scope="module")
def strict_gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    # a short idle deadline for the stall test (the stall lasts an hour)
    return {
        "upstream_url": simulator.url + "/v1",
        "timeouts": {"first_byte": 30.0, "idle": 1.0, "total": 60.0},
    }


def _oa(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0)


def _an(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key="k", max_retries=0)


# ---------------------------------------------------------------- Responses API


def _responses_text(client: openai.OpenAI, fault: str = "none") -> str:
    stream = client.responses.create(
        model="sim-1", input="hi", stream=True, extra_headers={"x-sim-fault": fault}
    )
    parts: list[str] = []
    for event in stream:
        if event.type == "response.output_text.delta":
            parts.append(event.delta)
        elif event.type == "error":
            raise openai.APIError(event.message, request=None, body=None)  # type: ignore[arg-type]
    return "".join(parts)


def test_responses_complete_stream(gateway: ServerThread, simulator: ServerThread) -> None:
    expected = _responses_text(_oa(simulator.url))
    assert expected
    assert _responses_text(_oa(gateway.url)) == expected


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("drop_before_done", "missing_done"),
        ("drop_mid_event", "missing_done"),
        ("invalid_json", "invalid_json"),
        ("abort_mid_body", "upstream_disconnect"),
        ("stall_mid_stream", "idle_timeout"),
    ],
)
def test_responses_truncated_streams_raise(
    gateway: ServerThread, strict_gateway: ServerThread, fault: str, reason: str
) -> None:
    via = strict_gateway if reason == "idle_timeout" else gateway
    with pytest.raises(openai.APIError) as caught:
        _responses_text(_oa(via.url), fault)
    # the SDK raised on our event itself (its body is the nested error object)
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == reason
    assert caught.value.code == reason
    body = web.post(
        via.url + "/v1/responses",
        json={"model": "sim-1", "input": "hi", "stream": True},
        headers={"x-sim-fault": fault},
        timeout=10,
    ).content
    assert_whole_events(body)
    assert annotation(body)["reason"] == reason
    error_block = body[: body.rindex(b": gateway")].rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    lines = error_block.split(b"\n")
    assert lines[0] == b"event: error"
    payload = json.loads(lines[1][6:])
    assert payload["type"] == "error"
    assert payload["code"] == reason
    assert payload["param"] is None
    assert isinstance(payload["sequence_number"], int)
    assert payload["error"]["type"] == "stream_incomplete"


def test_responses_upstream_failure_is_forwarded_as_is(gateway: ServerThread) -> None:
    stream = _oa(gateway.url).responses.create(
        model="sim-1", input="hi", stream=True, extra_headers={"x-sim-fault": "error_event"}
    )
    kinds = [event.type for event in stream]
    assert kinds[-1] in ("response.failed", "error")
    body = web.post(
        gateway.url + "/v1/responses",
        json={"model": "sim-1", "input": "hi", "stream": True},
        headers={"x-sim-fault": "error_event"},
        timeout=10,
    ).content
    assert annotation(body)["reason"] == "upstream_error"
    assert b"stream_incomplete" not in body  # no second error after the upstream's own


# ---------------------------------------------------------------- legacy Completions


def _completions_text(client: openai.OpenAI, fault: str = "none") -> str:
    stream = client.completions.create(
        model="sim-1", prompt="hi", stream=True, extra_headers={"x-sim-fault": fault}
    )
    return "".join(choice.text for chunk in stream for choice in chunk.choices)


def test_completions_complete_stream(gateway: ServerThread, simulator: ServerThread) -> None:
    expected = _completions_text(_oa(simulator.url))
    assert expected
    assert _completions_text(_oa(gateway.url)) == expected


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("drop_before_done", "missing_done"),
        ("done_without_finish", "missing_finish"),
        ("invalid_json", "invalid_json"),
        ("content_after_finish", "content_after_finish"),
    ],
)
def test_completions_truncated_streams_raise(
    gateway: ServerThread, fault: str, reason: str
) -> None:
    with pytest.raises(openai.APIError) as caught:
        _completions_text(_oa(gateway.url), fault)
    assert caught.value.code == reason


# ---------------------------------------------------------------- Anthropic Messages


def _messages_text(client: anthropic.Anthropic, fault: str = "none") -> str:
    stream = client.messages.create(
        model="claude-sim",
        max_tokens=1024,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        extra_headers={"x-sim-fault": fault},
    )
    parts: list[str] = []
    for event in stream:
        if event.type == "content_block_delta" and event.delta.type == "text_delta":
            parts.append(event.delta.text)
    return "".join(parts)


def test_messages_complete_stream(gateway: ServerThread, simulator: ServerThread) -> None:
    expected = _messages_text(_an(simulator.url))
    assert expected
    assert _messages_text(_an(gateway.url)) == expected
    with _an(gateway.url).messages.stream(
        model="claude-sim", max_tokens=1024, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        assert stream.get_final_text() == expected


def _assert_anthropic_reason(error: anthropic.APIError, reason: str) -> None:
    """The raised error exposes the reason: in its body, and as ``error_code`` in the
    SDK versions that read ``error.details.error_code`` (anthropic-python 2.x)."""
    assert isinstance(error.body, dict)
    assert error.body["error"]["details"]["error_code"] == reason
    assert error.body["error"]["type"] == "api_error"
    if hasattr(error, "error_code"):
        assert error.error_code == reason


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("drop_before_done", "missing_done"),
        ("drop_mid_event", "missing_done"),
        ("invalid_json", "invalid_json"),
        ("invalid_tool_arguments", "invalid_tool_arguments"),
        ("abort_mid_body", "upstream_disconnect"),
    ],
)
def test_messages_truncated_streams_raise(gateway: ServerThread, fault: str, reason: str) -> None:
    with pytest.raises(anthropic.APIError) as raw:
        _messages_text(_an(gateway.url), fault)
    _assert_anthropic_reason(raw.value, reason)
    with (
        pytest.raises(anthropic.APIError) as helper,
        _an(gateway.url).messages.stream(
            model="claude-sim",
            max_tokens=1024,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-sim-fault": fault},
        ) as stream,
    ):
        stream.get_final_text()
    _assert_anthropic_reason(helper.value, reason)
    body = web.post(
        gateway.url + "/v1/messages",
        json={"model": "claude-sim", "max_tokens": 10, "messages": [], "stream": True},
        headers={"x-sim-fault": fault},
        timeout=10,
    ).content
    assert_whole_events(body)
    assert annotation(body)["reason"] == reason
    assert b'event: error\ndata: {"type":"error","error":{"type":"api_error"' in body


def test_messages_upstream_error_event_raises(gateway: ServerThread) -> None:
    with pytest.raises(anthropic.APIError):
        _messages_text(_an(gateway.url), "error_event")


# ---------------------------------------------------------------- usage injection


def test_usage_injection_both_ways(simulator: ServerThread) -> None:
    with gateway_for(
        simulator.url + "/v1",
        routes=[
            {
                "name": "inject",
                "prefix": "/v1",
                "upstream": simulator.url + "/v1",
                "inject_include_usage": True,
            }
        ],
    ) as gw:
        client = _oa(gw.url)
        # 1. a client that did not ask for usage: none reaches it, but it is counted
        chunks = list(
            client.chat.completions.create(
                model="sim-1",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                extra_headers={"x-request-id": "inj-1", "x-sim-tokens": "10"},
            )
        )
        assert all(chunk.usage is None for chunk in chunks)
        assert all(chunk.choices for chunk in chunks)
        sent = web.get(f"{simulator.url}/_sim/requests/inj-1").json()["body"]
        assert sent["stream_options"] == {"include_usage": True}
        # 2. a client that asked gets it unchanged
        asked = list(
            client.chat.completions.create(
                model="sim-1",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
                extra_headers={"x-sim-tokens": "10"},
            )
        )
        usage = [chunk.usage for chunk in asked if chunk.usage is not None]
        assert len(usage) == 1
        metrics = settled_metrics(gw.url, requests=2)
        assert metric_value(metrics, "gateway_usage_unknown_total") == 0
        assert metric_value(metrics, "gateway_tokens_total", type="input") == 2 * (
            usage[0].prompt_tokens
        )
        assert metric_value(metrics, "gateway_tokens_total", type="output") == 2 * (
            usage[0].completion_tokens
        )
