"""Captures end to end: a real gateway (uvicorn) writes real files in a tmp directory.

What is captured (and what not), that nothing secret reaches a file, that
every protocol's faults replay to the verdict the gateway reached live, the
count and byte caps, a full queue, and ``gateway replay``'s exit status.
Files appear from a writer thread: tests wait on the written-captures metric
or on the files themselves, with a bounded deadline, never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gateway.app import create_app
from gateway.capture import SUFFIX, Tap, load, replay
from gateway.capture.writer import CaptureWriter
from gateway.guard import Outcome, Reason, Verdict
from gateway.observe import RequestRecord
from gateway.settings import GatewayLimits, RouteConfig, load_settings
from tests import web
from tests.cli import run_cli
from tests.conftest import ServerThread, running
from tests.integration.helpers import gateway_for, metric_value
from tests.integration.raw_upstream import RawRequest, chunk, raw_upstream, sse_head

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")

# Each is made of words found nowhere else, so that any of them in a file is a leak.
PROMPT = "Pssst-Zebrafinch-47114711"
COMPLETION = "Sekret-Marmoset-08150815"
ROUTE_KEY = "sk-Narwhal-2468013579"
CLIENT_KEY = "sk-Axolotl-1357924680"


def _eventually(check: Callable[[], T | None], seconds: float = 15.0) -> T:
    """The first truthy value of ``check``, polled until a bounded deadline."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("the state was not reached in time")
        time.sleep(0.01)


def _files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*" + SUFFIX))


def _written(gateway: ServerThread, route: str) -> float:
    text = web.get(gateway.url + "/metrics").text
    return metric_value(text, "gateway_captures_written_total", route=route)


def _route(name: str, prefix: str, upstream: str, directory: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "prefix": prefix,
        "upstream": upstream,
        "capture": "incomplete",
        "capture_dir": str(directory),
        **extra,
    }


# ------------------------------------------------------------------ secrets


def _data(obj: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(obj).encode() + b"\n\n"


def _secret_stream(path: bytes, heard: str, url: str) -> bytes:
    """A cut stream of the path's protocol that echoes the prompt and the credential
    the upstream was sent, and names its own URL."""
    if path.endswith(b"/chat/completions"):
        return (
            f": served by {url}\n".encode()
            + b"id: " + heard.encode() + b"\n"
            + _data({"id": "c1", "object": "chat.completion.chunk", "model": "m",
                     "choices": [{"index": 0, "delta": {"content": COMPLETION}}]})
            + _data({"id": "c1", "object": "chat.completion.chunk", "model": PROMPT,
                     "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": heard,
                     "function": {"name": "f", "arguments": '{"said": "' + PROMPT}}]}}]})
        )  # fmt: skip
    if path.endswith(b"/responses"):
        return _data(
            {"type": "response.created", "sequence_number": 0,
             "response": {"id": "r", "status": "in_progress", "instructions": PROMPT}},
            "response.created",
        ) + _data(
            {"type": "response.output_text.delta", "sequence_number": 1, "item_id": "m",
             "output_index": 0, "content_index": 0, "delta": COMPLETION + " " + heard},
            "response.output_text.delta",
        ) + b"data: " + url.encode() + b"\n\n"  # fmt: skip
    if path.endswith(b"/messages"):
        return _data(
            {"type": "message_start", "message": {"id": "msg", "role": "assistant",
             "content": [{"type": "text", "text": PROMPT}], "model": "m"}},
            "message_start",
        ) + _data(
            {"type": "error", "error": {"type": "api_error",
             "message": f"{COMPLETION} {heard} at {url}"}},
            "error",
        )  # fmt: skip
    return _data(
        {"candidates": [{"content": {"role": "model", "parts": [
            {"text": COMPLETION}, {"functionCall": {"name": "f", "args": {PROMPT: heard}}}]}}],
         "modelVersion": url}
    )  # fmt: skip


