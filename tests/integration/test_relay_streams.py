"""The relay end to end: real gateway and simulator on loopback, real httpx and openai clients."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests import web
from tests.conftest import ServerThread
from tests.integration.control import settled_metrics
from tests.integration.helpers import (
    annotation,
    assert_whole_events,
    gateway_for,
    metric_value,
)
from tests.integration.raw_upstream import RawRequest, raw_upstream, sse_head
from tests.integration.raw_upstream import chunk as http_chunk
from tests.sdk import openai

CHAT = {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}], "stream": True}

# fault -> the reason the gateway must report
FAULT_REASONS = {
    "drop_before_done": "missing_done",
    "drop_after_text": "missing_done",
    "drop_mid_event": "missing_done",
    "drop_mid_utf8": "missing_done",
    "done_without_finish": "missing_finish",
    "abort_mid_body": "upstream_disconnect",
    "invalid_json": "invalid_json",
    "invalid_shape": "invalid_shape",
    "content_after_finish": "content_after_finish",
    "invalid_tool_arguments": "invalid_tool_arguments",
}
COMPLETE_REASONS = {
    "none": "stop",
    "length": "length",
    "content_filter": "content_filter",
    "tool_calls": "tool_calls",
    "choices_2": "stop",
}


# Deadlines no stream of these tests comes near, even on a loaded machine: a
# verdict test must not race a deadline it is not about.
RELAXED = {"first_byte": 30.0, "idle": 30.0, "total": 60.0}
# Short deadlines for the tests of deadlines; the stalls they meet last 30 s or
# more. The simulator's heartbeats come every 0.1 s, far inside the idle
# deadline, and the total deadline is over twice the idle one: a stream of
# heartbeats ends by the total deadline only because heartbeats count as activity.
DEADLINES = {"first_byte": 30.0, "idle": 2.0, "total": 5.0}


@pytest.fixture(scope="module")
def gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    return {"upstream_url": simulator.url + "/v1", "timeouts": RELAXED}


@pytest.fixture(scope="module")
def strict_gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    return {"upstream_url": simulator.url + "/v1", "timeouts": DEADLINES}


@pytest.fixture
def sdk(gateway: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="test-key", max_retries=0)


def _stream_text(client: openai.OpenAI, **extra: object) -> str:
    stream = client.chat.completions.create(
        model="sim-1",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        **extra,  # type: ignore[arg-type]
    )
    parts = []
    for chunk in stream:
        for choice in chunk.choices:
            if choice.index == 0 and choice.delta.content:
                parts.append(choice.delta.content)
    return "".join(parts)


def test_sdk_complete_stream_gives_the_whole_text(
    sdk: openai.OpenAI, simulator: ServerThread
) -> None:
    direct = openai.OpenAI(base_url=simulator.url + "/v1", api_key="k", max_retries=0)
    expected = _stream_text(direct, extra_headers={"x-sim-tokens": "40"})
    assert len(expected) > 40
    assert _stream_text(sdk, extra_headers={"x-sim-tokens": "40"}) == expected


@pytest.mark.parametrize("fault", sorted(FAULT_REASONS))
def test_sdk_raises_on_every_fault_with_the_reason_as_code(sdk: openai.OpenAI, fault: str) -> None:
    with pytest.raises(openai.APIError) as caught:
        _stream_text(sdk, extra_headers={"x-sim-fault": fault})
    assert caught.value.code == FAULT_REASONS[fault]


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("stall_mid_stream", "idle_timeout"), ("heartbeats_forever", "total_timeout")],
)
def test_sdk_raises_on_deadlines(strict_gateway: ServerThread, fault: str, reason: str) -> None:
    sdk = openai.OpenAI(base_url=strict_gateway.url + "/v1", api_key="test-key", max_retries=0)
    with pytest.raises(openai.APIError) as caught:
        _stream_text(sdk, extra_headers={"x-sim-fault": fault, "x-sim-stall-seconds": "30"})
    assert caught.value.code == reason


def test_sdk_raises_on_upstream_error_event(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.APIError):
        _stream_text(sdk, extra_headers={"x-sim-fault": "error_event"})


@pytest.mark.parametrize("fault", [*sorted(FAULT_REASONS), "error_event", "stall_mid_stream"])
def test_raw_body_is_whole_events_then_one_annotation(
    gateway: ServerThread, strict_gateway: ServerThread, fault: str
) -> None:
    via = strict_gateway if fault == "stall_mid_stream" else gateway  # idle_timeout
    response = web.post(
        via.url + "/v1/chat/completions",
        json=CHAT,
        headers={"x-sim-fault": fault, "x-request-id": f"t-{fault}"},
        timeout=10,
    )
    body = response.content
    assert response.status_code == 200
    assert response.headers["x-request-id"] == f"t-{fault}"
    assert_whole_events(body)
    note = annotation(body)
    assert note["rid"] == f"t-{fault}"
    assert note["outcome"] == "incomplete"
    if fault == "error_event":
        assert note["reason"] == "upstream_error"
        # the upstream's own error is forwarded and no second error is added
        assert body.count(b'"error"') == 1
        assert b"stream_incomplete" not in body
    else:
        expected = FAULT_REASONS.get(fault, "idle_timeout")
        assert note["reason"] == expected
        error_line = body.rsplit(b"\n\n", 2)[-2].split(b"\n")[-1]
        assert error_line.startswith(b"data: ")
        payload = json.loads(error_line[6:])
        assert payload["error"]["code"] == expected
        assert payload["error"]["type"] == "stream_incomplete"
    assert not body.endswith(b"\n\n")
    assert b"[DONE]" not in body


@pytest.mark.parametrize("fault", sorted(COMPLETE_REASONS))
def test_complete_streams_end_with_the_upstream_terminator_and_a_comment(
    gateway: ServerThread, fault: str
) -> None:
    response = web.post(
        gateway.url + "/v1/chat/completions",
        json=CHAT,
        headers={"x-sim-fault": fault},
        timeout=10,
    )
    body = response.content
    note = annotation(body)
    assert (note["outcome"], note["reason"]) == ("complete", COMPLETE_REASONS[fault])
    assert note["rid"] == response.headers["x-request-id"]
    assert body.endswith(
        b"data: [DONE]\n\n: gateway outcome=complete reason="
        + note["reason"].encode()
        + b" request_id="
        + note["rid"].encode()
        + b"\n"
    )
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"
    assert "content-length" not in response.headers


def _strip_annotation(body: bytes) -> bytes:
    return body[: body.rindex(b": gateway outcome=")]


@pytest.mark.parametrize("crlf", ["0", "1"])
def test_random_partitions_do_not_change_what_the_client_receives(
    gateway: ServerThread, simulator: ServerThread, crlf: str
) -> None:
    for seed in range(6):
        base = {"x-sim-tokens": "60", "x-sim-crlf": crlf, "x-sim-seed": str(seed)}
        direct = web.post(simulator.url + "/v1/chat/completions", json=CHAT, headers=base).content
        body = web.post(
            gateway.url + "/v1/chat/completions",
            json=CHAT,
            headers=base | {"x-sim-partition": "random"},
            timeout=10,
        ).content
        assert annotation(body)["outcome"] == "complete"
        # the partition (inside UTF-8 characters and CRLF pairs) changes nothing
        assert _strip_annotation(body) == direct


def test_partitioned_cut_inside_utf8_is_withheld(gateway: ServerThread) -> None:
    for seed in range(4):
        body = web.post(
            gateway.url + "/v1/chat/completions",
            json=CHAT,
            headers={
                "x-sim-fault": "drop_mid_utf8",
                "x-sim-partition": "random",
                "x-sim-seed": str(seed),
            },
            timeout=10,
        ).content
        assert_whole_events(body)
        body.decode("utf-8")  # never a broken character
        assert annotation(body)["reason"] == "missing_done"


def test_two_hundred_concurrent_streams_get_the_right_verdicts(simulator: ServerThread) -> None:
    # What is proven: under 200 concurrent streams each stream gets its own verdict.
    # Deadlines are not under test; they are far beyond what the streams take, so a
    # loaded machine (client, gateway and simulator share one process) cannot turn a
    # verdict into a timeout.
    faults = ["none", "drop_before_done", "invalid_json", "length", "done_without_finish"]
    expected = {**FAULT_REASONS, **COMPLETE_REASONS}

    async def one(client: httpx.AsyncClient, i: int) -> tuple[str, int, str]:
        fault = faults[i % len(faults)]
        response = await client.post(
            "/v1/chat/completions",
            json=CHAT,
            headers={"x-sim-fault": fault, "x-sim-tokens": "20", "x-sim-tps": "100"},
        )
        return fault, response.status_code, annotation(response.content)["reason"]

    async def main(url: str) -> list[tuple[str, int, str]]:
        limits = httpx.Limits(max_connections=250)
        async with web.async_client(base_url=url, limits=limits, timeout=90) as client:
            return await asyncio.gather(*(one(client, i) for i in range(200)))

    with gateway_for(simulator.url + "/v1", timeouts=RELAXED) as gw:
        results = asyncio.run(main(gw.url))
        metrics = settled_metrics(gw.url, requests=200)
    assert len(results) == 200
    for fault, status, reason in results:
        assert (status, reason) == (200, expected[fault]), fault
    # and each verdict is counted once, under its own reason
    for fault in faults:
        counted = metric_value(metrics, "gateway_streams_total", reason=expected[fault])
        assert counted == 200 // len(faults), fault
    assert metric_value(metrics, "gateway_streams_total") == 200


def test_streams_metrics_count_each_verdict(simulator: ServerThread) -> None:
    with gateway_for(simulator.url + "/v1", timeouts=RELAXED) as gw:
        for fault in ("none", "invalid_json", "invalid_json"):
            web.post(
                gw.url + "/v1/chat/completions",
                json=CHAT,
                headers={"x-sim-fault": fault},
                timeout=10,
            )
        metrics = settled_metrics(gw.url, requests=3)
    assert metric_value(metrics, "gateway_streams_total", outcome="complete", reason="stop") == 1
    assert (
        metric_value(metrics, "gateway_streams_total", outcome="incomplete", reason="invalid_json")
        == 2
    )
    assert metric_value(metrics, "gateway_streams_total") == 3


def _responses_event(kind: str, number: int, **fields: object) -> bytes:
    payload = json.dumps({"type": kind, "sequence_number": number, **fields})
    return f"event: {kind}\ndata: {payload}\n\n".encode()


MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}


RESPONSE = {"id": "resp_1", "object": "response", "model": "gpt-x", "status": "in_progress"}


UNFINISHED_RESPONSES = b"".join(
    [
        _responses_event("response.created", 0, response=RESPONSE | {"output": []}),
        _responses_event(
            "response.output_item.added",
            1,
            output_index=0,
            item=MESSAGE | {"status": "in_progress"},
        ),
        _responses_event(
            "response.output_text.delta", 2, item_id="msg_1", output_index=0, delta="Hel"
        ),
        # no response.output_item.done: the message never finished
        _responses_event(
            "response.completed",
            3,
            response=RESPONSE
            | {"status": "completed", "output": [MESSAGE | {"status": "completed"}]},
        ),
    ]
)


async def _answer_unfinished_responses(
    request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    head = sse_head(b"connection: close\r\n")
    writer.write(head + http_chunk(UNFINISHED_RESPONSES) + b"0\r\n\r\n")
    await writer.drain()


def test_a_responses_stream_whose_item_never_got_its_done_is_missing_finish() -> None:
    with (
        raw_upstream(_answer_unfinished_responses) as upstream,
        gateway_for(upstream.url + "/v1") as gw,
    ):
        body = web.post(
            gw.url + "/v1/responses", json={"model": "gpt-x", "input": "hi", "stream": True}
        ).content
    assert annotation(body)["reason"] == "missing_finish"
    assert b"response.completed" not in body
    assert b'"code": "missing_finish"' in body or b'"code":"missing_finish"' in body
