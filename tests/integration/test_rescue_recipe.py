"""The docs' own primary-and-fallback recipe (docs/rescue.md) against a fake provider that
breaks in the sixteen documented ways, driven with the real openai and anthropic SDKs.

The recipe is read from the page and used as written, with only its URLs and model
names changed, and its times scaled down by ``SCALE`` (settings, never sleeps): a
30 s budget becomes 6 s, a 60 s outage 12 s. Every failure must end with the SDK
holding the whole canonical answer (the content-filter 400 relayed as the SDK's
error), within the budget.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.simulator import create_simulator_app, expected_text
from tests import web
from tests.conftest import ServerThread, running
from tests.integration.helpers import (
    access_log_until,
    annotation,
    gateway_for,
    metric_value,
)
from tests.integration.test_failover import CHAT, chat_text, metrics
from tests.sdk import anthropic, openai

ROOT = Path(__file__).resolve().parents[2]
SCALE = 0.2
TEXT = expected_text(20)


def recipe(primary: str, fallback: str, **fallback_keys: Any) -> list[dict[str, Any]]:
    """The routes of docs/rescue.md's "A primary and a fallback tier", as written but for
    the URLs, the fallback's model name and times scaled by ``SCALE``."""
    page = (ROOT / "docs" / "rescue.md").read_text(encoding="utf-8")
    section = page[page.index("## A primary and a fallback tier") :]
    match = re.search(r"```toml\n(.*?)```", section, flags=re.S)
    assert match is not None
    (route,) = tomllib.loads(match.group(1))["routes"]
    for key in ("eject_base_seconds", "eject_max_seconds"):
        route[key] *= SCALE
    route["timeouts"] = {k: v * SCALE for k, v in route["timeouts"].items()}
    first, second = route["upstreams"]
    first["url"] = primary + "/v1"
    first["timeouts"] = {k: v * SCALE for k, v in first["timeouts"].items()}
    second["url"] = fallback + "/v1"
    second["models"] = {"*": "sim-fallback"}
    second.update(fallback_keys)
    return [route]


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    # the recipe's credential_env names: any value (the simulator takes any key)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-primary")
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-fallback")


@contextlib.contextmanager
def sim(**options: Any) -> Iterator[ServerThread]:
    with running(create_simulator_app(**options)) as server:
        yield server


def arrivals(server: ServerThread) -> list[float]:
    return list(server.server.config.app.state.arrivals)


BUDGET = 30.0 * SCALE
#: The SDK's own time around the gateway's budget: a request never takes much longer.
SLACK = 10.0


def sdk_text(gw: ServerThread, headers: dict[str, str] | None = None, **body: Any) -> str:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0, timeout=60)
    started = time.monotonic()
    chunks = client.chat.completions.create(**{**CHAT, **body}, extra_headers=headers or {})
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert time.monotonic() - started < BUDGET + SLACK
    return text


# (name, primary simulator, request headers, who serves: "primary", "fallback" or
# "continued" on the fallback)
FAILURES: list[tuple[str, dict[str, Any], dict[str, str], str]] = [
    (
        "429 with Retry-After",
        {"default_fault": "status", "default_status": 429, "fault_requests": 1, "retry_after": "1"},
        {},
        "primary",
    ),
    (
        "500 once",
        {"default_fault": "status", "default_status": 500, "fault_requests": 1},
        {},
        "primary",
    ),
    (
        "persistent 503",
        {"default_fault": "status", "default_status": 503, "retry_after": None},
        {},
        "fallback",
    ),
    ("reset", {"default_fault": "abort_mid_body"}, {}, "continued"),
    ("silent upstream", {"default_fault": "stall_before_headers"}, {}, "fallback"),
    (
        "20 s first token",
        {"default_fault": "stall_before_headers"},
        {"x-sim-stall-seconds": str(20 * SCALE)},
        "fallback",
    ),
    ("cut after 40 of 60 tokens", {"default_fault": "drop_after_text"}, {}, "continued"),
    (
        "30 s stall",
        {"default_fault": "stall_mid_stream"},
        {"x-sim-stall-seconds": str(30 * SCALE)},
        "continued",
    ),
    # before its first event: retried on the fallback, not on the primary that sent it
    ("malformed chunk", {"default_fault": "invalid_json"}, {}, "fallback"),
    ("missing [DONE]", {"default_fault": "drop_before_done"}, {}, "continued"),
    (
        "400 context_length_exceeded",
        {"default_fault": "status", "default_status": 400, "context_length": True},
        {},
        "fallback",
    ),
]