def test_a_cut_stream_carrying_secrets_leaves_none_of_them_in_its_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GW_TEST_CAPTURE_KEY", ROUTE_KEY)
    upstream_url: list[str] = []

    async def respond(
        request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        credential = b" ".join(
            request.header_values(b"authorization")
            + request.header_values(b"x-api-key")
            + request.header_values(b"x-goog-api-key")
        ).decode()
        body = _secret_stream(request.target.split(b"?")[0], credential, upstream_url[0])
        extra = f"x-leaky: {ROUTE_KEY}\r\nset-cookie: s={ROUTE_KEY}\r\n".encode()
        writer.write(sse_head(extra + b"connection: close\r\n") + chunk(body) + b"0\r\n\r\n")
        await writer.drain()

    with raw_upstream(respond) as upstream:
        upstream_url.append(upstream.url + "/v1")
        key = {"credential_env": "GW_TEST_CAPTURE_KEY"}
        routes = [
            _route("openai", "/v1", upstream.url + "/v1", tmp_path, **key),
            _route("gem", "/v1beta", upstream.url + "/v1beta", tmp_path, protocol="gemini", **key),
        ]
        settings = load_settings(routes=routes, access_log=False)
        requests = [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}]}),
            ("/v1/responses", {"input": PROMPT}),
            ("/v1/messages", {"messages": [{"role": "user", "content": PROMPT}]}),
            ("/v1beta/models/m:streamGenerateContent?alt=sse", {"contents": [PROMPT]}),
        ]
        with running(create_app(settings)) as gw:
            for path, body in requests:
                response = web.post(
                    gw.url + path,
                    json={"model": "m", "stream": True, **body},
                    headers={"authorization": "Bearer " + CLIENT_KEY},
                    timeout=10,
                )
                assert response.status_code == 200
                assert PROMPT in upstream.requests[-1].body.decode()
            files = _eventually(lambda: len(_files(tmp_path)) == 4 and _files(tmp_path))
    secrets = [PROMPT, COMPLETION, ROUTE_KEY, CLIENT_KEY, upstream.url, f":{upstream.port}"]
    protocols: dict[str, str] = {}
    for path in files:
        text = path.read_text()
        capture = load(path)
        raw = text + b"".join(data for _, data in capture.chunks).decode("latin-1")
        for secret in secrets:
            for word in [secret, *secret.split("-")]:
                if len(word) >= 5:
                    assert word not in raw, (path.name, word)
        assert "x-leaky" not in text
        assert "set-cookie" not in text
        assert capture.content_type == "text/event-stream"
        protocols[capture.protocol] = capture.reason
        assert replay(capture).result == "same"
    assert protocols == {
        "chat": "missing_done",
        "responses": "invalid_json",  # the URL as a data line
        "messages": "upstream_error",
        "gemini": "missing_done",
    }


# ------------------------------------------------------------------ what is captured


def test_incomplete_captures_the_upstreams_failures_only_and_all_captures_every_stream(
    simulator: ServerThread, tmp_path: Path
) -> None:
    failures, everything = tmp_path / "failures", tmp_path / "all"
    routes = [
        _route("inc", "/v1", simulator.url + "/v1", failures),
        _route("all", "/all/v1", simulator.url + "/v1", everything, capture="all"),
    ]
    chat = {"model": "sim-model", "stream": True, "messages": []}
    with gateway_for("", routes=routes) as gw:
        url = gw.url + "/v1/chat/completions"
        assert web.post(url, json=chat, headers={"x-request-id": "whole"}).status_code == 200
        paced = {"x-request-id": "left", "x-sim-tps": "20"}
        with web.stream("POST", url, json=chat, headers=paced) as response:
            next(response.iter_raw())  # the first bytes, then leave

        def left() -> float:
            text = web.get(gw.url + "/metrics").text
            return metric_value(text, "gateway_streams_total", reason="client_disconnect")

        _eventually(left)
        cut = {"x-request-id": "cut", "x-sim-fault": "drop_before_done"}
        assert web.post(url, json=chat, headers=cut).status_code == 200
        _eventually(lambda: _written(gw, "inc") == 1)
        assert web.post(gw.url + "/all/v1/chat/completions", json=chat).status_code == 200
        _eventually(lambda: _written(gw, "all") == 1)
    (only,) = _files(failures)
    assert only.name.endswith("-inc-cut" + SUFFIX)
    assert (load(only).outcome, load(only).reason) == ("incomplete", "missing_done")
    (whole,) = _files(everything)
    assert (load(whole).outcome, load(whole).reason) == ("complete", "stop")


