"""Every kind of request gets its receipt: a real gateway (the memory ledger) before
real simulators. A rescued answer (its first upstream cut, a second one completing it)
lists each attempt's usage and costs their sum, each at its own upstream's prices; a
stream its client left (detached) is charged whole once its upstream ended, and its
resume has a receipt of its own; a cache hit costs nothing and says so; a refusal
the upstream refused costs nothing (refusals before any upstream:
``test_spend_budgets``)."""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Iterator
from typing import Any

import httpx

from gateway.simulator import create_simulator_app, expected_text
from tests import web
from tests.conftest import ServerThread, running
from tests.integration.helpers import gateway_for, metric_value
from tests.integration.test_failover import chat_text

KEY = "sk-receipts-kinds-0123"
AUTH = {"authorization": f"Bearer {KEY}"}
CLIENTS = [{"name": "kinds", "key_sha256": [hashlib.sha256(KEY.encode()).hexdigest()]}]
CHAT = {
    "model": "sim-1",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "stream_options": {"include_usage": True},
}


@contextlib.contextmanager
def _sim(**options: Any) -> Iterator[ServerThread]:
    with running(create_simulator_app(**options)) as server:
        yield server


def receipt(gw: ServerThread, request_id: str, ready: str = "request_id") -> dict[str, Any]:
    """The receipt of ``request_id``, polled until it is written and has ``ready`` set
    (a task writes it once the request ended)."""
    deadline = time.monotonic() + 30
    while True:
        found = web.get(f"{gw.url}/v1/gateway/receipts/{request_id}", headers=AUTH, timeout=10)
        if found.status_code == 200 and found.json().get(ready):
            return dict(found.json())
        assert time.monotonic() < deadline, (request_id, found.status_code, found.text)
        time.sleep(0.05)


def _nanos(usage: dict[str, int], input_usd: int, output_usd: int) -> int:
    """Nano-dollars of ``usage`` at whole dollars a million tokens."""
    return usage["input"] * input_usd * 1000 + usage["output"] * output_usd * 1000


def test_a_rescued_answers_receipt_lists_each_attempt_and_costs_their_sum() -> None:
    """The primary cuts the stream after some text; the fallback continues it to its
    end. Each attempt is priced at its own upstream's override: the receipt lists both
    (upstream, model, outcome, usage, cost) and its cost is their sum, as the metric's."""
    prices = [
        {"model": "*", "upstream": "primary", "input": "1", "output": "2"},
        {"model": "*", "upstream": "fallback", "input": "3", "output": "5"},
    ]
    with _sim(default_fault="drop_after_text") as primary, _sim() as fallback:
        routes = [
            {
                "name": "chat",
                "prefix": "/v1",
                "continue_after_cut": True,
                "max_attempts": 3,
                "upstreams": [
                    {"name": "primary", "url": primary.url + "/v1", "continuation": "none"},
                    {
                        "name": "fallback",
                        "url": fallback.url + "/v1",
                        "continuation": "assistant_prefill",
                        "priority": 1,
                    },
                ],
            }
        ]
        with gateway_for("", routes=routes, clients=CLIENTS, prices=prices) as gw:
            answer = web.post(
                gw.url + "/v1/chat/completions",
                json=CHAT,
                headers={**AUTH, "x-request-id": "rescued-1"},
                timeout=30,
            )
            assert answer.status_code == 200
            assert chat_text(answer.content) == expected_text(20)
            found = receipt(gw, "rescued-1")
            text = web.get(gw.url + "/metrics").text
    assert found["continued"] == 1
    parts = found["usage_by_attempt"]
    assert [(p["upstream"], p["outcome"]) for p in parts] == [
        ("primary", "missing_done"),
        ("fallback", "complete"),
    ]
    cut, rest = parts
    assert cut["evidence"] == "estimated"
    assert cut["usage"]["output"] > 0
    assert rest["evidence"] == "reported"
    assert cut["cost"]["nanos"] == _nanos(cut["usage"], 1, 2)
    assert rest["cost"]["nanos"] == _nanos(rest["usage"], 3, 5)
    assert found["cost"]["nanos"] == cut["cost"]["nanos"] + rest["cost"]["nanos"]
    assert found["cost"]["evidence"] == "partial"
    # the tokens charged to the client's limits are the same sum
    assert found["charged"]["input"] == cut["usage"]["input"] + rest["usage"]["input"]
    assert found["charged"]["output"] == cut["usage"]["output"] + rest["usage"]["output"]
    spent = metric_value(text, "gateway_spend_usd_total", client="kinds")
    assert round(spent * 10**9) == found["cost"]["nanos"]


