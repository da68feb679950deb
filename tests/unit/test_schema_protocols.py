"""Each protocol's spec says where its requests carry schemas and its events carry the
answer's text and tool calls (gateway.protocols.*_structured): read through the spec,
a stream of each protocol judged by the check gives the verdict at the right event."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.guard import Event
from gateway.protocols import ContractOptions, spec_for
from gateway.schema import Kind, Result, StreamCheck

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name"],
    "additionalProperties": False,
}


def judge(protocol: str, body: dict[str, Any], events: list[Any]) -> tuple[int | None, Any]:
    """The body's schemas read by the spec, each event's parts fed in order."""
    structured = spec_for(protocol).structured
    assert structured is not None
    raw = json.dumps(body).encode()
    assert any(marker in raw for marker in structured.markers)
    check = StreamCheck(structured.schemas(body))
    first = None
    for index, event in enumerate(events):
        # an event is its JSON value, or (its type, its JSON value) where the type matters
        name, value = event if isinstance(event, tuple) else ("message", event)
        parsed = value if index % 2 else None  # the contract's parse, or none to share
        fault = check.feed(structured.parts(Event(name, json.dumps(value)), parsed), index)
        if fault is not None and first is None:
            first = index
    return first, check.verdict()


def chat(content: str | None = None, finish: str | None = None, **delta: Any) -> dict[str, Any]:
    d = dict(delta)
    if content is not None:
        d["content"] = content
    return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


CHAT_BODY = {
    "model": "m",
    "stream": True,
    "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
}


def test_chat_answer_valid_and_invalid_at_the_event() -> None:
    ok = [chat('{"name": '), chat('"a"}'), chat(finish="stop")]
    assert judge("chat", CHAT_BODY, ok)[1].result is Result.VALID
    bad = [chat('{"name": "a", '), chat('"age": "x"}'), chat(finish="stop")]
    at, verdict = judge("chat", CHAT_BODY, bad)
    assert (at, verdict.pointer, verdict.event) == (1, "/age", 1)
    missing = [chat('{"age": 1}'), chat(finish="stop")]
    at, verdict = judge("chat", CHAT_BODY, missing)
    assert (at, verdict.result) == (1, Result.INVALID)


def test_chat_chunks_with_an_empty_finish_reason_are_unfinished() -> None:
    """Some servers send ``finish_reason: ""`` on every chunk, meaning "not yet" (the
    contract reads it so): the answer is not closed at the first chunk."""
    ok = [chat('{"name": ', finish=""), chat('"a"}', finish=""), chat(finish="stop")]
    at, verdict = judge("chat", CHAT_BODY, ok)
    assert (at, verdict.result) == (None, Result.VALID), verdict


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (chat("ab"), "ab"),
        (chat("ab", finish=""), "ab"),
        (chat(""), ""),
        (chat("ab", finish="stop"), None),
        (chat("ab", role="assistant"), None),
        (chat(refusal="no"), None),
        ({"choices": [chat("a")["choices"][0], chat("b")["choices"][0]]}, None),
        ({"choices": [{"index": 1, "delta": {"content": "ab"}}]}, None),
        ({"choices": []}, None),
        ({"choices": [{"index": 0, "delta": {"content": 1}}]}, None),
    ],
)
def test_the_chat_contract_gives_the_text_of_a_lone_text_delta(
    value: dict[str, Any], text: str | None
) -> None:
    """The schema check reads a Chat chunk's text off its contract (compiled), not by a
    second walk of the chunk: the contract's word for each shape."""
    spec = spec_for("chat")
    contract = spec.new_contract(ContractOptions())
    contract.on_event(Event("message", json.dumps({"model": "m", **value})))
    assert contract.delta_text() == text


def test_chat_json_object_mode_refuses_prose_first_and_a_refusal_is_refused() -> None:
    body = {"response_format": {"type": "json_object"}}
    at, verdict = judge("chat", body, [chat("Sure! "), chat("{}"), chat(finish="stop")])
    assert (at, verdict.result) == (0, Result.INVALID)
    _, verdict = judge("chat", CHAT_BODY, [chat(refusal="No."), chat(finish="stop")])
    assert verdict.result is Result.REFUSED


def tool_delta(index: int, name: str | None, arguments: str) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    return chat(tool_calls=[{"index": index, "function": function}])


CHAT_TOOLS = {"tools": [{"type": "function", "function": {"name": "person", "parameters": PERSON}}]}


@pytest.mark.parametrize(
    ("events", "at", "words"),
    [
        ([tool_delta(0, "person", '{"name": "a'), chat(finish="tool_calls")], 1, "whole"),
        ([tool_delta(0, "person", '{"name": 1}'), chat(finish="tool_calls")], 0, "integer"),
        ([tool_delta(0, "launch", "{}"), chat(finish="tool_calls")], 0, "never declared"),
    ],
)
def test_chat_tool_calls(events: list[Any], at: int, words: str) -> None:
    first, verdict = judge("chat", CHAT_TOOLS, events)
    assert (first, verdict.kind, verdict.result) == (at, Kind.TOOL, Result.INVALID)
    assert words in verdict.detail


def test_responses_text_format_and_function_call_arguments_done() -> None:
    body = {
        "text": {"format": {"type": "json_schema", "name": "p", "schema": PERSON}},
        "tools": [{"type": "function", "name": "person", "parameters": PERSON}],
    }
    events = [
        {"type": "response.created"},
        {"type": "response.output_text.delta", "output_index": 0, "delta": '{"name": "a"}'},
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {"type": "function_call", "name": "person"},
        },
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": '{"x'},
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": '": 1}'},
        {"type": "response.function_call_arguments.done", "output_index": 1},
        {"type": "response.completed"},
    ]
    at, verdict = judge("responses", body, events)
    assert (at, verdict.kind, verdict.pointer) == (4, Kind.TOOL, "/x")


