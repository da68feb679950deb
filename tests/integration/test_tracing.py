"""OpenTelemetry traces, end to end: a real gateway exports to a real OTLP/HTTP receiver.

The receiver (``otlp_receiver.py``) decodes what the SDK's exporter sends
with ``opentelemetry-proto``. The trace context that reaches the upstream is
read on the upstream's side: the simulator records each request's headers
(``GET /_sim/requests/{x-request-id}``). The exporter, sampler and service
name are configured as an operator would, through the SDK's own ``OTEL_*``
variables.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import web
from tests.conftest import ServerThread, gateway_process
from tests.integration.helpers import annotation, gateway_for
from tests.integration.otlp_receiver import (
    SPAN_KIND_SERVER,
    STATUS_ERROR,
    STATUS_UNSET,
    Receiver,
    otlp_receiver,
)

ROOT = Path(__file__).resolve().parents[2]
SECRET_PROMPT = "tell-nobody-this-prompt-7f3a"
CHAT = {
    "model": "sim-1",
    "messages": [{"role": "user", "content": SECRET_PROMPT}],
    "stream": True,
    "stream_options": {"include_usage": True},
}
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def _traceparent(
    trace_id: str = CLIENT_TRACE, span_id: str = CLIENT_SPAN, flags: str = "01"
) -> str:
    return f"00-{trace_id}-{span_id}-{flags}"


def _parse_traceparent(value: str) -> tuple[str, str, str]:
    version, trace_id, span_id, flags = value.split("-")
    assert version == "00", value
    return trace_id, span_id, flags


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    """A receiver, and the SDK's variables pointing at it (read when the app is built)."""
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # ms: spans arrive soon
        monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-under-test")
        monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
        monkeypatch.delenv("OTEL_TRACES_SAMPLER_ARG", raising=False)
        yield receiver


def _routes(simulator: ServerThread, dead_port: int) -> list[dict[str, Any]]:
    return [
        {"name": "sim", "prefix": "/v1", "upstream": simulator.url + "/v1"},
        {"name": "dead", "prefix": "/dead/v1", "upstream": f"http://127.0.0.1:{dead_port}/v1"},
    ]


def _upstream_headers(simulator: ServerThread, request_id: str) -> dict[str, Any]:
    response = web.get(f"{simulator.url}/_sim/requests/{request_id}")
    assert response.status_code == 200, response.text
    headers: dict[str, Any] = response.json()["headers"]
    return headers


def _stream(base: str, path: str, request_id: str, fault: str = "none", **headers: str) -> bytes:
    response = web.post(
        base + path,
        json=CHAT,
        headers={"x-request-id": request_id, "x-sim-fault": fault, "x-sim-tokens": "6", **headers},
        timeout=15,
    )
    return response.content


