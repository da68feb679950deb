"""Structured outputs on Bedrock's ConverseStream (boto3) and on the Responses API over
WebSocket (openai-python's ``responses.connect()``), through a real gateway with
``schema_check = "end"`` in front of the simulator: each fault makes the client raise
at the violating event (the events it yielded before are counted), a valid answer
reads whole, and the verdict reaches the access log and the metrics."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import EventStreamError

from gateway.protocols.sigv4 import AwsKeys
from gateway.simulator import STRUCTURED_SCHEMA, structured_answer
from tests import web
from tests.conftest import ServerThread
from tests.integration.helpers import metric_value
from tests.integration.test_schema_simulator import WEATHER
from tests.sdk import openai

pytestmark = pytest.mark.timeout(120)

MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
MESSAGES = [{"role": "user", "content": [{"text": "Invent a person."}]}]
OUTPUT = {
    "textFormat": {
        "type": "json_schema",
        "structure": {"jsonSchema": {"schema": json.dumps(STRUCTURED_SCHEMA), "name": "person"}},
    }
}
TOOLS = {"tools": [{"toolSpec": {"name": "weather", "inputSchema": {"json": WEATHER}}}]}
VERDICTS = "gateway_schema_verdicts_total"


@pytest.fixture(scope="module")
def gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    routes = [
        {
            "name": "bedrock",
            "prefix": "/bedrock",
            "upstream": simulator.url,
            "protocol": "bedrock",
            "aws": {"region": "us-east-1"},
            "schema_check": "end",
        },
        {
            "name": "openai",
            "prefix": "/v1",
            "upstream": simulator.url + "/v1",
            "schema_check": "end",
        },
    ]
    keys = AwsKeys("AKIDSIMULATOR", "simulator-secret")
    return {"routes": routes, "credentials": {"bedrock": {"bedrock": keys.packed()}}}


def bedrock(gateway: ServerThread, shape: str) -> Any:
    client = boto3.client(
        "bedrock-runtime",
        endpoint_url=gateway.url + "/bedrock",
        region_name="us-east-1",
        aws_access_key_id="AKIACLIENTOWNKEY0001",
        aws_secret_access_key="client-own-secret",
        config=Config(retries={"max_attempts": 1}, read_timeout=30),
    )

    def headers(request: Any, **kwargs: Any) -> None:
        request.headers["x-sim-structured"] = shape

    client.meta.events.register("before-send.bedrock-runtime.*", headers)
    return client


def converse(gateway: ServerThread, shape: str, **fields: Any) -> tuple[list[str], str]:
    """The event types boto3 yielded, and the text of the answer's deltas."""
    response = bedrock(gateway, shape).converse_stream(modelId=MODEL, messages=MESSAGES, **fields)
    seen: list[str] = []
    text = []
    for event in response["stream"]:
        kind = next(iter(event))
        seen.append(kind)
        if kind == "contentBlockDelta":
            text.append(event[kind]["delta"].get("text", ""))
    return seen, "".join(text)


def test_a_valid_converse_answer_reads_whole(gateway: ServerThread) -> None:
    seen, text = converse(gateway, "valid", outputConfig=OUTPUT)
    assert json.loads(text) == json.loads(structured_answer("valid"))
    assert seen[-1] == "metadata"
    page = web.get(gateway.url + "/metrics").text
    assert metric_value(page, VERDICTS, route="bedrock", kind="answer", verdict="valid") >= 1


@pytest.mark.parametrize("shape", ["wrong_type", "forbidden_member", "enum", "prose_first"])
def test_boto3_raises_at_the_violating_converse_event(gateway: ServerThread, shape: str) -> None:
    seen: list[str] = []
    response = bedrock(gateway, shape).converse_stream(
        modelId=MODEL, messages=MESSAGES, outputConfig=OUTPUT
    )
    with pytest.raises(EventStreamError, match="schema_mismatch"):
        seen.extend(next(iter(event)) for event in response["stream"])
    answer = structured_answer(shape)
    # the deltas boto3 yielded are the answer's text up to the one that broke it: a
    # prefix of the document that the push parser could still take
    assert "metadata" not in seen
    assert "messageStop" not in seen
    assert seen.count("contentBlockDelta") < len(answer)


@pytest.mark.parametrize("shape", ["tool_off_schema", "undeclared_tool"])
def test_boto3_raises_at_a_tool_use_off_its_schema(gateway: ServerThread, shape: str) -> None:
    response = bedrock(gateway, shape).converse_stream(
        modelId=MODEL, messages=MESSAGES, toolConfig=TOOLS
    )
    seen: list[str] = []
    with pytest.raises(EventStreamError, match="schema_mismatch"):
        seen.extend(next(iter(event)) for event in response["stream"])
    assert "contentBlockStop" not in seen  # a call off its schema never closes


def test_a_valid_tool_use_passes(gateway: ServerThread) -> None:
    seen, _ = converse(gateway, "valid", toolConfig=TOOLS)
    assert "contentBlockStop" in seen
    assert seen[-1] == "metadata"


# ------------------------------------------------------------ Responses over WebSocket

FORMAT = {"format": {"type": "json_schema", "name": "person", "schema": STRUCTURED_SCHEMA}}


def ws_response(gateway: ServerThread, shape: str, **fields: Any) -> tuple[list[Any], Any]:
    """The events openai-python's connect() yielded for one response, and what it raised
    (None: nothing)."""
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="k", max_retries=0)
    seen: list[Any] = []
    try:
        with client.responses.connect(extra_headers={"x-sim-structured": shape}) as connection:
            connection.response.create(model="gpt-sim", input="hi", **fields)
            for event in connection:
                seen.append(event)
                if event.type in ("response.completed", "response.incomplete", "error"):
                    break
    except Exception as exc:  # what the SDK raises is what is asserted
        return seen, exc
    return seen, None


def test_a_valid_websocket_answer_completes(gateway: ServerThread) -> None:
    seen, raised = ws_response(gateway, "valid", text=FORMAT)
    assert raised is None
    assert seen[-1].type == "response.completed"
    text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    assert json.loads(text) == json.loads(structured_answer("valid"))


@pytest.mark.parametrize("shape", ["wrong_type", "missing_required"])
def test_a_websocket_answer_off_its_schema_ends_with_the_error(
    gateway: ServerThread, shape: str
) -> None:
    seen, _ = ws_response(gateway, shape, text=FORMAT)
    assert seen[-1].type == "error"
    assert seen[-1].error.code == "schema_mismatch"
    assert not any(e.type == "response.completed" for e in seen)


def test_a_websocket_tool_call_off_its_schema_ends_with_the_error(gateway: ServerThread) -> None:
    tools = [{"type": "function", "name": "weather", "parameters": WEATHER}]
    seen, _ = ws_response(gateway, "tool_off_schema", tools=tools)
    assert seen[-1].type == "error"
    assert seen[-1].error.code == "schema_mismatch"
    assert not any(e.type == "response.function_call_arguments.done" for e in seen)