def test_a_detached_stream_its_resume_a_cache_hit_and_a_refusal_each_get_a_receipt() -> None:
    prices = [{"model": "*", "input": "1", "output": "2"}]
    with _sim() as upstream:
        routes = [
            {
                "name": "chat",
                "prefix": "/v1",
                "upstream": upstream.url + "/v1",
                "resume": True,
                "cache": True,
            }
        ]
        with gateway_for("", routes=routes, clients=CLIENTS, prices=prices) as gw:
            # detached: the client leaves after the first bytes, the answer is read on
            headers = {**AUTH, "x-request-id": "left-1", "x-sim-tokens": "200", "x-sim-tps": "200"}
            with web.stream(
                "POST", gw.url + "/v1/chat/completions", json=CHAT, headers=headers, timeout=30
            ) as response:
                assert response.status_code == 200
                stream_id = response.headers["x-gateway-stream-id"]
                next(response.iter_raw())
            detached = receipt(gw, "left-1", ready="verdict")
            assert detached["detached"] is True
            assert detached["verdict"] == {"outcome": "complete", "reason": "stop"}
            assert detached["cost"]["evidence"] == "reported"
            assert detached["cost"]["nanos"] == _nanos(detached["usage"], 1, 2) > 0
            (only,) = detached["usage_by_attempt"]
            assert (only["upstream"], only["outcome"]) == ("chat", "complete")
            assert only["cost"] == {
                "usd": detached["cost"]["usd"],
                "nanos": detached["cost"]["nanos"],
            }
            # its resume: a receipt of its own, costing nothing (the answer is charged once)
            resumed = web.get(
                f"{gw.url}/v1/gateway/streams/{stream_id}",
                params={"starting_after": 0},
                headers={**AUTH, "x-request-id": "resume-1"},
                timeout=30,
            )
            assert resumed.status_code == 200
            again = receipt(gw, "resume-1")
            assert again["status"] == 200
            assert again["cost"]["nanos"] == 0
            # a cache hit: nothing, said so
            plain = {"model": "sim-1", "messages": [{"role": "user", "content": "cache me"}]}
            for rid in ("fill-1", "hit-1"):
                answer = web.post(
                    gw.url + "/v1/chat/completions",
                    json=plain,
                    headers={**AUTH, "x-request-id": rid},
                    timeout=30,
                )
                assert answer.status_code == 200
            filled, hit = receipt(gw, "fill-1"), receipt(gw, "hit-1")
            assert filled["cost"]["nanos"] > 0
            assert hit["cache"] == "hit"
            assert hit["cost"]["nanos"] == 0
            assert hit["cost"]["note"] == "a cache hit costs nothing"
            assert hit["usage_by_attempt"] == []
            # an answer the upstream refused: its receipt, costing nothing
            refused = httpx.post(
                gw.url + "/v1/chat/completions",
                content=b"{not json",
                headers={**AUTH, "x-request-id": "refused-1", "content-type": "application/json"},
                timeout=30,
            )
            assert refused.status_code == 400
            no = receipt(gw, "refused-1")
            assert no["status"] == 400
            assert no["cost"]["nanos"] == 0
            assert [a["result"] for a in no["attempts"]] == ["status_4xx"]