@pytest.mark.parametrize(
    ("name", "primary_faults", "headers", "served"), FAILURES, ids=[f[0] for f in FAILURES]
)
def test_the_recipe_rescues_a_failure_with_the_whole_answer(
    name: str, primary_faults: dict[str, Any], headers: dict[str, str], served: str
) -> None:
    tokens = 60 if "60 tokens" in name else 20
    with sim(**primary_faults) as primary, sim() as fallback:
        with gateway_for("", routes=recipe(primary.url, fallback.url)) as gw:
            text = sdk_text(gw, {"x-sim-tokens": str(tokens), **headers})
            assert text == expected_text(tokens), name
            text_metrics = metrics(gw)
        on_fallback = len(arrivals(fallback))
        if served == "primary":
            assert on_fallback == 0
        else:
            assert on_fallback == 1  # one answer or one continuation, never more
        continued = metric_value(text_metrics, "gateway_continuations_total", result="ok")
        assert continued == (1 if served == "continued" else 0)
        assert metric_value(text_metrics, "gateway_streams_total", outcome="complete") == 1
        # the primary that broke the stream is never asked to continue it
        assert len(arrivals(primary)) <= 2


def test_the_recipe_relays_a_content_filter_400_as_the_sdks_error() -> None:
    with (
        sim(default_fault="status", default_status=400) as primary,
        sim() as fallback,
        gateway_for("", routes=recipe(primary.url, fallback.url)) as gw,
    ):
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(**CHAT)
        assert "status 400" in str(raised.value)  # the upstream's own message
        assert arrivals(fallback) == []


def test_the_recipe_gives_a_persistently_rate_limited_primary_at_most_4_attempts_in_3_s() -> None:
    with (
        sim(default_fault="status", default_status=429, retry_after=None) as primary,
        sim() as fallback,
        gateway_for("", routes=recipe(primary.url, fallback.url)) as gw,
    ):
        end = time.monotonic() + 3.5
        while time.monotonic() < end:
            assert sdk_text(gw) == TEXT
        starts = arrivals(primary)
        worst = max(sum(1 for t in starts if s <= t < s + 3.0) for s in starts)
        assert worst <= 4, starts


def test_the_recipe_brings_a_recovered_primary_back_within_30_s() -> None:
    outage = 60.0 * SCALE
    with (
        sim(
            default_fault="status", default_status=503, fault_seconds=outage, retry_after=None
        ) as primary,
        sim() as fallback,
        gateway_for("", routes=recipe(primary.url, fallback.url)) as gw,
    ):
        served: list[tuple[float, str]] = []
        first = time.monotonic()
        while time.monotonic() - first < outage + 40 * SCALE:
            sent = time.monotonic()
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
            response = client.chat.completions.with_raw_response.create(**CHAT)
            text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
            assert text == TEXT
            served.append((sent - first, response.headers["x-gateway-upstream"]))
            time.sleep(4 * SCALE)
        assert "fallback" in {u for _, u in served}
        back = [t for t, u in served if t > outage and u == "primary"]
        assert back, served
        # within 30 s (scaled) of its recovery, and it stays there
        assert back[0] < outage + 30 * SCALE, served
        assert all(u == "primary" for t, u in served if t > back[0]), served


def test_the_recipe_bills_the_answer_only_for_the_attempt_that_gave_it() -> None:
    import hashlib

    key = "sk-failover"
    client = {"name": "failover", "key_sha256": [hashlib.sha256(key.encode()).hexdigest()]}
    body = {**CHAT, "stream_options": {"include_usage": True}}
    with (
        sim(default_fault="status", default_status=503, retry_after=None) as primary,
        sim() as fallback,
    ):
        direct = web.post(
            fallback.url + "/v1/chat/completions",
            json={**body, "model": "sim-fallback"},  # what the fallback gets
            timeout=30,
        )
        alone = next(
            json.loads(line[6:])["usage"]
            for line in direct.content.split(b"\n")
            if line.startswith(b"data: {") and b'"usage":{' in line
        )
        with gateway_for("", routes=recipe(primary.url, fallback.url), clients=[client]) as gw:
            response = web.post(
                gw.url + "/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {key}"},
                timeout=30,
            )
            assert chat_text(response.content) == TEXT
            usage = [
                json.loads(line[6:])["usage"]
                for line in response.content.split(b"\n")
                if line.startswith(b"data: {") and b'"usage":{' in line
            ]
            assert usage == [alone]  # the failed 503s are not in it
            text = metrics(gw)
            for kind, tokens in (("input", "prompt_tokens"), ("output", "completion_tokens")):
                charged = metric_value(
                    text, "gateway_client_tokens_total", client="failover", type=kind
                )
                assert charged == alone[tokens]