def test_complete_cut_and_failed_streams_become_spans_with_their_parentage(
    simulator: ServerThread, receiver: Receiver, dead_port: int
) -> None:
    with gateway_for("", routes=_routes(simulator, dead_port), tracing={"enabled": True}) as gw:
        complete = _stream(
            gw.url, "/v1/chat/completions", "tr-complete", traceparent=_traceparent()
        )
        cut = _stream(gw.url, "/v1/chat/completions", "tr-cut", "drop_before_done")
        failed = _stream(gw.url, "/dead/v1/chat/completions", "tr-failed")
        spans = receiver.wait_for("tr-complete", "tr-cut", "tr-failed")
        upstream_complete = _upstream_headers(simulator, "tr-complete")
        upstream_cut = _upstream_headers(simulator, "tr-cut")

    assert annotation(complete)["outcome"] == "complete"
    assert annotation(cut)["reason"] == "missing_done"
    assert json.loads(failed)["error"]["code"] == "upstream_unavailable"

    # -- the complete stream: the client's trace is the parent, GenAI attributes --------
    span = spans["tr-complete"]
    assert span.kind == SPAN_KIND_SERVER
    assert (span.trace_id, span.parent_span_id) == (CLIENT_TRACE, CLIENT_SPAN)
    assert span.name == "chat sim-1"
    assert span.status_code == STATUS_UNSET
    attributes = span.attributes
    expected = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "sim-1",
        "gen_ai.response.finish_reasons": ["stop"],
        "gateway.outcome": "complete",
        "gateway.reason": "stop",
        "gateway.route": "sim",
        "gateway.upstream": "sim",
        "gateway.request_id": "tr-complete",
        "gateway.client": "anonymous",
        "gateway.stream": True,
        "http.request.method": "POST",
        "http.response.status_code": 200,
        "http.response.body.size": len(complete),
    }
    assert {key: attributes.get(key) for key in expected} == expected
    assert attributes["gen_ai.response.model"]  # as the simulator's chunks named it
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["gen_ai.usage.output_tokens"] > 0
    assert "error.type" not in attributes
    assert "server.address" not in attributes  # not unless the operator allows it
    ttft = attributes["gateway.time_to_first_token"]
    assert 0 < ttft < (span.end_ns - span.start_ns) / 1e9
    ((event_name, event_ns, event_attributes),) = span.events
    assert event_name == "gateway.first_token"
    assert event_attributes == {"gateway.time_to_first_token": ttft}
    assert span.start_ns < event_ns < span.end_ns
    assert abs(event_ns - (span.start_ns + ttft * 1e9)) < 1e6  # the event is at the token
    assert span.resource["service.name"] == "gateway-under-test"
    assert span.resource["service.version"]

    # -- what reached the upstream: the gateway's span as the parent, in the client's trace
    trace_id, parent_id, flags = _parse_traceparent(upstream_complete["traceparent"])
    assert (trace_id, parent_id, flags) == (CLIENT_TRACE, span.span_id, "01")
    assert parent_id != CLIENT_SPAN  # the client's own header was replaced, not passed on

    # -- the cut stream: ERROR with the reason, its own root trace, carried upstream ----
    cut_span = spans["tr-cut"]
    assert cut_span.parent_span_id == ""
    assert cut_span.status_code == STATUS_ERROR
    assert cut_span.status_message == "missing_done"
    assert cut_span.attributes["gateway.outcome"] == "incomplete"
    assert cut_span.attributes["gateway.reason"] == "missing_done"
    assert cut_span.attributes["error.type"] == "missing_done"
    assert _parse_traceparent(upstream_cut["traceparent"])[:2] == (
        cut_span.trace_id,
        cut_span.span_id,
    )

    # -- failed before any upstream answered: still one span, ERROR ---------------------
    failed_span = spans["tr-failed"]
    assert failed_span.status_code == STATUS_ERROR
    assert failed_span.status_message == "upstream_unavailable"
    assert failed_span.attributes["gateway.route"] == "dead"
    assert failed_span.attributes["http.response.status_code"] == 502
    assert failed_span.attributes["gateway.error"] == "connect_error"
    assert "gateway.time_to_first_token" not in failed_span.attributes
    assert failed_span.events == []

    # -- never content: neither the prompt nor a word of the answer went to the receiver
    exported = b"".join(receiver.bodies)
    assert SECRET_PROMPT.encode() not in exported
    answer = b"".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content", "").encode()
        for line in complete.split(b"\n")
        if line.startswith(b"data: {") and b'"choices":[{' in line.replace(b" ", b"")
    )
    assert answer
    assert answer not in exported
    for word in answer.split():
        if len(word) > 6:
            assert word not in exported, word


