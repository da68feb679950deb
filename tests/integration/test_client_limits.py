"""Named clients and their limits on the memory backend: a real gateway in front of the
simulator, driven with httpx and the real openai and anthropic SDKs."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.settings import Settings
from tests import web
from tests.conftest import ServerThread
from tests.integration.helpers import (
    access_log_line,
    annotation,
    gateway_for,
    gateway_with_clients,
    metric_value,
)
from tests.sdk import anthropic, ollama, openai

KEY_A, KEY_B, KEY_C = "sk-team-a-0123", "sk-team-b-4567", "sk-team-c-89ab"


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _chat(content: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": content}],
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


CLIENTS: list[dict[str, Any]] = [
    {"name": "team-a", "key_sha256": [_sha(KEY_A), _sha("sk-team-a-next")]},
    {
        "name": "team-b",
        "key_sha256": [_sha(KEY_B)],
        "limits": {"requests_per_minute": 2, "tokens_per_day": 100000},
    },
    {"name": "team-c", "key_sha256": [_sha(KEY_C)], "limits": {"max_concurrent_streams": 1}},
]


@pytest.fixture(scope="module", params=["configured", "issued"])
def issued(request: pytest.FixtureRequest) -> bool:
    """Each test of named clients runs twice: clients configured in the file, and the
    same clients issued at run time (the admin API, ``gateway.keys``)."""
    return bool(request.param == "issued")


@pytest.fixture(scope="module")
def clients_issued(issued: bool) -> bool:
    return issued


@pytest.fixture(scope="module")
def gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    return {"upstream_url": simulator.url + "/v1", "clients": CLIENTS, "access_log": True}


def _post(gateway: ServerThread, key: str | None, rid: str, body: dict[str, Any], **headers: str):  # type: ignore[no-untyped-def]
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    headers["x-request-id"] = rid
    return web.post(gateway.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def _seen_by_simulator(simulator: ServerThread, rid: str) -> dict[str, Any]:
    headers: dict[str, Any] = web.get(f"{simulator.url}/_sim/requests/{rid}").json()["headers"]
    return headers


def test_a_named_client_is_labelled_and_its_key_never_reaches_the_upstream(
    gateway: ServerThread, simulator: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    for rid, key in (("named-a", KEY_A), ("named-a-next", "sk-team-a-next")):
        response = _post(gateway, key, rid, _chat())
        assert response.status_code == 200, response.text
        seen = _seen_by_simulator(simulator, rid)
        assert "authorization" not in seen, seen
        line = access_log_line(capsys, rid)
        assert line["client_name"] == "team-a"
        assert line["charged"]["source"] == "reported"
    assert _post(gateway, None, "nokey", _chat()).status_code == 401
    assert _post(gateway, "sk-stranger", "stranger", _chat()).status_code == 401
    text = web.get(gateway.url + "/metrics").text
    assert metric_value(text, "gateway_streams_total", client="team-a", outcome="complete") >= 2
    assert metric_value(text, "gateway_requests_total", client="team-a", code="200") >= 2
    assert metric_value(text, "gateway_requests_total", client="anonymous", code="401") >= 2
    assert metric_value(
        text, "gateway_client_tokens_total", client="team-a", type="output", source="reported"
    ) == metric_value(text, "gateway_tokens_total", client="team-a", type="output")


def test_a_key_of_a_client_and_of_a_route_list_is_refused_at_start() -> None:
    route = {"name": "r", "prefix": "/v1", "upstream": "http://127.0.0.1:9/v1"}
    with pytest.raises(ValidationError, match="also in a client_key_sha256 list"):
        Settings(
            routes=[{**route, "client_key_sha256": [_sha(KEY_A)]}],
            clients=[{"name": "team-a", "key_sha256": [_sha(KEY_A)]}],
        )
    with pytest.raises(ValidationError, match="share a key"):
        Settings(
            routes=[route],
            clients=[
                {"name": "a", "key_sha256": [_sha(KEY_A)]},
                {"name": "b", "key_sha256": [_sha(KEY_A)]},
            ],
        )
    with pytest.raises(ValidationError, match="limits_per_worker"):
        Settings(
            routes=[route],
            workers=2,
            clients=[{"name": "a", "key_sha256": [_sha(KEY_A)], "limits": {"tokens_per_day": 9}}],
        )
    with pytest.raises(ValidationError, match="route"):
        Settings(
            routes=[route], clients=[{"name": "a", "key_sha256": [_sha(KEY_A)], "routes": ["x"]}]
        )


def test_requests_per_minute_answers_429_in_openais_shape_with_the_headers(
    gateway: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = []
    for index in range(4):
        answers.append(_post(gateway, KEY_B, f"rpm-{index}", _chat(max_tokens=30)))
    ok = [a for a in answers if a.status_code == 200]
    limited = [a for a in answers if a.status_code == 429]
    assert ok
    assert limited
    assert ok[0].headers["x-ratelimit-limit-requests"] == "2"
    assert int(ok[0].headers["x-ratelimit-remaining-requests"]) in (0, 1)
    assert ok[0].headers["x-ratelimit-reset-requests"].endswith("s")
    error = limited[0].json()["error"]
    assert error["code"] == "rate_limit_exceeded"
    assert error["type"] == "requests"
    assert 1 <= int(limited[0].headers["retry-after"]) <= 60
    assert 0 < int(limited[0].headers["retry-after-ms"]) <= 60000
    rid = limited[0].headers["x-request-id"]
    assert access_log_line(capsys, rid)["rejected"] == "rate_limited"
    text = web.get(gateway.url + "/metrics").text
    assert metric_value(
        text, "gateway_limited_requests_total", client="team-b", limit="requests_per_minute"
    ) == len(limited)
    remaining = metric_value(
        text, "gateway_client_budget_remaining_tokens", client="team-b", window="day"
    )
    assert 0 < remaining < 100000


def _slow_stream(gateway: ServerThread, done: threading.Event) -> None:
    body = _chat(max_tokens=30)
    with web.stream(
        "POST",
        gateway.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {KEY_C}", "x-sim-tokens": "8", "x-sim-tps": "8"},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        done.set()
        for _ in response.iter_bytes():
            pass


def test_the_openai_sdk_gets_rate_limit_error_and_its_retry_waits_for_room(
    gateway: ServerThread,
) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY_C, max_retries=0)
    started = threading.Event()
    holder = threading.Thread(target=_slow_stream, args=(gateway, started))
    holder.start()
    try:
        assert started.wait(20)
        with pytest.raises(openai.RateLimitError) as raised:
            client.chat.completions.create(**_chat(), extra_headers={"x-sim-tokens": "3"})
        assert raised.value.status_code == 429
        patient = client.with_options(max_retries=8)
        stream = patient.chat.completions.create(**_chat(), extra_headers={"x-sim-tokens": "3"})
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text
    finally:
        holder.join(30)


def test_the_anthropic_sdk_gets_its_rate_limit_error(simulator: ServerThread, issued: bool) -> None:
    clients = [
        {"name": "team-m", "key_sha256": [_sha(KEY_A)], "limits": {"max_concurrent_streams": 1}}
    ]
    with gateway_with_clients(simulator.url + "/v1", issued, clients) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key=KEY_A, max_retries=0)
        body = {"model": "sim", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
        slow = {"x-sim-tokens": "6", "x-sim-tps": "6"}
        with (
            client.messages.stream(**body, extra_headers=slow),
            pytest.raises(anthropic.RateLimitError) as raised,
        ):
            client.messages.create(**body, stream=True)
        assert raised.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
        patient = client.with_options(max_retries=6)
        message = patient.messages.create(**body)
        assert message.content


def test_the_ollama_client_gets_the_refusal_as_its_error_message(
    simulator: ServerThread, issued: bool
) -> None:
    # Ollama's error is a string: the ollama client keeps whatever ``error`` holds.
    clients = [
        {"name": "team-o", "key_sha256": [_sha(KEY_A)], "limits": {"requests_per_minute": 1}}
    ]
    routes = [
        {"name": "o", "prefix": "/api", "upstream": simulator.url + "/api", "protocol": "ollama"}
    ]
    with gateway_with_clients("", issued, clients, routes=routes) as server:
        client = ollama.Client(host=server.url, headers={"authorization": f"Bearer {KEY_A}"})
        hello = [{"role": "user", "content": "hi"}]
        assert list(client.chat(model="sim", messages=hello, stream=True))[-1].done
        with pytest.raises(ollama.ResponseError) as raised:
            list(client.chat(model="sim", messages=hello, stream=True))
        assert raised.value.status_code == 429
        assert isinstance(raised.value.error, str)
        assert "requests_per_minute limit is reached" in raised.value.error


def test_a_cut_stream_and_a_client_that_left_are_charged_an_estimate(
    gateway: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = _post(gateway, KEY_A, "cut-a", _chat(), **{"x-sim-fault": "drop_after_text"})
    assert cut.status_code == 200
    charged = access_log_line(capsys, "cut-a")["charged"]
    assert charged["source"] == "estimated"
    assert charged["output"] > 0
    assert charged["input"] > 0
    with web.stream(
        "POST",
        gateway.url + "/v1/chat/completions",
        json=_chat(),
        headers={
            "authorization": f"Bearer {KEY_A}",
            "x-request-id": "left-a",
            "x-sim-tokens": "200",
            "x-sim-tps": "50",
        },
        timeout=30,
    ) as response:
        for chunk in response.iter_bytes():
            if b"content" in chunk:
                break
    line = access_log_line(capsys, "left-a")
    assert line["reason"] == "client_disconnect"
    assert line["charged"]["source"] == "estimated"
    assert line["charged"]["output"] > 0


def test_a_named_client_without_limits_gets_no_limit_headers(
    simulator: ServerThread, issued: bool
) -> None:
    with gateway_with_clients(simulator.url + "/v1", issued, CLIENTS[:1]) as server:
        response = _post(server, KEY_A, "unlimited", _chat())
        assert response.status_code == 200
        assert "x-ratelimit-limit-requests" not in response.headers


def test_the_status_page_shows_each_clients_use_against_its_limits(
    simulator: ServerThread, issued: bool
) -> None:
    with gateway_with_clients(simulator.url + "/v1", issued, CLIENTS, status_page=True) as server:
        assert _post(server, KEY_B, "status-b", _chat(max_tokens=30)).status_code == 200
        page = web.get(server.url + "/status").text
    section = page.split('<section id="clients">', 1)[1].split("</section>", 1)[0]
    assert "team-b" in section
    assert "requests_per_minute" in section
    assert "tokens_per_day" in section
    assert "team-a" not in section  # no limits, nothing to show
    assert KEY_B not in page
    assert _sha(KEY_B) not in page  # digests are cut, as the global ones are


def test_check_config_masks_the_redis_password() -> None:
    from gateway.redaction import redacted

    settings = Settings(
        upstream_url="http://127.0.0.1:9/v1",
        limits_backend="redis",
        redis_url="rediss://:s3cret@redis.internal:6380/0",
        clients=CLIENTS,
    )
    shown = redacted(settings)
    assert "s3cret" not in str(shown)
    assert shown["redis_url"] == "rediss://<redacted>@redis.internal:6380/0"


def test_a_retried_stream_is_charged_for_the_attempt_that_answered(
    simulator: ServerThread, capsys: pytest.CaptureFixture[str], issued: bool
) -> None:
    """A 500 from the heavy primary, then the answer from the fallback: the failed
    attempt produced no tokens, the answer's reported usage is the charge."""
    from gateway.simulator import create_simulator_app
    from tests.conftest import running

    broken = create_simulator_app(default_fault="status", default_status=500)
    with running(broken) as primary:
        routes = [
            {
                "name": "chat",
                "prefix": "/v1",
                "upstreams": [
                    {"name": "primary", "url": primary.url + "/v1", "weight": 1000},
                    {"name": "fallback", "url": simulator.url + "/v1"},
                ],
            }
        ]
        clients = [{**CLIENTS[1], "limits": {"tokens_per_minute": 100000}}]
        with gateway_with_clients("", issued, clients, routes=routes, access_log=True) as server:
            retried = None
            for attempt in range(5):  # the pick is weighted: the primary first, nearly always
                rid = f"retried-{attempt}"
                response = _post(server, KEY_B, rid, _chat(max_tokens=30))
                assert response.status_code == 200
                usage = [
                    json.loads(line[6:])["usage"]
                    for line in response.text.splitlines()
                    if line.startswith("data: {") and '"usage":{' in line
                ]
                line = access_log_line(capsys, rid)
                if len(line["attempts"]) == 2:
                    retried = (line, usage[0])
                    break
    assert retried is not None, "the primary was never tried first"
    line, usage = retried
    assert line["charged"] == {
        "input": usage["prompt_tokens"],
        "output": usage["completion_tokens"],
        "source": "reported",
    }


