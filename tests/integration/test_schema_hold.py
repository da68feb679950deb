"""Holding structured answers (``schema_check = "hold"``) end to end: real gateways in
front of simulators whose model breaks the schema or answers validly, read with
openai-python.

The client sees only an answer that validated, or the protocol's error: a first
upstream whose answer breaks the schema is never relayed; the next upstream's is, and
the rescue is counted (the attempt's ``schema_mismatch``, the hold's ``retried``).
The hold's bounds end the stream ``limit_exceeded`` with nothing of the answer.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.simulator import STRUCTURED_SCHEMA, create_simulator_app, structured_answer
from tests.conftest import ServerThread, running
from tests.integration.helpers import annotation, gateway_for, metric_value, wait_until
from tests.integration.test_failover import ATTEMPTS, metrics, up
from tests.sdk import openai

HOLDS = "gateway_schema_holds_total"
FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {"name": "person", "schema": STRUCTURED_SCHEMA},
}
MESSAGES: list[Any] = [{"role": "user", "content": "Invent a person."}]


@contextlib.contextmanager
def simulator(**options: Any) -> Iterator[ServerThread]:
    with running(create_simulator_app(**options)) as server:
        yield server


def route(*upstreams: dict[str, Any], **options: Any) -> list[dict[str, Any]]:
    return [
        {
            "name": "chat",
            "prefix": "/v1",
            "upstreams": list(upstreams),
            "schema_check": "hold",
            **options,
        }
    ]


def client_of(gateway: ServerThread) -> Any:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="k", max_retries=0)


def read_stream(gateway: ServerThread) -> tuple[str, list[Any], httpx.Response]:
    """The answer's text as openai-python reads it, its chunks, and the raw response."""
    stream = client_of(gateway).chat.completions.create(
        model="m", messages=MESSAGES, response_format=FORMAT, stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks, stream.response


def holds(gateway: ServerThread, result: str) -> float:
    return metric_value(metrics(gateway), HOLDS, route="chat", result=result)


def test_a_first_upstream_that_breaks_the_schema_is_never_relayed_and_the_next_answers() -> None:
    with (
        simulator(default_structured="wrong_type") as primary,
        simulator(default_structured="valid") as fallback,
    ):
        routes = route(
            up("primary", primary.url + "/v1"), up("fallback", fallback.url + "/v1", priority=1)
        )
        with gateway_for("", routes=routes) as gw:
            text, _, response = read_stream(gw)
            assert text == structured_answer("valid")  # the second's answer only
            assert json.loads(text)["age"] == 36
            assert response.headers["x-gateway-upstream"] == "fallback"
            assert len(primary.server.config.app.state.arrivals) == 1  # it was asked first
            wait_until(lambda: holds(gw, "retried") == 1, "the rescue counted")
            page = metrics(gw)
            assert metric_value(page, ATTEMPTS, upstream="primary", result="schema_mismatch") == 1
            assert metric_value(page, ATTEMPTS, upstream="fallback", result="ok") == 1
            assert metric_value(page, HOLDS, route="chat", result="released") == 1
            assert metric_value(page, HOLDS, route="chat", result="failed") == 0


def test_with_no_upstream_left_the_client_gets_only_the_error() -> None:
    with (
        simulator(default_structured="wrong_type") as only,
        gateway_for("", routes=route(up("only", only.url + "/v1"))) as gw,
    ):
        seen: list[Any] = []
        stream = client_of(gw).chat.completions.create(
            model="m", messages=MESSAGES, response_format=FORMAT, stream=True
        )
        with pytest.raises(openai.APIError, match="schema_mismatch"):
            seen.extend(stream)
        assert seen == []  # nothing of the answer that broke the schema
        wait_until(lambda: holds(gw, "failed") == 1, "the failed hold counted")
        page = metrics(gw)
        assert metric_value(page, ATTEMPTS, upstream="only", result="schema_mismatch") == 1


def test_a_valid_answer_reads_exactly_as_the_upstream_sent_it() -> None:
    body = {"model": "m", "stream": True, "messages": MESSAGES, "response_format": FORMAT}
    with simulator() as sim:
        direct = httpx.post(sim.url + "/v1/chat/completions", json=body).content
        with gateway_for("", routes=route(up("only", sim.url + "/v1"))) as gw:
            relayed = httpx.post(gw.url + "/v1/chat/completions", json=body).content
            text, _, _ = read_stream(gw)
            wait_until(lambda: holds(gw, "released") == 2, "the released holds counted")
    assert relayed.startswith(_without_ids(direct, relayed))
    note = annotation(relayed)
    assert (note["outcome"], note["schema"]) == ("complete", "valid")
    assert text == structured_answer("valid")


def _without_ids(direct: bytes, relayed: bytes) -> bytes:
    """The simulator's answer with the relayed one's ids (each answer draws its own)."""
    ids = {json.loads(line[6:])["id"] for line in direct.splitlines() if line[:7] == b"data: {"}
    relayed_ids = {
        json.loads(line[6:])["id"] for line in relayed.splitlines() if line[:7] == b"data: {"
    }
    out = direct
    for old, new in zip(sorted(ids), sorted(relayed_ids), strict=True):
        out = out.replace(old.encode(), new.encode())
    return out


@pytest.mark.parametrize(
    ("options", "headers", "result"),
    [
        ({"schema_hold_max_bytes": 1024}, {"x-sim-tps": "100"}, "over_bytes"),
        ({"schema_hold_seconds": 1}, {"x-sim-tps": "2"}, "over_time"),
    ],
)
def test_the_hold_bounds_end_the_stream_with_nothing_of_the_answer(
    options: dict[str, Any], headers: dict[str, str], result: str
) -> None:
    body = {"model": "m", "stream": True, "messages": MESSAGES, "response_format": FORMAT}
    with (
        simulator() as sim,
        gateway_for("", routes=route(up("only", sim.url + "/v1"), **options)) as gw,
    ):
        response = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers)
        wait_until(lambda: holds(gw, result) == 1, f"the hold's {result} counted")
    content = response.content
    assert b'"content"' not in content  # not one delta of the held answer
    assert b'"code": "limit_exceeded"' in content or b'"code":"limit_exceeded"' in content
    note = annotation(content)
    assert (note["outcome"], note["reason"]) == ("incomplete", "limit_exceeded")