def test_a_client_cannot_switch_sampling_off_when_the_operator_forces_it_on(
    simulator: ServerThread, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    with gateway_for(simulator.url + "/v1", tracing={"enabled": True}) as gw:
        _stream(
            gw.url, "/v1/chat/completions", "tr-unsampled", traceparent=_traceparent(flags="00")
        )
        spans = receiver.wait_for("tr-unsampled")
        upstream = _upstream_headers(simulator, "tr-unsampled")
    span = spans["tr-unsampled"]
    assert (span.trace_id, span.parent_span_id) == (CLIENT_TRACE, CLIENT_SPAN)
    assert _parse_traceparent(upstream["traceparent"]) == (CLIENT_TRACE, span.span_id, "01")


def test_the_default_sampler_follows_the_parent_and_still_propagates(
    simulator: ServerThread, receiver: Receiver
) -> None:
    """parentbased_always_on (the SDK's default): a client's ``-00`` is not exported, but
    the trace still goes upstream, unsampled; a request without a parent is sampled."""
    with gateway_for(simulator.url + "/v1", tracing={"enabled": True}) as gw:
        _stream(
            gw.url, "/v1/chat/completions", "tr-parent-00", traceparent=_traceparent(flags="00")
        )
        _stream(gw.url, "/v1/chat/completions", "tr-no-parent")
        spans = receiver.wait_for("tr-no-parent")
        upstream = _upstream_headers(simulator, "tr-parent-00")
    # An unsampled span never reaches the exporter; the later one shows the export ran.
    assert "tr-parent-00" not in spans
    trace_id, span_id, flags = _parse_traceparent(upstream["traceparent"])
    assert (trace_id, flags) == (CLIENT_TRACE, "00")
    assert span_id != CLIENT_SPAN


def test_the_upstream_host_is_recorded_only_when_allowed(
    simulator: ServerThread, receiver: Receiver
) -> None:
    with gateway_for(simulator.url + "/v1", tracing={"enabled": True, "upstream_host": True}) as gw:
        _stream(gw.url, "/v1/chat/completions", "tr-host")
        spans = receiver.wait_for("tr-host")
    attributes = spans["tr-host"].attributes
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["server.port"] == simulator.port


def test_messages_and_refused_requests_are_spans_too(
    simulator: ServerThread, receiver: Receiver
) -> None:
    messages = {
        "model": "sim-claude",
        "max_tokens": 1000,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    with gateway_for(
        simulator.url + "/v1", tracing={"enabled": True}, limits={"max_request_bytes": 4096}
    ) as gw:
        ok = web.post(
            gw.url + "/v1/messages", json=messages, headers={"x-request-id": "tr-messages"}
        )
        assert annotation(ok.content)["outcome"] == "complete"
        big = web.post(
            gw.url + "/v1/chat/completions",
            content=b"{" + b" " * 8000 + b"}",
            headers={"x-request-id": "tr-too-big", "content-type": "application/json"},
        )
        assert big.status_code == 413
        spans = receiver.wait_for("tr-messages", "tr-too-big")
    assert spans["tr-messages"].name == "chat sim-claude"
    assert spans["tr-messages"].attributes["gen_ai.provider.name"] == "anthropic"
    assert spans["tr-messages"].attributes["gen_ai.response.finish_reasons"] == ["end_turn"]
    refused = spans["tr-too-big"]
    assert refused.name == "POST default"
    assert refused.attributes["gateway.rejected"] == "body_too_large"
    assert refused.attributes["http.response.status_code"] == 413
    assert "gen_ai.operation.name" not in refused.attributes
    assert refused.status_code == STATUS_UNSET  # no stream, so no incomplete outcome


# ------------------------------------------------------------ a dead collector


def test_a_collector_that_never_answers_costs_spans_not_streams_nor_the_exit(
    simulator: ServerThread,
) -> None:
    """The collector accepts connections and never answers: streams still complete,
    and the gateway still stops promptly on SIGTERM (the export's flush is bounded)."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)  # connections complete in the backlog; nothing ever reads them
        endpoint = f"http://127.0.0.1:{hole.getsockname()[1]}"
        env = {
            "GATEWAY_TRACING__ENABLED": "true",
            "GATEWAY_ACCESS_LOG": "false",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_TIMEOUT": "30",
            "OTEL_BSP_SCHEDULE_DELAY": "10",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4",
        }
        with gateway_process(["--upstream", simulator.url + "/v1"], env=env) as gw:
            for index in range(40):
                body = _stream(gw.url, "/v1/chat/completions", f"tr-dead-{index}")
                assert annotation(body)["outcome"] == "complete"
            gw.proc.terminate()
            # The lifespan gives the exporter 5 s; the drain has nothing to wait for.
            gw.proc.wait(timeout=20)
            assert gw.proc.returncode == 0


# ------------------------------------------------------------ imports and configuration


_BLOCK_OPENTELEMETRY = """
import sys

class NoOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoOpenTelemetry())
from gateway.cli import main
main(sys.argv[1:])
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OTEL_"))}
    env.update(extra)
    return env


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_tracing_without_the_extra_is_a_configuration_error(command: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _BLOCK_OPENTELEMETRY, command, "--upstream", "http://u.test/v1"],
        env=_env(GATEWAY_TRACING__ENABLED="true"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "tracing.enabled (environment variable GATEWAY_TRACING__ENABLED)" in result.stderr
    assert "pip install 'llm-stream-gateway[otel]'" in result.stderr


def test_without_the_extra_and_without_tracing_the_configuration_loads() -> None:
    """The refusal above is for tracing only: without the variable, the same command
    (opentelemetry blocked as above) loads the configuration."""
    fine = subprocess.run(
        [
            sys.executable,
            "-c",
            _BLOCK_OPENTELEMETRY,
            "check-config",
            "--upstream",
            "http://u.test/v1",
        ],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert fine.returncode == 0, fine.stderr
    assert json.loads(fine.stdout)["tracing"] == {"enabled": False, "upstream_host": False}


_SERVE_AND_LIST_MODULES = """
import sys
import httpx
from gateway.app import create_app
from gateway.settings import load_settings
from gateway.simulator import create_simulator_app
from tests.conftest import running

with running(create_simulator_app()) as simulator:
    settings = load_settings(upstream_url=simulator.url + "/v1", status_page=True)
    with running(create_app(settings)) as gateway:
        body = httpx.post(
            gateway.url + "/v1/chat/completions",
            json={"model": "m", "stream": True, "messages": []},
            headers={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
        ).content
        assert b"outcome=complete" in body, body
        assert httpx.get(gateway.url + "/status").status_code == 200
print(sorted(name for name in sys.modules if name.startswith("opentelemetry")))
"""


def test_without_tracing_nothing_of_opentelemetry_is_imported() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _SERVE_AND_LIST_MODULES],
        env=_env(GATEWAY_ACCESS_LOG="false"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
