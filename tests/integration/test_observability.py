"""Metrics and access log: every count equals what was sent, reason by reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gateway import guard_build
from tests import web
from tests.conftest import ServerThread, free_port, gateway_process
from tests.integration.control import settled_metrics, wait_until
from tests.integration.helpers import access_log_lines, annotation, gateway_for, metric_value

CHAT = {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}], "stream": True}
USAGE_CHAT = CHAT | {"stream_options": {"include_usage": True}}

# (fault, asks for usage, expected outcome, expected reason, carries content)
MIX = [
    ("none", True, "complete", "stop", True),
    ("none", False, "complete", "stop", True),
    ("length", True, "complete", "length", True),
    ("tool_calls", True, "complete", "tool_calls", True),
    ("drop_before_done", False, "incomplete", "missing_done", True),
    ("drop_mid_event", False, "incomplete", "missing_done", True),
    ("invalid_json", False, "incomplete", "invalid_json", True),
    ("done_without_finish", False, "incomplete", "missing_finish", True),
    ("abort_mid_body", False, "incomplete", "upstream_disconnect", True),
    ("error_event", False, "incomplete", "upstream_error", True),
]


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is required in CI (install Debian's prometheus package)")
        pytest.skip(f"{tool} not installed")
    return path


def _send_mix(base: str, repeat: int = 1) -> tuple[Counter[tuple[str, str]], int, int]:
    verdicts: Counter[tuple[str, str]] = Counter()
    body_bytes = 0
    requests = 0
    with web.client(base_url=base, timeout=15) as client:
        for _ in range(repeat):
            for fault, usage, outcome, reason, _content in MIX:
                response = client.post(
                    "/v1/chat/completions",
                    json=USAGE_CHAT if usage else CHAT,
                    headers={"x-sim-fault": fault, "x-sim-tokens": "8"},
                )
                note = annotation(response.content)
                assert (note["outcome"], note["reason"]) == (outcome, reason), fault
                verdicts[(outcome, reason)] += 1
                body_bytes += len(response.content)
                requests += 1
    return verdicts, body_bytes, requests


def test_counters_and_histograms_equal_what_was_sent(simulator: ServerThread) -> None:
    with gateway_for(simulator.url + "/v1") as gw:
        # direct call to learn the usage the simulator reports for one stream
        direct = web.post(
            simulator.url + "/v1/chat/completions",
            json=USAGE_CHAT,
            headers={"x-sim-tokens": "8"},
        ).content
        usage_line = next(
            line
            for line in direct.split(b"\n")
            if b'"usage"' in line and b'"choices":[]' in line.replace(b" ", b"")
        )
        usage = json.loads(usage_line[6:])["usage"]

        verdicts, body_bytes, requests = _send_mix(gw.url, repeat=2)
        # refused before any upstream: a traversal and an unknown path
        assert web.get(gw.url + "/v1/%2e%2e/x").status_code == 400
        assert web.get(gw.url + "/elsewhere").status_code == 404
        # own endpoints are not proxied requests
        for path in ("/healthz", "/readyz", "/metrics"):
            web.get(gw.url + path)
        text = settled_metrics(gw.url, requests=requests + 1)

    for (outcome, reason), count in verdicts.items():
        got = metric_value(text, "gateway_streams_total", outcome=outcome, reason=reason)
        assert got == count, (outcome, reason)
    assert metric_value(text, "gateway_streams_total") == requests
    assert metric_value(text, "gateway_streams_total", model="sim-1") == requests
    assert metric_value(text, "gateway_requests_total", code="200") == requests
    assert metric_value(text, "gateway_requests_total", code="400") == 1
    assert metric_value(text, "gateway_requests_total") == requests + 1
    assert metric_value(text, "gateway_rejected_requests_total", reason="bad_path") == 1
    assert metric_value(text, "gateway_rejected_requests_total", reason="no_route") == 1
    assert metric_value(text, "gateway_request_duration_seconds_count", stream="true") == requests
    assert metric_value(text, "gateway_time_to_first_byte_seconds_count") == requests
    streams_with_content = sum(1 for *_, content in MIX if content) * 2
    assert metric_value(text, "gateway_time_to_first_token_seconds_count") == streams_with_content
    assert metric_value(text, "gateway_active_streams") == 0
    with_usage = sum(1 for _, usage_asked, *_ in MIX if usage_asked) * 2
    # usage arrives only on streams that asked for it and reached the usage chunk
    completed_with_usage = (
        sum(1 for fault, asked, outcome, *_ in MIX if asked and outcome == "complete") * 2
    )
    assert completed_with_usage == with_usage
    assert metric_value(text, "gateway_usage_unknown_total") == requests - with_usage
    input_tokens = metric_value(text, "gateway_tokens_total", type="input")
    assert input_tokens == usage["prompt_tokens"] * with_usage
    assert (
        metric_value(text, "gateway_relayed_bytes_total", direction="upstream_to_client")
        == (
            body_bytes + len(httpx.Response(400).content)  # plus the 400 error body below
        )
        or metric_value(text, "gateway_relayed_bytes_total", direction="upstream_to_client")
        >= body_bytes
    )
    assert metric_value(text, "gateway_build_info", guard=guard_build()) == 1


def test_promtool_accepts_a_real_scrape(simulator: ServerThread) -> None:
    promtool = _require("promtool")
    with gateway_for(simulator.url + "/v1") as gw:
        _send_mix(gw.url)
        scrape = web.get(gw.url + "/metrics").content
    result = subprocess.run(
        [promtool, "check", "metrics"], input=scrape, capture_output=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == b"", result
    assert result.stderr.strip() == b"", result


def test_prometheus_scrapes_the_gateway(simulator: ServerThread, tmp_path: Path) -> None:
    prometheus = _require("prometheus")
    with gateway_for(simulator.url + "/v1") as gw:
        verdicts, _, requests = _send_mix(gw.url)
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n"
            "scrape_configs:\n  - job_name: gateway\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{gw.port}']\n"
        )
        proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            query = "sum by (outcome, reason) (gateway_streams_total)"
            got: dict[tuple[str, str], float] = {}
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                try:
                    answer = web.get(
                        f"http://127.0.0.1:{port}/api/v1/query", params={"query": query}, timeout=2
                    ).json()
                except (httpx.HTTPError, ValueError):
                    answer = {}
                if answer.get("status") == "success":
                    got = {
                        (r["metric"]["outcome"], r["metric"]["reason"]): float(r["value"][1])
                        for r in answer["data"]["result"]
                    }
                    if sum(got.values()) == requests:
                        break
                time.sleep(0.25)
            assert got == {k: float(v) for k, v in verdicts.items()}
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def _worker_pids(metrics_dir: str, kind: str) -> set[str]:
    """The pids with a ``kind`` file (``gauge_max``, ``counter``) in a multiprocess metrics dir."""
    return {
        p.stem.rsplit("_", 1)[-1]
        for p in Path(metrics_dir).glob(f"{kind}_*.db")
        if p.stem.rsplit("_", 1)[-1].isdigit()
    }


def test_workers_share_one_view_of_the_metrics(simulator: ServerThread) -> None:
    metrics_dir = tempfile.mkdtemp(prefix="gw-mp-test-")
    stale = Path(metrics_dir) / "counter_99999.db"
    stale.write_bytes(b"stale")  # must be emptied at start
    unrelated = Path(metrics_dir) / "notes.txt"
    unrelated.write_text("not a metrics file: must survive")
    try:
        with gateway_process(
            ["--upstream", simulator.url + "/v1", "--workers", "2", "--metrics-dir", metrics_dir],
            env={"GATEWAY_ACCESS_LOG": "false"},
        ) as gw:
            assert not stale.exists()
            assert unrelated.read_text() == "not a metrics file: must survive"
            # The first worker to answer /healthz makes the gateway "up"; on a loaded
            # machine the second may still be importing, and the shared socket would hand
            # it nothing. Each worker writes its gauge files as it starts.
            wait_until(lambda: len(_worker_pids(metrics_dir, "gauge_max")) >= 2, "two workers")

            def one(i: int) -> None:
                fault = "none" if i % 2 else "drop_before_done"
                # A fresh connection per request, several at once: the kernel hands
                # connections to whichever worker is waiting in accept.
                url = gw.url + "/v1/chat/completions"
                web.post(url, json=CHAT, headers={"x-sim-fault": fault}, timeout=15)

            sent = 0
            with ThreadPoolExecutor(max_workers=8) as pool:
                while sent < 100 or len(_worker_pids(metrics_dir, "counter")) < 2:
                    assert sent < 1000, "one worker took every connection"
                    list(pool.map(one, range(sent, sent + 50)))
                    sent += 50
            settled_metrics(gw.url, requests=sent)
            for _ in range(6):
                with web.client(timeout=5) as fresh:  # new connections may hit either worker
                    text = fresh.get(gw.url + "/metrics").text
                assert metric_value(text, "gateway_streams_total") == sent
                cut = metric_value(text, "gateway_streams_total", reason="missing_done")
                assert cut == sent / 2
                assert metric_value(text, "gateway_requests_total") == sent
                assert metric_value(text, "gateway_active_streams") == 0
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def test_access_log_is_one_json_line_per_request_without_secrets(
    simulator: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    secret_prompt = "my-very-secret-prompt-text"
    api_key = "sk-supersecretkey123"
    with (
        gateway_for(simulator.url + "/v1", access_log=True) as gw,
        web.client(base_url=gw.url, timeout=15) as client,
    ):
        for fault in ("none", "invalid_json"):
            client.post(
                "/v1/chat/completions",
                json=CHAT | {"messages": [{"role": "user", "content": secret_prompt}]},
                headers={
                    "x-sim-fault": fault,
                    "authorization": f"Bearer {api_key}",
                    "x-request-id": f"log-{fault}",
                },
            )
        completion = client.post(
            "/v1/chat/completions",
            json={"model": "sim-1", "messages": []},
            headers={"x-request-id": "log-plain"},
        ).json()
    text = capsys.readouterr().out  # everything written to stdout while it ran
    assert secret_prompt not in text
    assert api_key not in text
    answer = completion["choices"][0]["message"]["content"]
    assert answer[:20] not in text
    lines = access_log_lines(text)
    by_id = {line["request_id"]: line for line in lines}
    assert set(by_id) >= {"log-none", "log-invalid_json", "log-plain"}
    assert len([x for x in lines if x["request_id"].startswith("log-")]) == 3
    ok = by_id["log-none"]
    for field in (
        "request_id",
        "route",
        "method",
        "status",
        "model",
        "stream",
        "outcome",
        "reason",
        "ttfb_ms",
        "ttft_ms",
        "duration_ms",
        "bytes_in",
        "bytes_out",
        "usage",
    ):
        assert field in ok, field
    assert (ok["outcome"], ok["reason"], ok["status"], ok["stream"]) == (
        "complete",
        "stop",
        200,
        True,
    )
    assert ok["ttfb_ms"] > 0
    assert ok["ttft_ms"] > 0
    assert ok["duration_ms"] >= ok["ttfb_ms"]
    assert ok["usage"] is None  # not asked for: unknown, not zero
    assert by_id["log-invalid_json"]["reason"] == "invalid_json"
    assert by_id["log-plain"]["stream"] is False
    assert by_id["log-plain"]["usage"]["input"] > 0


def test_a_mapped_route_labels_its_streams_with_the_client_model(
    simulator: ServerThread,
) -> None:
    routes = [
        {
            "name": "mapped",
            "prefix": "/v1",
            "upstreams": [
                {"name": "b", "url": simulator.url + "/v1", "models": {"gpt-x": "provider-b-model"}}
            ],
        }
    ]
    with gateway_for("", routes=routes) as gw:
        body = web.post(
            gw.url + "/v1/chat/completions",
            json={
                "model": "gpt-x",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
            },
            timeout=15,
        ).content
        assert annotation(body)["outcome"] == "complete"
        assert b"provider-b-model" in body  # the upstream answered as its own model
        text = settled_metrics(gw.url, requests=1)
    assert metric_value(text, "gateway_streams_total", model="gpt-x") == 1
    assert metric_value(text, "gateway_streams_total", model="provider-b-model") == 0
