"""Rescuing streams end to end: a route for servers that never send ``[DONE]``
(``termination = "finish"``), and continuation after a cut.

Real gateways in front of simulators, driven with httpx and the real SDKs.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.simulator import expected_text
from tests.conftest import ServerThread
from tests.integration.helpers import annotation, gateway_for, metric_value
from tests.integration.test_failover import CHAT, chat_text, metrics, stream
from tests.sdk import openai

TEXT = expected_text(20)


def route(upstream: ServerThread, **keys: Any) -> list[dict[str, Any]]:
    return [{"name": "chat", "prefix": "/v1", "upstream": upstream.url + "/v1", **keys}]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_termination_finish_makes_a_clean_end_after_the_finish_complete(
    simulator: ServerThread, path: str
) -> None:
    body: dict[str, Any] = (
        CHAT if "chat" in path else {"model": "sim-1", "prompt": "hi", "stream": True}
    )
    with gateway_for("", routes=route(simulator, termination="finish")) as gw:
        response = gw_post(gw, path, body, {"x-sim-fault": "drop_before_done"})
        assert response.status_code == 200
        assert annotation(response.content)["outcome"] == "complete"
        assert annotation(response.content)["reason"] == "stop"
        assert b"[DONE]" not in response.content
        # everything else is as strict as before
        for fault, reason in [
            ("drop_after_text", "missing_done"),
            ("done_without_finish", "missing_finish"),
            ("drop_mid_event", "missing_done"),
        ]:
            cut = gw_post(gw, path, body, {"x-sim-fault": fault})
            assert annotation(cut.content)["outcome"] == "incomplete", fault
            assert annotation(cut.content)["reason"] == reason, fault
        assert metric_value(metrics(gw), "gateway_streams_total", outcome="complete") == 1
    with gateway_for("", routes=route(simulator)) as gw:
        strict = gw_post(gw, path, body, {"x-sim-fault": "drop_before_done"})
        assert annotation(strict.content)["reason"] == "missing_done"


def test_termination_finish_through_the_openai_sdk(simulator: ServerThread) -> None:
    with gateway_for("", routes=route(simulator, termination="finish")) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        chunks = client.chat.completions.create(
            **CHAT, extra_headers={"x-sim-fault": "drop_before_done"}
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TEXT
        assert chat_text(stream(gw, "plain").content) == TEXT


def gw_post(gw: ServerThread, path: str, body: Any, headers: dict[str, str]) -> Any:
    from tests import web

    return web.post(gw.url + path, json=body, headers=headers, timeout=30)