FAULTS = (
    "none",
    "tool_calls",
    "choices_2",
    "length",
    "drop_before_done",
    "drop_mid_utf8",
    "done_without_finish",
    "abort_mid_body",
    "error_event",
    "invalid_json",
    "invalid_shape",
    "content_after_finish",
    "invalid_tool_arguments",
)
PROTOCOL_PATHS = {
    "chat": ("/v1/chat/completions", {"messages": [], "stream": True}),
    "completions": ("/v1/completions", {"prompt": "p", "stream": True}),
    "responses": ("/v1/responses", {"input": "p", "stream": True}),
    "messages": ("/v1/messages", {"messages": [], "max_tokens": 64, "stream": True}),
    "gemini": ("/v1beta/models/sim-model:streamGenerateContent?alt=sse", {"contents": []}),
    "ollama": ("/api/chat", {"messages": []}),  # NDJSON: redacted and replayed by its framing
    # AWS event stream frames: redacted frame by frame (CRCs recomputed), replayed by them
    "bedrock": ("/bedrock/model/sim-model/converse-stream", {"messages": []}),
    "bedrock.invoke": (
        "/bedrock/model/sim-model/invoke-with-response-stream",
        {"messages": [], "max_tokens": 64},
    ),
}


def test_every_protocols_faults_replay_to_the_verdict_reached_live(
    simulator: ServerThread, tmp_path: Path
) -> None:
    """The redacted captures of real streams, split at random, judge as the live ones did."""
    routes = [
        _route("v1", "/v1", simulator.url + "/v1", tmp_path, capture="all"),
        _route("gem", "/v1beta", simulator.url + "/v1beta", tmp_path, capture="all"),
        _route("oll", "/api", simulator.url + "/api", tmp_path, capture="all", protocol="ollama"),
        _route("bed", "/bedrock", simulator.url, tmp_path, capture="all", protocol="bedrock"),
    ]
    for route in routes:  # one directory for all: room for every protocol's every fault
        route["capture_max_files"] = 1000
    count = 0
    with gateway_for("", routes=routes) as gw:
        for protocol, (path, body) in PROTOCOL_PATHS.items():
            for seed, fault in enumerate(FAULTS):
                headers = {
                    "x-sim-fault": fault,
                    "x-sim-partition": "random",
                    "x-sim-seed": str(seed),
                    "x-request-id": f"{protocol}-{fault}",
                }
                web.post(gw.url + path, json={"model": "sim-model", **body}, headers=headers)
                count += 1
        _eventually(lambda: sum(_written(gw, r) for r in ("v1", "gem", "oll", "bed")) == count)
    reasons, protocols = set(), set()
    for path in _files(tmp_path):
        capture = load(path)
        result = replay(capture)
        assert result.result == "same", (path.name, result)
        assert result.bytes == capture.received_bytes
        reasons.add(capture.reason)
        protocols.add(capture.protocol)
    assert len(_files(tmp_path)) == count
    assert protocols == {name.split(".")[0] for name in PROTOCOL_PATHS}
    assert reasons >= {
        "stop",
        "tool_calls",
        "length",
        "missing_done",
        "missing_finish",
        "upstream_disconnect",
        "upstream_error",
        "invalid_json",
        "invalid_shape",
        "content_after_finish",
        "invalid_tool_arguments",
    }


