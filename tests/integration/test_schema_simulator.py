"""The simulator's structured answers (``x-sim-structured``) through a real gateway with
``schema_check = "end"``, for each protocol that carries a schema: each shape's verdict
is exact (kind and member), a valid answer passes whole, and each fault ends the stream
with ``schema_mismatch`` (``make run`` shows the same)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gateway.simulator import SHAPES, STRUCTURED_SCHEMA
from tests.conftest import ServerThread
from tests.integration.helpers import annotation

#: The schema of the simulator's scripted tool call's arguments.
WEATHER = {
    "type": "object",
    "properties": {
        "location": {"type": "string"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
        "note": {"type": "string"},
    },
    "required": ["location", "unit", "days"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Invent a person."}]

#: protocol -> (path, body asking for the structured answer, body declaring the tool)
REQUESTS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "chat": (
        "/v1/chat/completions",
        {
            "model": "m",
            "stream": True,
            "messages": MESSAGES,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": STRUCTURED_SCHEMA},
            },
        },
        {
            "model": "m",
            "stream": True,
            "messages": MESSAGES,
            "tools": [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}],
        },
    ),
    "responses": (
        "/v1/responses",
        {
            "model": "m",
            "stream": True,
            "input": "hi",
            "text": {"format": {"type": "json_schema", "name": "p", "schema": STRUCTURED_SCHEMA}},
        },
        {
            "model": "m",
            "stream": True,
            "input": "hi",
            "tools": [{"type": "function", "name": "weather", "parameters": WEATHER}],
        },
    ),
    "messages": (
        "/v1/messages",
        {
            "model": "claude",
            "max_tokens": 64,
            "stream": True,
            "messages": MESSAGES,
            "output_format": {"type": "json_schema", "schema": STRUCTURED_SCHEMA},
        },
        {
            "model": "claude",
            "max_tokens": 64,
            "stream": True,
            "messages": MESSAGES,
            "tools": [{"name": "weather", "input_schema": WEATHER}],
        },
    ),
    "gemini": (
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        {
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "generationConfig": {
                "responseMimeType": "application/json",
                "responseJsonSchema": STRUCTURED_SCHEMA,
            },
        },
        {
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "tools": [{"functionDeclarations": [{"name": "weather", "parameters": WEATHER}]}],
        },
    ),
    "ollama": (
        "/ollama/api/chat",
        {"model": "llama3", "stream": True, "messages": MESSAGES, "format": STRUCTURED_SCHEMA},
        {
            "model": "llama3",
            "stream": True,
            "messages": MESSAGES,
            "tools": [{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}],
        },
    ),
}

#: shape -> (kind, JSON Pointer of the member) of its invalid verdict
EXPECTED = {
    "wrong_type": ("answer", "/age"),
    "forbidden_member": ("answer", "/extra"),
    "enum": ("answer", "/role"),
    "missing_required": ("answer", "/"),
    "prose_first": ("answer", "/"),
    "cut_mid_object": ("answer", None),
    "tool_off_schema": ("tool", "/days"),
    "undeclared_tool": ("tool", "/"),
}


@pytest.fixture(scope="module")
def gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    base = f"http://127.0.0.1:{simulator.port}"
    routes = [
        {
            "name": name,
            "prefix": prefix,
            "upstreams": [{"name": "sim", "url": base + upstream}],
            "schema_check": "end",
        }
        for name, prefix, upstream in (
            ("openai", "/v1", "/v1"),
            ("gemini", "/v1beta", "/v1beta"),
            ("ollama", "/ollama", ""),
        )
    ]
    return {"routes": routes}


@pytest.mark.parametrize("protocol", list(REQUESTS))
def test_every_shape_gets_its_verdict(gateway: ServerThread, protocol: str) -> None:
    path, answer_body, tool_body = REQUESTS[protocol]
    url = f"http://127.0.0.1:{gateway.port}{path}"
    with httpx.Client(timeout=30) as client:
        for shape in SHAPES:
            body = tool_body if shape in ("tool_off_schema", "undeclared_tool") else answer_body
            response = client.post(url, json=body, headers={"x-sim-structured": shape})
            assert response.status_code == 200, (shape, response.text[:200])
            content = response.content
            if shape == "valid":
                assert b"schema_mismatch" not in content, (protocol, content[-300:])
                if protocol in ("chat", "responses", "messages"):
                    assert annotation(content)["schema"] == "valid"
                continue
            assert b"schema_mismatch" in content, (protocol, shape, content[-300:])
            if protocol in ("chat", "responses", "messages"):
                note = annotation(content)
                kind, pointer = EXPECTED[shape]
                assert (note["reason"], note["schema"], note["schema_kind"]) == (
                    "schema_mismatch",
                    "invalid",
                    kind,
                ), (protocol, shape)
                if pointer is not None:
                    assert note["schema_at"] == pointer, (protocol, shape)


def test_the_simulator_refuses_an_unknown_shape(simulator: ServerThread) -> None:
    response = httpx.post(
        f"http://127.0.0.1:{simulator.port}/v1/chat/completions",
        json=REQUESTS["chat"][1],
        headers={"x-sim-structured": "sideways"},
    )
    assert response.status_code == 400
    assert "sideways" in json.dumps(response.json())