def test_the_access_log_names_the_real_cause_of_a_retry(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with (
        sim(default_fault="invalid_json") as primary,
        sim() as fallback,
        gateway_for("", routes=recipe(primary.url, fallback.url), access_log=True) as gw,
    ):
        assert sdk_text(gw, {"x-request-id": "malformed"}) == TEXT
        line = access_log_until(capsys, "malformed")[-1]
    assert [(a["upstream"], a["result"], a.get("retry_cause")) for a in line["attempts"]] == [
        ("primary", "early_eof", "invalid_json"),
        ("fallback", "ok", None),
    ]


# -- with the recipe: a fallback that refuses prefill, a primary that cuts every stream, an
# upstream that restarts its answer ------------------------------------------------------------


def test_a_fallback_that_refuses_prefill_continues_by_regenerating() -> None:
    with (
        sim(default_fault="drop_after_text") as primary,
        sim(continuation="reject") as fallback,
    ):
        routes = recipe(primary.url, fallback.url, continuation="regenerate")
        with gateway_for("", routes=routes) as gw:
            assert sdk_text(gw, {"x-request-id": "regenerated"}) == TEXT
            seen = web.get(f"{fallback.url}/_sim/requests/regenerated").json()["body"]
            # the original request, unchanged but for the fallback's model
            assert seen == {**CHAT, "model": "sim-fallback"}
            text = metrics(gw)
            assert metric_value(text, "gateway_continuations_total", result="ok") == 1
    # the same fallback asked for a prefill: the original reason
    with (
        sim(default_fault="drop_after_text") as primary,
        sim(continuation="reject") as fallback,
        gateway_for("", routes=recipe(primary.url, fallback.url)) as gw,
    ):
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.APIError) as raised:
            for _ in client.chat.completions.create(**CHAT):
                pass
        assert "missing_done" in str(raised.value.body or raised.value)
        assert metric_value(metrics(gw), "gateway_continuations_total", result="rejected") == 1


def test_a_regenerated_messages_answer_reaches_the_anthropic_sdk_whole() -> None:
    with (
        sim(default_fault="drop_after_text") as primary,
        sim(continuation="reject") as fallback,
    ):
        routes = recipe(primary.url, fallback.url, continuation="regenerate")
        with gateway_for("", routes=routes) as gw:
            client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
            with client.messages.stream(
                model="sim-1", max_tokens=256, messages=[{"role": "user", "content": "hi"}]
            ) as events:
                text = "".join(events.text_stream)
                final = events.get_final_message()
            assert text == TEXT
            assert final.stop_reason == "end_turn"


def test_a_primary_that_cuts_every_stream_gives_whole_answers_from_the_first_request() -> None:
    with sim(default_fault="abort_mid_body") as primary, sim() as fallback:
        with gateway_for("", routes=recipe(primary.url, fallback.url)) as gw:
            for _ in range(6):
                assert sdk_text(gw) == TEXT
            text = metrics(gw)
        # never continued (nor retried) on the primary that cut it: each request went to
        # it at most once, and once ejected (eject_after = 3) not at all
        assert len(arrivals(primary)) <= 3
        assert metric_value(text, "gateway_continuations_total", upstream="primary") == 0