def test_a_stall_is_captured_with_its_timing(simulator: ServerThread, tmp_path: Path) -> None:
    routes = [_route("v1", "/v1", simulator.url + "/v1", tmp_path, timeouts={"idle": 2.0})]
    with gateway_for("", routes=routes) as gw:
        headers = {"x-sim-fault": "stall_mid_stream", "x-sim-stall-seconds": "30"}
        web.post(gw.url + "/v1/chat/completions", json=PROTOCOL_PATHS["chat"][1], headers=headers)
        (path,) = _eventually(lambda: _files(tmp_path))
    capture = load(path)
    assert (capture.reason, capture.ending) == ("idle_timeout", "stopped")
    assert replay(capture).result == "same"
    times = [at for at, _ in capture.chunks]
    assert times == sorted(times)
    assert times[0] >= capture.head_at > 0


# ------------------------------------------------------------------ caps and the queue


def test_the_count_cap_keeps_the_newest_files_and_touches_no_other(
    simulator: ServerThread, tmp_path: Path
) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    routes = [_route("v1", "/v1", simulator.url + "/v1", tmp_path, capture_max_files=3)]
    with gateway_for("", routes=routes) as gw:
        for number in range(1, 6):
            headers = {"x-sim-fault": "drop_before_done", "x-request-id": f"cap-{number}"}
            web.post(
                gw.url + "/v1/chat/completions", json=PROTOCOL_PATHS["chat"][1], headers=headers
            )
            _eventually(lambda n=number: _written(gw, "v1") == n)
    names = [p.name for p in _files(tmp_path)]
    assert [name.rsplit("-", 1)[1] for name in names] == [f"{n}{SUFFIX}" for n in (3, 4, 5)]
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_byte_cap_cuts_a_long_stream_and_says_so(
    simulator: ServerThread, tmp_path: Path
) -> None:
    routes = [_route("v1", "/v1", simulator.url + "/v1", tmp_path, capture_max_bytes=4096)]
    with gateway_for("", routes=routes) as gw:
        headers = {"x-sim-fault": "drop_before_done", "x-sim-tokens": "400"}
        web.post(gw.url + "/v1/chat/completions", json=PROTOCOL_PATHS["chat"][1], headers=headers)
        (path,) = _eventually(lambda: _files(tmp_path))
    assert path.stat().st_size <= 4096
    capture = load(path)
    assert capture.truncated
    assert capture.received_bytes > sum(len(data) for _, data in capture.chunks) > 0
    assert replay(capture).result == "undecided"


def _tapped_record(request_id: str, route: str = "v1") -> RequestRecord:
    record = RequestRecord(request_id, route, "POST", "/v1/chat/completions", time.monotonic())
    tap = record.tap = Tap(record.started, 4096, "chat", "text/event-stream")
    tap.take(b'data: {"choices": []}\n\n', time.monotonic())
    tap.take(b"", time.monotonic())
    record.verdict = Verdict(Outcome.INCOMPLETE, Reason.MISSING_DONE)
    return record


def test_a_full_queue_drops_and_counts_and_the_relay_never_waits(tmp_path: Path) -> None:
    written: list[str] = []
    dropped: list[tuple[str, str]] = []
    route = RouteConfig(
        name="v1", upstream="http://upstream.test/v1", capture="incomplete", capture_dir=tmp_path
    )
    writer = CaptureWriter(
        {"v1": route},
        GatewayLimits(),
        on_written=written.append,
        on_dropped=lambda r, why: dropped.append((r, why)),
        queue_size=2,
        autostart=False,  # the writer thread is behind: it has not even started
    )
    for number in range(5):
        writer.observe(_tapped_record(f"q-{number}"))
    assert dropped == [("v1", "queue_full")] * 3
    writer.start()
    _eventually(lambda: len(written) == 2)
    writer.close()
    assert sorted(p.name.rsplit("-", 2)[-1] for p in _files(tmp_path)) == [
        f"0{SUFFIX}",
        f"1{SUFFIX}",
    ]


