"""Timestamps on both streams: the access log's ``time``, the process log's own.

A real ``gateway serve`` process: its stdout (access log) and stderr (the
gateway's and uvicorn's lines), in the default text format and with
``log_format = "json"``.
"""

from __future__ import annotations

import datetime
import json
import re

from tests import web
from tests.conftest import ServerThread, gateway_process
from tests.integration.helpers import access_log_lines

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
RFC3339_MS = re.compile(r"\A\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z")


def _recent(stamp: str) -> None:
    assert RFC3339_MS.match(stamp), stamp
    when = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    age = datetime.datetime.now(datetime.UTC) - when
    assert datetime.timedelta(0) <= age < datetime.timedelta(minutes=10), stamp


def test_access_log_and_process_log_lines_carry_utc_timestamps(simulator: ServerThread) -> None:
    with gateway_process(["--upstream", simulator.url + "/v1"]) as gw:
        assert web.post(gw.url + "/v1/chat/completions", json=CHAT).status_code == 200
        out, err = gw.stop()
    (line,) = access_log_lines(out)
    assert next(iter(line)) == "time"
    _recent(line["time"])
    process = [text for text in err.decode().splitlines() if text.strip()]
    assert any(" INFO gateway: route default" in text for text in process), process
    assert any("Application startup complete" in text for text in process), process  # uvicorn's
    for text in process:
        if text.startswith(" ") or text.startswith("Traceback"):
            continue
        stamp, _, rest = text.partition(" ")
        _recent(stamp)
        assert rest.split(" ", 1)[0] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), text


def test_log_format_json_gives_one_object_per_process_line(simulator: ServerThread) -> None:
    with gateway_process(
        ["--upstream", simulator.url + "/v1"], env={"GATEWAY_LOG_FORMAT": "json"}
    ) as gw:
        assert web.post(gw.url + "/v1/chat/completions", json=CHAT).status_code == 200
        out, err = gw.stop()
    _recent(access_log_lines(out)[0]["time"])
    lines = [json.loads(text) for text in err.decode().splitlines() if text.strip()]
    assert lines
    for line in lines:
        assert set(line) >= {"time", "level", "logger", "message"}, line
        _recent(line["time"])
    loggers = {line["logger"] for line in lines}
    assert {"gateway", "uvicorn.error"} <= loggers, loggers
    assert any(line["message"] == "drained" for line in lines), lines