@pytest.mark.parametrize("misbehaving", ["restart", "empty"])
def test_an_upstream_that_does_not_continue_is_not_honoured(
    misbehaving: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The fallback restarts the answer (or ends it with nothing): not honoured, and the
    # primary that cut the stream, asked last, continues it.
    with (
        sim(default_fault="drop_after_text", fault_requests=1) as primary,
        sim(continuation=misbehaving) as fallback,
        gateway_for("", routes=recipe(primary.url, fallback.url)) as gw,
    ):
        assert sdk_text(gw) == TEXT  # never the answer's text twice
        text = metrics(gw)
        assert metric_value(text, "gateway_continuations_total", result="not_honoured") == 1
        assert metric_value(text, "gateway_continuations_total", result="ok") == 1
    # With nothing else to ask, the client gets the original reason, and only the text
    # of the cut attempt.
    with (
        sim(default_fault="drop_after_text") as primary,
        sim(continuation=misbehaving) as fallback,
    ):
        routes = recipe(primary.url, fallback.url)
        routes[0]["upstreams"][0]["continuation"] = "none"
        rid = f"not-honoured-{misbehaving}"
        with gateway_for("", routes=routes, access_log=True) as gw:
            response = web.post(
                gw.url + "/v1/chat/completions",
                json=CHAT,
                headers={"x-request-id": rid},
                timeout=30,
            )
            note = annotation(response.content)
            assert (note["outcome"], note["reason"]) == ("incomplete", "missing_done")
            assert "continued" not in note
            assert chat_text(response.content) == expected_text(3)
            text = metrics(gw)
            assert metric_value(text, "gateway_continuations_total", result="not_honoured") == 1
            line = access_log_until(capsys, rid)[-1]
        assert (line["outcome"], line["reason"]) == ("incomplete", "missing_done")


@pytest.mark.parametrize(
    ("fault", "headers"),
    [
        ("abort_mid_body", {}),
        ("invalid_json", {}),
        ("stall_mid_stream", {"x-sim-stall-seconds": str(30 * SCALE)}),
    ],
)
def test_the_recipe_rescues_a_messages_stream_for_the_anthropic_sdk(
    fault: str, headers: dict[str, str]
) -> None:
    body = {**CHAT, "stream_options": {"include_usage": True}}
    del body
    with sim(default_fault=fault) as primary, sim() as fallback:
        with gateway_for("", routes=recipe(primary.url, fallback.url)) as gw:
            client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
            with client.messages.stream(
                model="sim-1",
                max_tokens=256,
                messages=[{"role": "user", "content": "hi"}],
                extra_headers=headers,
            ) as events:
                text = "".join(events.text_stream)
                final = events.get_final_message()
            assert text == TEXT
            assert final.stop_reason == "end_turn"
            # the billed sum, input included: the cut attempt's and the continuation's
            first = web.post(
                primary.url + "/v1/messages",
                json={
                    "model": "sim-1",
                    "max_tokens": 256,
                    "stream": True,
                    "messages": [{"role": "user", "content": "hi"}],
                },
                headers={"x-sim-fault": "none"},
                timeout=30,
            )
            start = next(
                json.loads(line[6:])
                for line in first.content.split(b"\n")
                if line.startswith(b"data: {") and b"message_start" in line
            )
            assert final.usage.input_tokens > start["message"]["usage"]["input_tokens"]
        assert len(arrivals(fallback)) == 1


def test_a_stall_is_continued_when_the_route_sets_only_a_total_deadline() -> None:
    with sim(default_fault="stall_mid_stream") as primary, sim() as fallback:
        routes = recipe(primary.url, fallback.url)
        del routes[0]["timeouts"]["idle"]  # the default idle (120 s) is past the total
        with gateway_for("", routes=routes) as gw:
            assert sdk_text(gw, {"x-sim-stall-seconds": str(60 * SCALE)}) == TEXT
            text = metrics(gw)
        assert metric_value(text, "gateway_continuations_total", result="ok") == 1
        assert len(arrivals(fallback)) == 1


def test_a_regenerated_answer_that_diverges_is_rejected_with_the_original_reason() -> None:
    # The fallback answers the same request with another text (another seed): nothing of
    # it reaches the client, never a second copy of the answer.
    with (
        sim(default_fault="drop_after_text") as primary,
        sim(continuation="reject", default_seed=7) as fallback,
    ):
        routes = recipe(primary.url, fallback.url, continuation="regenerate")
        routes[0]["upstreams"][0]["continuation"] = "none"
        with gateway_for("", routes=routes) as gw:
            response = web.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)
            note = annotation(response.content)
            assert (note["outcome"], note["reason"]) == ("incomplete", "missing_done")
            assert "continued" not in note
            assert chat_text(response.content) == expected_text(3)
            text = metrics(gw)
            assert metric_value(text, "gateway_continuations_total", result="rejected") == 1
        assert len(arrivals(fallback)) == 1