def test_a_write_that_fails_is_counted(tmp_path: Path) -> None:
    dropped: list[tuple[str, str]] = []
    directory = tmp_path / "captures"
    route = RouteConfig(
        name="v1", upstream="http://upstream.test/v1", capture="all", capture_dir=directory
    )
    writer = CaptureWriter(
        {"v1": route}, GatewayLimits(), on_dropped=lambda r, why: dropped.append((r, why))
    )
    directory.write_text("a file where the directory should be")
    writer.observe(_tapped_record("w-1"))
    _eventually(lambda: dropped)
    writer.close()
    assert dropped == [("v1", "write_error")]


def test_only_a_capturing_route_taps_its_streams(simulator: ServerThread, tmp_path: Path) -> None:
    taps: dict[str, bool] = {}

    class Taps:
        name = "taps"

        def observe(self, record: RequestRecord) -> None:
            taps[record.route] = record.tap is not None

    routes = [
        {"name": "plain", "prefix": "/v1", "upstream": simulator.url + "/v1"},
        _route("captured", "/c/v1", simulator.url + "/v1", tmp_path),
    ]
    settings = load_settings(routes=routes, access_log=False)
    with running(create_app(settings, observers=[Taps()])) as gw:
        for prefix in ("/v1", "/c/v1"):
            web.post(gw.url + prefix + "/chat/completions", json=PROTOCOL_PATHS["chat"][1])
        _eventually(lambda: len(taps) == 2)
    assert taps == {"plain": False, "captured": True}


# ------------------------------------------------------------------ the command line


def _gateway(*args: str) -> subprocess.CompletedProcess[str]:
    """``gateway ARGS`` in-process (tests/cli.py)."""
    return run_cli(*args)


def test_replay_exits_0_when_verdicts_hold_1_when_one_differs_2_for_no_capture(
    tmp_path: Path,
) -> None:
    source = sorted((ROOT / "tests" / "captures").glob("*" + SUFFIX))[0]
    good = tmp_path / source.name
    shutil.copy(source, good)
    ok = _gateway("replay", str(good))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"{good}: same: replayed ")
    edited = tmp_path / "edited.capture.json"
    obj = json.loads(good.read_text())
    obj["verdict"]["outcome"], obj["verdict"]["reason"] = "complete", "stop"
    edited.write_text(json.dumps(obj))
    differs = _gateway("replay", str(good), str(edited))
    assert differs.returncode == 1
    assert f"{edited}: different: " in differs.stdout
    assert "recorded complete/stop" in differs.stdout
    garbage = tmp_path / "garbage.capture.json"
    garbage.write_text("{}")
    bad = _gateway("replay", str(good), str(garbage))
    assert bad.returncode == 2
    assert "not a capture" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "needs capture_dir"),
        ({"capture_dir": "UNDER_A_FILE/captures"}, "is not a directory"),
    ],
)
def test_a_capture_without_a_usable_directory_is_a_configuration_error(
    tmp_path: Path, extra: dict[str, str], message: str
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    route = {"name": "r", "prefix": "/v1", "upstream": "http://upstream.test/v1"}
    route |= {"capture": "incomplete"} | {
        k: v.replace("UNDER_A_FILE", str(blocker)) for k, v in extra.items()
    }
    config = tmp_path / "g.toml"
    lines = [f"{k} = {json.dumps(v)}" for k, v in route.items()]
    config.write_text("[[routes]]\n" + "\n".join(lines) + "\n")
    result = _gateway("check-config", "--config", str(config))
    assert result.returncode == 2, result.stdout
    assert message in result.stderr
    assert "Traceback" not in result.stderr
