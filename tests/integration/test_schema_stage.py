"""The schema stage end to end in-process: the real app, a mock upstream streaming a
structured answer, the verdict in the trailer, the access log and the metric; ``end``
mode refuses the violating event; the header and a request without a schema skip it."""

from __future__ import annotations

import json
from typing import Any

from tests.integration.helpers import annotation, metric_value
from tests.integration.test_relay_inprocess import SSE, Upstream, answer, in_process, run

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name"],
    "additionalProperties": False,
}
BODY: dict[str, Any] = {
    "model": "m",
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
    "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
}


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def stream(*deltas: str) -> bytes:
    """A Chat stream whose answer is ``deltas``, finished and terminated."""
    events = [_event({"choices": [{"index": 0, "delta": {"content": d}}]}) for d in deltas]
    events.append(_event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    return b"".join(events) + b"data: [DONE]\n\n"


def test_record_mode_keeps_the_bytes_and_says_the_verdict() -> None:
    good = stream('{"name": ', '"a"}')
    bad = stream('{"name": "a", ', '"age": "x"}')
    replies = iter([good, bad])
    upstream = Upstream(lambda r: answer(200, next(replies), **SSE))

    async def test() -> None:
        async with in_process(upstream) as client:
            ok = await client.post("/v1/chat/completions", json=BODY)
            wrong = await client.post("/v1/chat/completions", json=BODY)
            metrics = (await client.get("/metrics")).text
        assert ok.content.startswith(good)
        assert annotation(ok.content)["schema"] == "valid"
        assert wrong.content.startswith(bad)
        note = annotation(wrong.content)
        assert (note["outcome"], note["schema"], note["schema_at"], note["schema_event"]) == (
            "complete",
            "invalid",
            "/age",
            "1",
        )
        for verdict in ("valid", "invalid"):
            assert (
                metric_value(
                    metrics,
                    "gateway_schema_verdicts_total",
                    protocol="chat",
                    kind="answer",
                    verdict=verdict,
                )
                == 1
            )

    run(test)


def test_end_mode_withholds_the_violating_event_and_ends_with_schema_mismatch() -> None:
    bad = stream('{"name": "a", ', '"age": "x"}', "")
    upstream = Upstream(lambda r: answer(200, bad, **SSE))

    async def test() -> None:
        async with in_process(upstream, routes=_routes("end")) as client:
            response = await client.post("/v1/chat/completions", json=BODY)
        first = _event({"choices": [{"index": 0, "delta": {"content": '{"name": "a", '}}]})
        assert response.content.startswith(first)
        assert b'"age"' not in response.content  # the violating event is withheld
        assert b"[DONE]" not in response.content
        assert b"schema_mismatch" in response.content.split(b"\n\n")[1]  # the error event
        note = annotation(response.content)
        assert (note["outcome"], note["reason"], note["schema"]) == (
            "incomplete",
            "schema_mismatch",
            "invalid",
        )

    run(test)


def test_a_missing_required_member_ends_the_stream_at_the_finish() -> None:
    upstream = Upstream(lambda r: answer(200, stream('{"age": 1}'), **SSE))

    async def test() -> None:
        async with in_process(upstream, routes=_routes("end")) as client:
            response = await client.post("/v1/chat/completions", json=BODY)
        note = annotation(response.content)
        assert (note["reason"], note["schema_event"]) == ("schema_mismatch", "1")

    run(test)


def test_the_header_turns_it_off_and_a_request_without_a_schema_is_not_checked() -> None:
    bad = stream("Sure! ", "{}")
    upstream = Upstream(lambda r: answer(200, bad, **SSE))
    plain = {k: v for k, v in BODY.items() if k != "response_format"}

    async def test() -> None:
        async with in_process(upstream, routes=_routes("end")) as client:
            off = await client.post(
                "/v1/chat/completions", json=BODY, headers={"x-gateway-schema-check": "off"}
            )
            free = await client.post("/v1/chat/completions", json=plain)
        for response in (off, free):
            assert response.content.startswith(bad)
            note = annotation(response.content)
            assert (note["outcome"], note.get("schema")) == ("complete", None)

    run(test)


def test_an_undeclared_tool_fails_and_is_never_complete_in_end_mode() -> None:
    call = {"index": 0, "id": "c", "function": {"name": "launch", "arguments": "{}"}}
    body = stream()
    events = _event({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    upstream = Upstream(lambda r: answer(200, events + body, **SSE))
    request = {
        **{k: v for k, v in BODY.items() if k != "response_format"},
        "tools": [{"type": "function", "function": {"name": "person", "parameters": PERSON}}],
    }

    async def test() -> None:
        async with in_process(upstream, routes=_routes("end")) as client:
            response = await client.post("/v1/chat/completions", json=request)
        note = annotation(response.content)
        assert (note["reason"], note["schema_kind"], note["schema_event"]) == (
            "schema_mismatch",
            "tool",
            "0",
        )

    run(test)


def _routes(mode: str) -> list[dict[str, Any]]:
    return [
        {
            "name": "default",
            "prefix": "/v1",
            "upstreams": [{"name": "u", "url": "http://upstream.test/v1"}],
            "schema_check": mode,
        }
    ]
