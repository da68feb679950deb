"""What all streams hold of unfinished events, bounded (issue 45 item 5), driven at its worst.

Twenty concurrent Chat streams each carry one 15 MiB event (``max_event_bytes`` is
16 MiB: each alone is allowed). Unbounded, they took a fresh worker from 62 to 838
MiB. ``limits.max_partial_event_bytes`` (32 MiB) bounds what they hold together: the
streams past it end ``limit_exceeded``, counted, and the worker's peak stays within
the figure docs/deployment.md's memory table gives for it: the bound, the event that
completes judged at 4 times its size (at most the bound), and a judged event its client
has not read yet, 6 times the bound (measured 3.3 to 5.1; before the guard held a
large event once and large buffers were given back when freed, 6 to 11).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tests import web
from tests.conftest import ServerThread, gateway_process
from tests.integration.helpers import annotation, metric_value

MIB = 1024 * 1024
CHAT = {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}], "stream": True}
#: docs/deployment.md, "Memory": the unfinished events' row, 6 x max_partial_event_bytes
#: (32 MiB): measured 107 to 162 MiB of peak growth here (776 MiB unbounded)
PARTIAL_ROW = 6 * 32 * MIB


def _status(pid: int) -> dict[str, int]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM")}


def test_twenty_15_mib_events_at_once_stay_within_the_bound(simulator: ServerThread) -> None:
    with gateway_process(
        ["--upstream", simulator.url + "/v1"], {"GATEWAY_ACCESS_LOG": "false"}
    ) as gw:
        web.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=60)  # warm up
        before = _status(gw.proc.pid)
        assert before["VmHWM"] - before["VmRSS"] < 32 * MIB  # the start left no high peak
        results: list[Any] = []

        def stream() -> None:
            headers = {"x-sim-fault": "huge_event", "x-sim-chunk-bytes": str(15 * MIB)}
            with web.client(timeout=120) as client:
                response = client.post(gw.url + "/v1/chat/completions", json=CHAT, headers=headers)
                results.append(annotation(response.content))

        threads = [threading.Thread(target=stream) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
        peak = _status(gw.proc.pid)["VmHWM"] - before["VmRSS"]
        text = web.get(gw.url + "/metrics").text
    assert len(results) == 20
    ended = sorted((note["outcome"], note["reason"]) for note in results)
    refused = [e for e in ended if e == ("incomplete", "limit_exceeded")]
    assert refused, ended  # the bound was reached: not all twenty fit
    assert set(ended) <= {("complete", "stop"), ("incomplete", "limit_exceeded")}, ended
    assert metric_value(text, "gateway_partial_event_refusals_total") == len(refused)
    assert peak <= PARTIAL_ROW, f"peak growth {peak / MIB:.0f} MiB"
