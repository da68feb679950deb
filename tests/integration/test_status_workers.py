"""``/status`` with ``--workers 2``: every worker's page shows every worker's requests.

Requests go over fresh connections until both workers have served cut streams
(each worker's share in the metrics directory says which it served); then every
page, whichever worker answers it, lists all of them.
"""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

from tests import web
from tests.conftest import ServerThread, gateway_process
from tests.integration.control import WAIT_SECONDS, gated_upstream, wait_until
from tests.integration.helpers import metric_value

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _shares(directory: Path) -> dict[int, set[str]]:
    """Each worker's cut request ids, from its share of the page."""
    found = {}
    for path in directory.glob("gateway-status-*.json"):
        try:
            share = json.loads(path.read_text())
        except ValueError:  # replaced while read: the next look sees it whole
            continue
        found[share["pid"]] = {row[1] for row in share["incomplete"]}
    return found


def test_every_worker_shows_every_workers_counts_and_cut_streams(simulator: ServerThread) -> None:
    metrics_dir = Path(tempfile.mkdtemp(prefix="gw-status-workers-"))
    (metrics_dir / "gateway-status-1.json").write_text("{}")  # a stale share: removed at start
    try:
        with gateway_process(
            [
                "--upstream",
                simulator.url + "/v1",
                "--workers",
                "2",
                "--metrics-dir",
                str(metrics_dir),
            ],
            env={"GATEWAY_ACCESS_LOG": "false", "GATEWAY_STATUS_PAGE": "true"},
        ) as gw:
            gw.wait_stderr(b"Application startup complete.", count=2)
            assert not (metrics_dir / "gateway-status-1.json").exists()
            sent: list[str] = []
            deadline = time.monotonic() + WAIT_SECONDS
            while True:
                for _ in range(4):
                    rid = f"cut-{len(sent)}"
                    with web.client(timeout=15) as fresh:  # a new connection: either worker
                        fresh.post(
                            gw.url + "/v1/chat/completions",
                            json=CHAT,
                            headers={"x-sim-fault": "drop_before_done", "x-request-id": rid},
                        )
                    sent.append(rid)
                time.sleep(1.2)  # a share is written once a second
                shares = _shares(metrics_dir)
                if len([ids for ids in shares.values() if ids]) >= 2:
                    break
                assert time.monotonic() < deadline, f"one worker took every request: {shares}"
            wait_until(
                lambda: set().union(*_shares(metrics_dir).values()) == set(sent), "shares written"
            )
            for _ in range(6):
                with web.client(timeout=15) as fresh:
                    page = fresh.get(gw.url + "/status").text
                assert "Counts and streams are those of all 2 worker processes." in page
                missing = [rid for rid in sent if rid not in page]
                assert missing == [], missing
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _stream_in_thread(url: str, gate: str, results: dict[str, int]) -> threading.Thread:
    def read() -> None:
        try:
            with web.client(timeout=WAIT_SECONDS) as client:
                response = client.post(url, json=CHAT | {"model": "m"}, headers={"x-gate": gate})
                results[gate] = response.status_code
        except httpx.HTTPError:
            results[gate] = -1  # its worker was killed under it

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_a_killed_worker_leaves_the_live_gauges(tmp_path: Path) -> None:
    """Two workers, six streams held open; the worker holding most of them is killed
    with SIGKILL. Once the rest have ended, both live gauges are back at 0."""
    with (
        gated_upstream() as upstream,
        gateway_process(
            [
                "--upstream",
                upstream.url + "/v1",
                "--workers",
                "2",
                "--metrics-dir",
                str(tmp_path / "metrics"),
            ],
            env={"GATEWAY_ACCESS_LOG": "false"},
        ) as gw,
    ):
        gw.wait_stderr(b"Application startup complete.", count=2)
        results: dict[str, int] = {}
        gates = [f"w{index}" for index in range(6)]
        threads = [_stream_in_thread(gw.url + "/v1/chat/completions", g, results) for g in gates]
        for gate in gates:
            assert upstream.gate(gate).reached.wait(WAIT_SECONDS), gate

        def held(process: psutil.Process) -> int:
            return sum(
                1
                for c in process.net_connections("tcp")
                if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == gw.port
            )

        workers = psutil.Process(gw.proc.pid).children()
        victim = max(workers, key=held)
        assert held(victim) >= 1
        text = web.get(gw.url + "/metrics").text
        assert metric_value(text, "gateway_active_streams") == 6
        victim.send_signal(signal.SIGKILL)
        victim.wait(WAIT_SECONDS)
        gw.wait_stderr(b"Application startup complete.", count=3)  # its replacement
        upstream.open_all()
        for thread in threads:
            thread.join(WAIT_SECONDS)

        def settled() -> str | None:
            text = web.get(gw.url + "/metrics").text
            live = metric_value(text, "gateway_active_streams") + metric_value(
                text, "gateway_upstream_active_streams"
            )
            return text if live == 0 else None

        wait_until(settled, "both live gauges back at 0")
    statuses = list(results.values())
    assert statuses.count(-1) >= 1  # the killed worker's, cut
    assert statuses.count(200) + statuses.count(-1) == 6
