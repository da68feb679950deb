"""A continued answer (``continue_after_cut``) is judged as one document across the
splice: real gateways in front of a simulator that cuts its structured answer once,
then continues it from the text the client already has."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.simulator import STRUCTURED_SCHEMA, create_simulator_app, structured_answer
from tests import web
from tests.conftest import ServerThread, running
from tests.integration.helpers import annotation, gateway_for
from tests.integration.test_rescue_streams import chat_text

BODY = {
    "model": "sim-1",
    "stream": True,
    "messages": [{"role": "user", "content": "Invent a person."}],
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": STRUCTURED_SCHEMA},
    },
}


@contextlib.contextmanager
def sim(**options: Any) -> Iterator[ServerThread]:
    with running(create_simulator_app(**options)) as server:
        yield server


def route(server: ServerThread, mode: str) -> list[dict[str, Any]]:
    upstream = {"name": "only", "url": server.url + "/v1", "continuation": "assistant_prefill"}
    return [
        {
            "name": "chat",
            "prefix": "/v1",
            "upstreams": [upstream],
            "continue_after_cut": True,
            "max_attempts": 3,
            "schema_check": mode,
        }
    ]


@pytest.mark.parametrize("mode", ["record", "end"])
@pytest.mark.parametrize("fault", ["drop_after_text", "abort_mid_body"])
def test_a_valid_answer_cut_and_continued_is_one_valid_document(mode: str, fault: str) -> None:
    with (
        sim(default_fault=fault, fault_requests=1, default_structured="valid") as upstream,
        gateway_for("", routes=route(upstream, mode)) as gw,
    ):
        response = web.post(gw.url + "/v1/chat/completions", json=BODY, timeout=30)
    assert chat_text(response.content) == structured_answer("valid")
    note = annotation(response.content)
    assert (note["outcome"], note.get("continued"), note["schema"]) == ("complete", "1", "valid")


def test_a_continued_answer_that_breaks_the_schema_after_the_splice_is_caught_there() -> None:
    with (
        sim(
            default_fault="drop_after_text", fault_requests=1, default_structured="wrong_type"
        ) as upstream,
        gateway_for("", routes=route(upstream, "record")) as gw,
    ):
        response = web.post(gw.url + "/v1/chat/completions", json=BODY, timeout=30)
    assert chat_text(response.content) == structured_answer("wrong_type")
    note = annotation(response.content)
    assert (note["outcome"], note.get("continued")) == ("complete", "1")
    assert (note["schema"], note["schema_at"]) == ("invalid", "/age")


def test_in_end_mode_a_continued_answer_ends_at_its_violating_event_past_the_splice() -> None:
    with (
        sim(
            default_fault="drop_after_text", fault_requests=1, default_structured="enum"
        ) as upstream,
        gateway_for("", routes=route(upstream, "end")) as gw,
    ):
        response = web.post(gw.url + "/v1/chat/completions", json=BODY, timeout=30)
    note = annotation(response.content)
    assert (note["outcome"], note["reason"], note.get("continued")) == (
        "incomplete",
        "schema_mismatch",
        "1",
    )
    assert (note["schema"], note["schema_at"]) == ("invalid", "/role")
    text = chat_text(response.content)
    answer = structured_answer("enum")
    assert answer.startswith(text)  # what came before the violating event, nothing of it
    assert '"root"' not in text
    assert b'"code": "schema_mismatch"' in response.content or b'"code":"schema_mismatch"' in (
        response.content
    )