def test_limits_per_worker_divides_every_limit() -> None:
    from gateway.limits import build_limiter

    settings = Settings(
        upstream_url="http://127.0.0.1:9/v1",
        workers=4,
        limits_per_worker=True,
        clients=[{**CLIENTS[1], "limits": {"requests_per_minute": 10, "tokens_per_day": 3}}],
    )
    limiter = build_limiter(settings)
    assert limiter is not None
    (rule,) = limiter.rules_of("team-b")
    assert {str(k): v for k, v in rule.limits.items()} == {
        "requests_per_minute": 2,
        "tokens_per_day": 1,
    }


def test_an_anthropic_style_key_is_removed_too(
    gateway: ServerThread, simulator: ServerThread
) -> None:
    response = web.post(
        gateway.url + "/v1/messages",
        json={"model": "sim", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
        headers={
            "x-api-key": KEY_A,
            "x-request-id": "xapikey-a",
            "anthropic-version": "2023-06-01",
        },
        timeout=30,
    )
    assert response.status_code == 200, response.text
    seen = _seen_by_simulator(simulator, "xapikey-a")
    assert "x-api-key" not in seen
    assert "anthropic-version" in seen


def test_a_route_that_takes_client_keys_but_has_no_credential_is_named_at_start(
    simulator: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level("WARNING", logger="gateway"),
        gateway_for(simulator.url + "/v1", clients=CLIENTS[:1]),
    ):
        pass
    warnings = [r.getMessage() for r in caplog.records if "no credential_env" in r.getMessage()]
    assert warnings == [
        "route default: clients authenticate with gateway keys, which are not forwarded, "
        "and upstream(s) default have no credential_env: they get no credential"
    ]


def test_a_spent_budget_is_insufficient_quota_and_the_sdk_does_not_retry_it(
    simulator: ServerThread, issued: bool
) -> None:
    # 100 tokens: the second request (its input and 80 output) fits the budget itself,
    # not what the first one left of it
    clients = [{**CLIENTS[0], "limits": {"tokens_per_day": 100}}]
    with gateway_with_clients(simulator.url + "/v1", issued, clients) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY_A, max_retries=3)
        small = {"x-sim-tokens": "3"}
        client.chat.completions.create(**{**_chat(), "max_tokens": 5}, extra_headers=small)
        with pytest.raises(openai.RateLimitError) as raised:
            client.chat.completions.create(**{**_chat(), "max_tokens": 80}, extra_headers=small)
        text = web.get(server.url + "/metrics").text
    assert raised.value.code == "insufficient_quota"
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert "resets at" in raised.value.message
    # one refusal: the SDK's three retries were not spent on a budget that resets tomorrow
    assert (
        metric_value(
            text, "gateway_limited_requests_total", client="team-a", limit="tokens_per_day"
        )
        == 1
    )


