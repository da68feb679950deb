"""``process_*`` and ``python_*`` on /metrics (one process, and per worker with several),
and request-duration buckets that reach the longest total deadline."""

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
