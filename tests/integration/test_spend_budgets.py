"""Money: a real gateway in front of the simulator, on the memory backend. Every
protocol's answer, streamed and not, is charged the table's own price of the usage it
reported; a cut stream its estimate, labelled; strict money budgets cap the output and
are never passed; a team's budget is shared by its clients; an unpriced model is
refused, or served and labelled; the x-ratelimit-*-usd headers say what is left."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import genai_prices
import pytest
from genai_prices import Usage as TableUsage

from tests import web
from tests.conftest import ServerThread
from tests.integration.helpers import access_log_line, gateway_for, metric_value

KEYS = {
    name: f"sk-{name}-0123456789"
    for name in ("solo", "tight", "ana", "ben", "nopriced", "allowed", "mixed", "boss")
}
#: The simulator reports a prompt of its body's bytes / 4: a prompt of some length keeps
#: that below the strict bound (a token a byte of the text), as any real tokenizer is.
PROMPT = "hello there " * 30
#: A millionth of a cent, in dollars.
TOLERANCE = Decimal("0.00000001")


def _client(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "key_sha256": [hashlib.sha256(KEYS[name].encode()).hexdigest()], **extra}


CLIENTS = [
    _client("solo", limits={"usd_per_day": "100"}),
    _client("tight", limits={"usd_per_day": "0.01"}, budget_enforcement="strict"),
    _client("ana", team="eng"),
    _client("ben", team="eng"),
    _client("nopriced", limits={"usd_per_month": "1"}),
    _client("allowed", limits={"usd_total": "1"}, unpriced="allow"),
    _client("mixed", limits={"usd_per_month": "50", "max_concurrent_streams": 1}),
    _client("boss", spend_admin=True),
]
TEAMS = [{"name": "eng", "limits": {"usd_per_day": "0.002"}}]


@pytest.fixture(scope="module")
def gw(simulator: ServerThread) -> Iterator[ServerThread]:
    routes = [
        {"name": "r", "prefix": "/v1", "upstream": f"{simulator.url}/v1"},
        {"name": "g", "prefix": "/v1beta", "upstream": f"{simulator.url}/v1beta"},
    ]
    with gateway_for(
        "", routes=routes, clients=CLIENTS, teams=TEAMS, access_log=True, status_page=True
    ) as server:
        yield server


def _post(
    gw: ServerThread, client: str, rid: str, path: str, body: dict[str, Any], **headers: str
) -> Any:
    headers = {
        "authorization": f"Bearer {KEYS[client]}",
        "x-goog-api-key": KEYS[client],
        "x-request-id": rid,
        **headers,
    }
    return web.post(gw.url + path, json=body, headers=headers, timeout=30)


def _table(model: str, provider: str, **usage: int) -> Decimal:
    usage = {k: v for k, v in usage.items() if v}
    return genai_prices.calc_price(TableUsage(**usage), model, provider_id=provider).total_price


def _priced(line: dict[str, Any]) -> Decimal:
    spend = line["spend"]
    assert spend["table"] == f"genai-prices {genai_prices.__version__}"
    return Decimal(spend["nanos"]) / 10**9


CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "price me"}]}
MESSAGES = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 1000,
    "messages": [{"role": "user", "content": "price me"}],
}
RESPONSES = {"model": "gpt-4o", "input": "price me"}
GEMINI = {"contents": [{"role": "user", "parts": [{"text": "price me"}]}]}


@pytest.mark.parametrize("stream", [False, True])
def test_every_protocol_streamed_or_not_is_charged_the_tables_price_of_its_usage(
    gw: ServerThread, capsys: pytest.CaptureFixture[str], stream: bool
) -> None:
    cases: list[tuple[str, str, dict[str, Any], str, str]] = [
        ("chat", "/v1/chat/completions", CHAT, "gpt-4o", "openai"),
        ("responses", "/v1/responses", RESPONSES, "gpt-4o", "openai"),
        ("messages", "/v1/messages", MESSAGES, "claude-sonnet-4-5", "anthropic"),
    ]
    gemini_path = (
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
        if stream
        else "/v1beta/models/gemini-2.5-flash:generateContent"
    )
    cases.append(("gemini", gemini_path, GEMINI, "gemini-2.5-flash", "google"))
    for name, path, body, model, provider in cases:
        rid = f"golden-{name}-{stream}"
        sent = {**body, "stream": True} if stream and name != "gemini" else body
        answer = _post(gw, "solo", rid, path, sent, **{"x-sim-tokens": "40"})
        assert answer.status_code == 200, answer.text
        line = access_log_line(capsys, rid)
        usage = line["usage"]
        assert line["spend"]["evidence"] == "reported", line
        if provider == "anthropic":  # its input leaves the cache out
            table = _table(
                model,
                provider,
                input_tokens=usage["input"]
                + usage.get("cached_input", 0)
                + usage.get("cache_write", 0),
                cache_read_tokens=usage.get("cached_input", 0),
                cache_write_tokens=usage.get("cache_write", 0),
                output_tokens=usage["output"],
            )
        else:
            table = _table(
                model,
                provider,
                input_tokens=usage["input"],
                cache_read_tokens=usage.get("cached_input", 0),
                output_tokens=usage["output"]
                + (usage.get("reasoning", 0) if name == "gemini" else 0),
            )
        assert table > 0
        assert abs(_priced(line) - table) < TOLERANCE, (name, line, table)


def test_a_cut_stream_is_charged_its_estimate_labelled_never_zero(
    gw: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    body = {**CHAT, "stream": True}
    answer = _post(
        gw, "solo", "cut-1", "/v1/chat/completions", body, **{"x-sim-fault": "drop_after_text"}
    )
    assert answer.status_code == 200
    line = access_log_line(capsys, "cut-1")
    assert line["spend"]["evidence"] == "estimated"
    charged = line["charged"]
    expected = _table(
        "gpt-4o", "openai", input_tokens=charged["input"], output_tokens=charged["output"]
    )
    assert expected > 0
    assert abs(_priced(line) - expected) < TOLERANCE


def test_strict_caps_the_output_at_what_the_money_left_buys_and_never_passes_it(
    gw: ServerThread, simulator: ServerThread
) -> None:
    """$0.01 a day, gpt-4o at $10 a million output tokens: 2,000-token answers unless
    capped. Each request's max_tokens is lowered to what is left; the budget ends at or
    below $0.01, and the request that cannot fit is refused (insufficient_quota)."""
    statuses = []
    caps = []
    for index in range(8):
        rid = f"tight-{index}"
        body = {**CHAT, "messages": [{"role": "user", "content": PROMPT}], "stream": True}
        answer = _post(gw, "tight", rid, "/v1/chat/completions", body, **{"x-sim-tokens": "2000"})
        statuses.append(answer.status_code)
        if answer.status_code == 200:
            seen = web.get(f"{simulator.url}/_sim/requests/{rid}").json()["body"]
            caps.append(seen["max_tokens"])
            assert answer.headers["x-ratelimit-limit-usd"] == "0.010000000"
            assert Decimal(answer.headers["x-ratelimit-remaining-usd"]) < Decimal("0.01")
        else:
            assert answer.status_code == 429
            assert answer.json()["error"]["code"] == "insufficient_quota"
            assert answer.headers["x-should-retry"] == "false"
    assert caps
    assert 0 < caps[0] < 2000
    assert 429 in statuses
    text = web.get(gw.url + "/metrics").text
    spent = metric_value(text, "gateway_spend_usd_total", client="tight")
    assert 0 < spent <= 0.01


def test_a_teams_budget_is_shared_by_its_clients(gw: ServerThread) -> None:
    """$0.002 a day for the team: ana spends it, then ben is refused too (each request
    reserves its max_tokens at the output price: 60 tokens of gpt-4o, $0.0006)."""
    body = {**CHAT, "stream": True, "max_tokens": 60}
    statuses = [
        _post(
            gw, "ana", f"ana-{i}", "/v1/chat/completions", body, **{"x-sim-tokens": "60"}
        ).status_code
        for i in range(10)
    ]
    assert statuses[0] == 200
    assert 429 in statuses
    refused = _post(gw, "ben", "ben-0", "/v1/chat/completions", body, **{"x-sim-tokens": "60"})
    assert refused.status_code == 429
    assert "usd_per_day" in refused.json()["error"]["message"]
    text = web.get(gw.url + "/metrics").text
    assert metric_value(text, "gateway_spend_usd_total", team="eng", client="ana") > 0
    assert metric_value(text, "gateway_spend_usd_total", team="eng", client="ben") == 0
    receipt = _get(gw, "ben", "/v1/gateway/receipts/ben-0")
    for _ in range(50):  # written by a task: poll, bounded
        if receipt.status_code == 200:
            break
        receipt = _get(gw, "ben", "/v1/gateway/receipts/ben-0")
    assert receipt.json()["team"] == "eng"
    assert receipt.json()["status"] == 429


def test_an_unpriced_model_is_refused_naming_it_or_served_labelled(
    gw: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    body = {**CHAT, "model": "sim-model"}
    refused = _post(gw, "nopriced", "unpriced-1", "/v1/chat/completions", body)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "model_not_priced"
    assert "sim-model" in error["message"]
    assert refused.headers["x-should-retry"] == "false"
    assert access_log_line(capsys, "unpriced-1")["rejected"] == "unpriced"
    served = _post(gw, "allowed", "unpriced-2", "/v1/chat/completions", body)
    assert served.status_code == 200
    line = access_log_line(capsys, "unpriced-2")
    assert line["spend"] == {"nanos": 0, "evidence": "unpriced", "table": None}
    text = web.get(gw.url + "/metrics").text
    assert 'evidence="unpriced"' in text


def _get(gw: ServerThread, client: str, path: str) -> Any:
    return web.get(gw.url + path, headers={"authorization": f"Bearer {KEYS[client]}"}, timeout=30)


def test_receipts_are_the_owners_only_and_the_report_receipts_and_metric_agree_exactly(
    gw: ServerThread,
) -> None:
    """A mixed run of one client (streamed, plain, cut, refused, unpriced-refused): its
    receipts (each only its own; anyone else gets the unknown id's 404), the report's
    total and the metric's sum are the same number of nano-dollars."""
    assert _post(gw, "solo", "other-client", "/v1/chat/completions", CHAT).status_code == 200
    ids = []
    for index in range(12):
        rid = f"mixed-{index}"
        ids.append(rid)
        path, body, headers = "/v1/chat/completions", dict(CHAT), {"x-sim-tokens": "30"}
        if index % 3 == 0:
            body["stream"] = True
        if index % 4 == 1:
            body["stream"] = True
            headers["x-sim-fault"] = "drop_after_text"
        if index == 5:
            body["model"] = "sim-model"  # unpriced: refused before any upstream
        if index in (7, 8):
            path, body = "/v1/messages", {**MESSAGES, "stream": index == 7}
        answer = _post(gw, "mixed", rid, path, body, **headers)
        assert answer.status_code == (400 if index == 5 else 200), answer.text
    receipts = {}
    for rid in ids:
        found = _get(gw, "mixed", f"/v1/gateway/receipts/{rid}")
        deadline = 0
        while found.status_code == 404 and deadline < 50:  # written by a task: poll, bounded
            deadline += 1
            found = _get(gw, "mixed", f"/v1/gateway/receipts/{rid}")
        assert found.status_code == 200, found.text
        receipts[rid] = found.json()
        other = _get(gw, "solo", f"/v1/gateway/receipts/{rid}")
        unknown = _get(gw, "solo", "/v1/gateway/receipts/no-such-request")
        assert other.status_code == unknown.status_code == 404
        mine, theirs = other.json()["error"], unknown.json()["error"]
        assert mine["code"] == theirs["code"]
        assert (
            mine["message"].split(" (request_id")[0] == theirs["message"].split(" (request_id")[0]
        )
    refused = receipts["mixed-5"]
    assert refused["status"] == 400
    assert refused["rejected"] == "unpriced"
    assert refused["cost"]["nanos"] == 0
    cut = receipts["mixed-1"]
    assert cut["cost"]["evidence"] == "estimated"
    assert cut["cost"]["nanos"] > 0
    assert cut["verdict"]["outcome"] == "incomplete"
    whole = receipts["mixed-0"]
    assert whole["cost"]["evidence"] == "reported"
    assert whole["cost"]["price_table"] == f"genai-prices {genai_prices.__version__}"
    assert whole["attempts"][0]["result"] == "ok"
    assert whole["budgets"][0]["limit"] == "usd_per_month"
    assert Decimal(whole["budgets"][0]["left"]) < 50
    summed = sum(r["cost"]["nanos"] for r in receipts.values())
    own = _get(gw, "mixed", "/v1/gateway/spend?group_by=client,model,evidence").json()
    assert {row["client"] for row in own["rows"]} == {"mixed"}
    assert own["total"]["nanos"] == summed
    assert own["total"]["requests"] == len(ids)
    everyone = _get(gw, "boss", "/v1/gateway/spend?group_by=client").json()
    clients = {row["client"]: row for row in everyone["rows"]}
    assert clients["mixed"]["nanos"] == summed
    for _ in range(50):  # solo's receipt is written by a task: poll, bounded
        if "solo" in clients:
            break
        everyone = _get(gw, "boss", "/v1/gateway/spend?group_by=client").json()
        clients = {row["client"]: row for row in everyone["rows"]}
    assert "solo" in clients
    text = web.get(gw.url + "/metrics").text
    metric = metric_value(text, "gateway_spend_usd_total", client="mixed")
    assert round(Decimal(repr(metric)) * 10**9) == summed
    bad = _get(gw, "mixed", "/v1/gateway/spend?group_by=colour")
    assert bad.status_code == 400


def test_a_request_that_can_never_fit_a_money_budget_says_so_and_is_not_told_to_retry(
    gw: ServerThread,
) -> None:
    """The team's $0.002 a day; 100,000 output tokens of gpt-4o reserved: $1."""
    body = {**CHAT, "max_tokens": 100_000}
    refused = _post(gw, "ben", "never-1", "/v1/chat/completions", body)
    assert refused.status_code == 429
    assert "can never fit" in refused.json()["error"]["message"]
    assert refused.headers["x-should-retry"] == "false"
    assert "retry-after" not in refused.headers


def test_the_status_page_shows_spend_per_client_and_team(gw: ServerThread) -> None:
    answer = _post(gw, "ana", "status-1", "/v1/chat/completions", {**CHAT, "max_tokens": 1})
    assert answer.status_code in (200, 429)
    _post(gw, "solo", "status-2", "/v1/chat/completions", CHAT)
    page = ""
    for _ in range(50):  # receipts and totals are written by a task: poll, bounded
        page = web.get(gw.url + "/status").text
        if "<td>solo</td>" in page.partition('id="spend"')[2]:
            break
    spend = page.partition('<section id="spend">')[2].partition("</section>")[0]
    assert "<td>solo</td>" in spend
    assert "<td>team:eng</td>" in spend
    assert "$0.01" in page.partition('id="clients"')[2]  # tight's usd_per_day, in dollars


def test_a_receipt_carries_the_schema_verdict() -> None:
    """A named client's structured answer, judged by the schema stage: its receipt says
    the schema verdict beside the stream's, and what it cost."""
    import asyncio
    import json as jsonlib

    from tests.integration.test_relay_inprocess import SSE, Upstream, answer, in_process

    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    body = {
        "model": "gpt-4o",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
    }
    events = [
        {"choices": [{"index": 0, "delta": {"content": '{"name": "a"}'}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 5}},
    ]
    stream = b"".join(b"data: " + jsonlib.dumps(e).encode() + b"\n\n" for e in events)
    upstream = Upstream(lambda r: answer(200, stream + b"data: [DONE]\n\n", **SSE))
    auth = {"authorization": f"Bearer {KEYS['solo']}"}

    async def test() -> None:
        async with in_process(upstream, clients=CLIENTS[:1]) as client:
            sent = await client.post(
                "/v1/chat/completions", json=body, headers={**auth, "x-request-id": "schema-1"}
            )
            assert sent.status_code == 200
            for _ in range(100):  # written by a task: poll, bounded
                found = await client.get("/v1/gateway/receipts/schema-1", headers=auth)
                if found.status_code == 200:
                    break
                await asyncio.sleep(0)
        receipt = found.json()
        assert receipt["schema"]["verdict"] == "valid"
        assert receipt["verdict"] == {"outcome": "complete", "reason": "stop"}
        assert receipt["usage"] == {"input": 12, "output": 5}
        expected = _table("gpt-4o", "openai", input_tokens=12, output_tokens=5)
        assert Decimal(receipt["cost"]["usd"]) == expected

    asyncio.run(test())


def test_a_whole_stream_whose_upstream_sent_no_usage_is_charged_its_estimate_labelled(
    gw: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    """boss has no limits: its stream is not asked for usage, and none comes. It is
    charged the estimate of its input and of what was relayed, labelled estimated."""
    answer = _post(gw, "boss", "no-usage-1", "/v1/chat/completions", {**CHAT, "stream": True})
    assert answer.status_code == 200
    assert b'"usage":{' not in answer.content
    line = access_log_line(capsys, "no-usage-1")
    assert line["outcome"] == "complete"
    assert line["usage"] is None
    assert line["spend"]["evidence"] == "estimated"
    charged = line["charged"]
    expected = _table(
        "gpt-4o", "openai", input_tokens=charged["input"], output_tokens=charged["output"]
    )
    assert expected > 0
    assert abs(_priced(line) - expected) < TOLERANCE