@pytest.mark.parametrize(
    ("limits", "extra", "named"),
    [
        ({"tokens_per_minute": 500}, {}, "tokens_per_minute"),
        ({"tokens_per_day": 5000}, {"max_tokens": 10000}, "tokens_per_day"),
    ],
)
def test_a_request_larger_than_a_limit_itself_is_told_it_can_never_fit(
    simulator: ServerThread, limits: dict[str, int], extra: dict[str, Any], named: str
) -> None:
    """Issue 45 item 1: it was told to retry after 8 s (the openai SDK retried for 66 s),
    or that a budget untouched was spent; it gets its own refusal, never to be retried."""
    clients = [{**CLIENTS[0], "limits": limits}]
    with gateway_for(simulator.url + "/v1", clients=clients) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY_A, max_retries=3)
        with pytest.raises(openai.RateLimitError) as raised:
            client.chat.completions.create(**{**_chat(), **extra})
        text = web.get(server.url + "/metrics").text
    headers = raised.value.response.headers
    assert raised.value.code == "request_too_large"
    assert headers["x-should-retry"] == "false"
    assert "retry-after" not in headers
    assert "retry-after-ms" not in headers
    message = raised.value.message
    assert f"can never fit this client's {named} limit of {next(iter(limits.values()))}" in message
    assert re.search(r"it reserves \d+ input and \d+ output tokens", message), message
    assert "max_tokens" in message
    assert "default_output_reservation" in message
    assert 'budget_enforcement = "strict"' in message
    assert "retry after" not in message
    assert "is spent" not in message
    # refused once: the SDK spent none of its retries on it
    assert metric_value(text, "gateway_limited_requests_total", client="team-a", limit=named) == 1


def test_a_strict_client_fits_its_output_to_what_is_left_instead(simulator: ServerThread) -> None:
    clients = [{**CLIENTS[0], "limits": {"tokens_per_minute": 500}, "budget_enforcement": "strict"}]
    with gateway_for(simulator.url + "/v1", clients=clients) as server:
        response = _post(server, KEY_A, "strict-fits", _chat())
    assert response.status_code == 200, response.text
    assert annotation(response.content)["outcome"] == "complete"