def test_messages_output_format_and_tool_use_blocks() -> None:
    body = {
        "output_format": {"type": "json_schema", "schema": PERSON},
        "tools": [{"name": "person", "input_schema": PERSON}],
    }
    events = [
        {"type": "message_start"},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "{"}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": '"name": "a"}'},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "name": "person"},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"name": "b", "age": 2.5}'},
        },
        {"type": "content_block_stop", "index": 1},
        {"type": "message_stop"},
    ]
    at, verdict = judge("messages", body, events)
    assert (at, verdict.kind, verdict.pointer) == (6, Kind.TOOL, "/age")


def test_gemini_response_schema_in_openapi_form_and_a_whole_function_call() -> None:
    body = {
        "generationConfig": {
            "responseMimeType": "application/json",
            "responseSchema": {
                "type": "OBJECT",
                "properties": {"n": {"type": "INTEGER"}},
                "required": ["n"],
            },
        },
        "tools": [{"functionDeclarations": [{"name": "person", "parameters": PERSON}]}],
    }

    def part(**p: Any) -> dict[str, Any]:
        return {"candidates": [{"content": {"parts": [p]}}]}

    end = {"candidates": [{"content": {"parts": []}, "finishReason": "STOP"}]}
    at, verdict = judge("gemini", body, [part(text='{"n": '), part(text='"1"}'), end])
    assert (at, verdict.pointer) == (1, "/n")
    call = part(functionCall={"name": "person", "args": {"name": "a", "extra": 1}})
    at, verdict = judge("gemini", body, [call, end])
    assert (at, verdict.kind, verdict.pointer) == (0, Kind.TOOL, "/extra")


def test_ollama_format_json_and_tool_calls() -> None:
    at, verdict = judge(
        "ollama",
        {"format": "json"},
        [{"message": {"content": "Here: "}}, {"message": {"content": "{}"}, "done": True}],
    )
    assert (at, verdict.result) == (0, Result.INVALID)
    body = {"format": PERSON, "tools": CHAT_TOOLS["tools"]}
    line = {
        "message": {"content": "", "tool_calls": [{"function": {"name": "x", "arguments": {}}}]}
    }
    at, verdict = judge("ollama", body, [line, {"message": {"content": ""}, "done": True}])
    assert (at, verdict.kind) == (0, Kind.TOOL)


def converse(kind: str, **obj: Any) -> tuple[str, dict[str, Any]]:
    return kind, obj


def test_bedrock_converse_output_config_and_tool_use_blocks() -> None:
    body = {
        "messages": [],
        "outputConfig": {
            "textFormat": {
                "type": "json_schema",
                "structure": {"jsonSchema": {"schema": json.dumps(PERSON), "name": "p"}},
            }
        },
        "toolConfig": {
            "tools": [{"toolSpec": {"name": "person", "inputSchema": {"json": PERSON}}}]
        },
    }

    def text(piece: str) -> tuple[str, dict[str, Any]]:
        return converse("contentBlockDelta", contentBlockIndex=0, delta={"text": piece})

    start = converse("messageStart", role="assistant")
    stop = converse("messageStop", stopReason="end_turn")
    ok = [start, text('{"name": '), text('"a"}'), converse("contentBlockStop", contentBlockIndex=0)]
    assert judge("bedrock", body, [*ok, stop])[1].result is Result.VALID
    at, verdict = judge("bedrock", body, [start, text('{"name": "a", "age": "x"}'), stop])
    assert (at, verdict.kind, verdict.pointer) == (1, Kind.ANSWER, "/age")

    def tool(index: int, name: str, arguments: str) -> list[tuple[str, dict[str, Any]]]:
        use = {"toolUseId": "t", "name": name}
        return [
            converse("contentBlockStart", contentBlockIndex=index, start={"toolUse": use}),
            converse(
                "contentBlockDelta",
                contentBlockIndex=index,
                delta={"toolUse": {"input": arguments}},
            ),
            converse("contentBlockStop", contentBlockIndex=index),
        ]

    tool_body = {"messages": [], "toolConfig": body["toolConfig"]}
    use = converse("messageStop", stopReason="tool_use")
    assert judge("bedrock", tool_body, [start, *tool(1, "person", '{"name": "a"}'), use])[
        1
    ].result is (Result.VALID)
    at, verdict = judge("bedrock", tool_body, [start, *tool(1, "person", '{"name": 1}'), use])
    assert (at, verdict.kind, verdict.pointer) == (2, Kind.TOOL, "/name")
    at, verdict = judge("bedrock", tool_body, [start, *tool(1, "launch", "{}"), use])
    assert (at, verdict.kind, verdict.tool) == (1, Kind.TOOL, "launch")


@pytest.mark.parametrize(
    ("protocol", "value", "text"),
    [
        ("responses", {"type": "response.output_text.delta", "delta": "ab"}, "ab"),
        ("responses", {"type": "response.refusal.delta", "delta": "no"}, None),
        ("responses", {"type": "response.output_text.delta", "delta": 1}, None),
        (
            "messages",
            {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "ab"}},
            "ab",
        ),
        (
            "messages",
            {
                "type": "content_block_delta",
                "delta": {"type": "input_json_delta", "partial_json": "{"},
            },
            None,
        ),
        ("messages", {"type": "message_stop"}, None),
    ],
)
def test_the_responses_and_messages_contracts_give_a_text_delta(
    protocol: str, value: dict[str, Any], text: str | None
) -> None:
    """As Chat's: the schema check reads the common event's text off the contract."""
    contract = spec_for(protocol).new_contract(ContractOptions())
    contract.on_event(Event(str(value["type"]), json.dumps(value)))
    assert contract.delta_text() == text
