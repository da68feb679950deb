"""Gemini end to end: the real google-genai SDK through a real gateway to the simulator.

A complete stream reads cleanly (no comment line: the SDK rejects one) and
is counted complete; every cut raises ``google.genai.errors.APIError`` with
the reason reachable from ``err.details``; the stream request is recognised
from its URL, so it is counted and capped at admission like any other; the
route's credential goes upstream as ``x-goog-api-key``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from gateway.app import create_app
from gateway.settings import load_settings
from gateway.simulator import expected_text
from tests import web
from tests.conftest import ServerThread, running
from tests.integration.helpers import access_log_lines, gateway_for, metric_value
from tests.sdk import genai, genai_errors, genai_types

pytestmark = pytest.mark.timeout(120)

MODEL = "gemini-2.5-flash"
STREAM_PATH = f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"


def _routes(upstream: str, **extra: object) -> list[dict[str, object]]:
    return [{"name": "gemini", "prefix": "/v1beta", "upstream": upstream, **extra}]


@pytest.fixture(scope="module")
def gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    return {"routes": _routes(simulator.url + "/v1beta")}


def _client(gw: ServerThread, **headers: str) -> genai.Client:
    options = genai_types.HttpOptions(
        base_url=gw.url, api_version="v1beta", headers=headers or None
    )
    return genai.Client(api_key="client-key", http_options=options)


def test_a_complete_stream_reads_cleanly_and_is_counted(gateway: ServerThread) -> None:
    with _client(gateway) as client:
        chunks = list(client.models.generate_content_stream(model=MODEL, contents="hi"))
        answer = client.models.generate_content(model=MODEL, contents="hi")
    assert "".join(chunk.text or "" for chunk in chunks) == expected_text(20)
    assert answer.text == expected_text(20)
    raw = web.post(gateway.url + STREAM_PATH, json={"contents": []}, timeout=30)
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert b"\n:" not in raw.content  # no comment line
    assert not raw.content.startswith(b":")
    metrics = web.get(gateway.url + "/metrics").text
    complete = metric_value(
        metrics, "gateway_streams_total", route="gemini", outcome="complete", reason="stop"
    )
    assert complete >= 2
    assert metric_value(metrics, "gateway_tokens_total", route="gemini", type="output") >= 40


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("drop_after_text", "missing_done"),
        ("drop_mid_event", "missing_done"),
        ("abort_mid_body", "upstream_disconnect"),
        ("invalid_json", "invalid_json"),
        ("content_after_finish", "content_after_finish"),
    ],
)
def test_every_cut_raises_with_the_reason(gateway: ServerThread, fault: str, reason: str) -> None:
    with (
        _client(gateway, **{"x-sim-fault": fault}) as client,
        pytest.raises(genai_errors.APIError) as caught,
    ):
        for _ in client.models.generate_content_stream(model=MODEL, contents="hi"):
            pass
    details = caught.value.details
    assert isinstance(details, dict)
    (info,) = [d for d in details["error"]["details"] if d["@type"].endswith("ErrorInfo")]
    assert info["metadata"]["reason"] == reason
    assert info["domain"] == "gateway"
    metrics = web.get(gateway.url + "/metrics").text
    assert metric_value(metrics, "gateway_streams_total", route="gemini", reason=reason) >= 1


def test_the_stream_is_known_from_its_url_before_any_answer(dead_port: int) -> None:
    dead = f"http://127.0.0.1:{dead_port}/v1beta"  # nothing listens there
    with gateway_for("", routes=_routes(dead)) as gw:
        response = web.post(gw.url + STREAM_PATH, json={"contents": []}, timeout=30)
        assert response.status_code == 502
        metrics = web.get(gw.url + "/metrics").text
    streams = metric_value(
        metrics, "gateway_streams_total", route="gemini", reason="upstream_unavailable"
    )
    assert streams == 1  # counted as a stream though its body never said "stream"


def test_gemini_streams_are_capped_at_admission(simulator: ServerThread) -> None:
    routes = _routes(simulator.url + "/v1beta", max_concurrent_streams=1)
    with gateway_for("", routes=routes) as gw:
        held = {"x-sim-fault": "heartbeats_forever"}
        with web.stream(
            "POST", gw.url + STREAM_PATH, json={"contents": []}, headers=held, timeout=30
        ) as first:
            assert first.status_code == 200
            body = first.iter_raw()  # kept: a dropped iterator closes the response
            next(body)  # the first stream is open (heartbeats) and counted
            second = web.post(gw.url + STREAM_PATH, json={"contents": []}, timeout=30)
            assert second.status_code == 503
            error = second.json()["error"]  # Google's shape: the route speaks Gemini
            assert (error["code"], error["status"]) == (503, "UNAVAILABLE")
            assert error["details"][0]["metadata"]["reason"] == "overloaded"


def test_the_route_credential_goes_as_x_goog_api_key(
    simulator: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GW_TEST_GEMINI_KEY", "upstream-secret")
    settings = load_settings(
        routes=_routes(
            simulator.url + "/v1beta", credential_env="GW_TEST_GEMINI_KEY", protocol="gemini"
        ),
        access_log=False,
    )
    with running(create_app(settings)) as gw, _client(gw, **{"x-request-id": "gem-cred"}) as c:
        chunks = list(c.models.generate_content_stream(model=MODEL, contents="hi"))
    assert "".join(chunk.text or "" for chunk in chunks) == expected_text(20)
    seen = web.get(simulator.url + "/_sim/requests/gem-cred").json()
    key = seen["headers"]["x-goog-api-key"]
    assert key["sha256"] == hashlib.sha256(b"upstream-secret").hexdigest()  # not the client's
    assert "authorization" not in seen["headers"]


def test_the_access_log_names_the_model_from_the_url(
    simulator: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    """Gemini names its model in the URL, not the body: the log line has it all the same."""
    with (
        gateway_for("", routes=_routes(simulator.url + "/v1beta"), access_log=True) as gw,
        _client(gw, **{"x-request-id": "gemini-model-1"}) as client,
    ):
        list(client.models.generate_content_stream(model=MODEL, contents="hi"))
        client.models.generate_content(model="models/gemini-2.0-flash", contents="hi")
    lines = [line for line in access_log_lines(capsys.readouterr().out) if line["route"]]
    assert [(line["stream"], line["model"]) for line in lines] == [
        (True, MODEL),
        (False, "gemini-2.0-flash"),
    ]


def test_serve_simulator_has_a_gemini_route_and_a_404_in_googles_shape() -> None:
    """Issue 45 item 13: ``gateway serve --simulator`` had no Gemini route, and its 404
    was OpenAI's shape, so google-genai showed only "404 Not Found"."""
    with gateway_for("", simulator=True) as gw:
        with _client(gw) as client:
            chunks = list(client.models.generate_content_stream(model=MODEL, contents="hi"))
        assert "".join(chunk.text or "" for chunk in chunks) == expected_text(20)
        streams = web.get(gw.url + "/metrics").text
        assert metric_value(streams, "gateway_streams_total", route="simulator-gemini") == 1
        options = genai_types.HttpOptions(base_url=gw.url + "/nowhere", api_version="v1beta")
        with (
            genai.Client(api_key="k", http_options=options) as lost,
            pytest.raises(genai_errors.ClientError) as raised,
        ):
            lost.models.generate_content(model=MODEL, contents="hi")
        assert raised.value.code == 404
        assert raised.value.message is not None
        assert "No route for this path" in raised.value.message
