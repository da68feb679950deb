"""``process_*`` and ``python_*`` on /metrics (one process, and per worker with several),
request-duration buckets that reach the longest total deadline, and time-to-first-token
(and first-byte) buckets that reach the longest first-byte deadline."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile

from tests import web
from tests.conftest import ServerThread, gateway_process
from tests.integration.control import settled_metrics
from tests.integration.helpers import gateway_for, metric_value

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _buckets(text: str, name: str) -> list[float]:
    bounds = re.findall(rf'^{name}_bucket{{[^}}]*le="([^"]+)"', text, re.MULTILINE)
    return sorted({float(b) for b in bounds if b != "+Inf"})


def test_one_process_shows_its_process_and_python_metrics(simulator: ServerThread) -> None:
    routes = [
        {"name": "short", "prefix": "/v1", "upstream": simulator.url + "/v1"},
        {
            "name": "long",
            "prefix": "/long/v1",
            "upstream": simulator.url + "/v1",
            "timeouts": {"total": 7200},
        },
    ]
    with gateway_for("", routes=routes) as gw:
        assert web.post(gw.url + "/v1/chat/completions", json=CHAT).status_code == 200
        text = web.get(gw.url + "/metrics").text
    assert metric_value(text, "process_resident_memory_bytes") > 0
    assert metric_value(text, "process_open_fds") > 0
    assert metric_value(text, "python_info") == 1
    assert "python_gc_objects_collected_total{" in text
    bounds = _buckets(text, "gateway_request_duration_seconds")
    assert bounds[:14][-1] == 81.92  # the GenAI conventions' own, then doubled on
    assert bounds[-1] >= 7200 > bounds[-2]


# OpenTelemetry GenAI semantic conventions, gen_ai.server.time_to_first_token: the
# explicit bucket boundaries the convention advises (they stop at 10 s).
GENAI_TIME_TO_FIRST_TOKEN = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
]  # fmt: skip


def test_first_token_buckets_reach_the_longest_first_byte_deadline(
    simulator: ServerThread,
) -> None:
    """A provider may take until the first-byte deadline (300 s by default) to answer: the
    time-to-first-token and first-byte histograms have buckets up to it, past the GenAI
    convention's 10 s, so that a slow first token is not lost in +Inf."""
    routes = [
        {"name": "default", "prefix": "/v1", "upstream": simulator.url + "/v1"},
        {
            "name": "patient",
            "prefix": "/patient/v1",
            "upstream": simulator.url + "/v1",
            "timeouts": {"first_byte": 900},
        },
    ]
    with gateway_for("", routes=routes) as gw:
        assert web.post(gw.url + "/v1/chat/completions", json=CHAT).status_code == 200
        text = web.get(gw.url + "/metrics").text
    for name in ("gateway_time_to_first_token_seconds", "gateway_time_to_first_byte_seconds"):
        bounds = _buckets(text, name)
        assert bounds[: len(GENAI_TIME_TO_FIRST_TOKEN)] == GENAI_TIME_TO_FIRST_TOKEN, name
        assert bounds[-1] >= 900 > bounds[-2], (name, bounds)
    # one upstream of a pool with a deadline of its own, longer still
    pool = {
        "name": "pool",
        "prefix": "/pool/v1",
        "upstreams": [
            {"name": "fast", "url": simulator.url + "/v1"},
            {"name": "slow", "url": simulator.url + "/v1", "timeouts": {"first_byte": 2000}},
        ],
    }
    with gateway_for("", routes=[*routes, pool]) as gw:
        assert web.post(gw.url + "/v1/chat/completions", json=CHAT).status_code == 200
        bounds = _buckets(web.get(gw.url + "/metrics").text, "gateway_time_to_first_token_seconds")
    assert bounds[-1] >= 2000 > bounds[-2], bounds
    # the default deadline alone: the top bucket reaches 300 s
    with gateway_for(simulator.url + "/v1") as gw:
        assert web.post(gw.url + "/v1/chat/completions", json=CHAT).status_code == 200
        bounds = _buckets(web.get(gw.url + "/metrics").text, "gateway_time_to_first_token_seconds")
    assert bounds[-1] >= 300 > bounds[-2], bounds


def test_active_streams_are_exposed_at_zero_before_the_first_stream(
    simulator: ServerThread,
) -> None:
    """An autoscaler reads gateway_active_streams per pod (config/kubernetes): a pod that
    has served no stream yet shows 0 for each route, not nothing."""
    routes = [
        {"name": "a", "prefix": "/v1", "upstream": simulator.url + "/v1"},
        {"name": "b", "prefix": "/b/v1", "upstream": simulator.url + "/v1"},
    ]
    with gateway_for("", routes=routes) as gw:
        text = web.get(gw.url + "/metrics").text
    samples = re.findall(r'^gateway_active_streams\{route="(\w+)"\} (\S+)$', text, re.M)
    assert sorted(samples) == [("a", "0.0"), ("b", "0.0")], text


def test_several_workers_each_show_their_process_metrics(simulator: ServerThread) -> None:
    metrics_dir = tempfile.mkdtemp(prefix="gw-runtime-test-")
    try:
        with gateway_process(
            ["--upstream", simulator.url + "/v1", "--workers", "2", "--metrics-dir", metrics_dir],
            env={"GATEWAY_ACCESS_LOG": "false"},
        ) as gw:
            gw.wait_stderr(b"Application startup complete.", count=2)
            with web.client(base_url=gw.url, timeout=15) as client:
                for _ in range(10):
                    client.post("/v1/chat/completions", json=CHAT)
            settled_metrics(gw.url, requests=10)
            with web.client(timeout=5) as fresh:
                scrape = fresh.get(gw.url + "/metrics").content
            text = scrape.decode()
            pids = set(re.findall(r'^process_resident_memory_bytes{pid="(\d+)"}', text, re.M))
            assert len(pids) == 2, text
            assert str(gw.proc.pid) not in pids  # the workers, not the supervisor
            promtool = shutil.which("promtool")
            if promtool is not None:
                result = subprocess.run(
                    [promtool, "check", "metrics"], input=scrape, capture_output=True, timeout=30
                )
                assert result.returncode == 0, result.stdout + result.stderr
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
