"""``gateway probe``: the matrix against the simulator, each fault in its cell, exit statuses.

The probe runs the real gateway in-process on a loopback port (uvicorn,
httptools) in front of the real simulator; the command line is driven as a real
process once and through ``gateway.cli.main`` in-process otherwise (tests/cli.py),
the faults in-process through ``make_plan``/``run_plan`` with ``--inject``'s
simulator headers.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gateway.capture import SUFFIX, load, replay
from gateway.probe import INVALID_MODEL, Matrix, dry_run, make_plan, run_plan
from gateway.probe.checks import COUNT_PROMPT, TEXT_PROMPT, TOOL_PROMPT, checks_for
from gateway.protocols import REGISTRY
from gateway.settings import Settings, load_settings
from gateway.simulator import UNKNOWN_MODEL
from tests import web
from tests.cli import run_cli, run_cli_process
from tests.conftest import ServerThread
from tests.integration.raw_upstream import raw_upstream

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "probe-matrix.schema.json").read_text())
PROMPTS = (TEXT_PROMPT, COUNT_PROMPT, TOOL_PROMPT)


def _gateway(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``gateway ARGS`` in-process (tests/cli.py), the runner's GATEWAY_ variables unset."""
    return run_cli(*args, env=env)


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("GATEWAY_"):
            monkeypatch.delenv(name)


def _run(settings: Settings, **narrowing: Any) -> Matrix:
    return asyncio.run(run_plan(settings, make_plan(settings, **narrowing), check_seconds=30))


# ------------------------------------------------------------------ the simulator


_SIMULATOR_ROUTES = {
    "gemini": "simulator-gemini",
    "ollama": "simulator-ollama",
    "bedrock": "simulator-bedrock",
}


def test_probe_simulator_passes_every_check_of_every_protocol_and_writes_both_reports(
    tmp_path: Path,
) -> None:
    out, md = tmp_path / "probe.json", tmp_path / "probe.md"
    # A real process: the whole command, its reports and its exit status.
    result = run_cli_process(
        "probe", "--simulator", "--json", str(out), "--markdown", str(md), timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    matrix = json.loads(out.read_text())
    jsonschema.validate(matrix, SCHEMA)
    expected = [
        (_SIMULATOR_ROUTES.get(spec.name, "simulator"), spec.name, check)
        for spec in REGISTRY
        for check in checks_for(spec)
    ]
    rows = [(r["route"], r["protocol"], r["check"]) for r in matrix["results"]]
    assert sorted(rows) == sorted(expected)
    assert all(r["passed"] for r in matrix["results"]), result.stdout
    assert matrix["summary"] == {"checks": len(expected), "passed": len(expected), "failed": 0}
    assert matrix["simulator"] is True
    by_check = {(r["protocol"], r["check"]): r for r in matrix["results"]}
    assert by_check["chat", "usage"]["usage_position"] == "after_finish"
    assert by_check["chat", "choices"]["choices"] == 2
    assert by_check["messages", "tool_call"]["reason"] == "tool_calls"
    assert by_check["gemini", "interrupted"]["reason"] == "client_disconnect"
    assert by_check["responses", "refused"]["status"] == 404
    assert all(r["timings_ms"]["total"] > 0 for r in matrix["results"])
    report = md.read_text()
    assert report.startswith("# Route acceptance matrix")
    assert report.count("| simulator") == len(expected)
    for text in (out.read_text(), report, result.stdout):
        for prompt in PROMPTS:
            assert prompt not in text
        assert "127.0.0.1" not in text
    assert f"{len(expected)} checks: {len(expected)} passed, 0 failed" in result.stdout


def test_each_fault_shows_up_in_its_own_cell(clean_environ: None) -> None:
    # 2 s: only the scripted stall reaches it, never a loaded machine's pause
    settings = load_settings(simulator=True, timeouts={"idle": 2.0})
    inject = [
        "stream:x-sim-fault=drop_before_done",
        "usage:x-sim-fault=stall_mid_stream",
        "usage:x-sim-stall-seconds=30",
        "tool_call:x-sim-fault=invalid_tool_arguments",
        "choices:x-sim-fault=error_event",
        "plain:x-sim-fault=abort_mid_body",
        "interrupted:x-sim-tokens=0",
        "refused:x-sim-fault=status",
        "refused:x-sim-status=503",
        "schema:x-sim-structured=enum",
    ]
    matrix = _run(settings, protocols=["chat", "messages"], inject=inject)
    chat = {c.check: c.as_dict() for c in matrix.cells if c.protocol == "chat"}
    assert set(chat) == {
        "stream",
        "usage",
        "tool_call",
        "choices",
        "schema",
        "plain",
        "interrupted",
        "refused",
    }
    assert not any(cell["passed"] for cell in chat.values())
    assert (chat["stream"]["reason"], chat["stream"]["terminator"]) == ("missing_done", "missing")
    assert chat["usage"]["reason"] == "idle_timeout"
    assert chat["tool_call"]["reason"] == "invalid_tool_arguments"
    assert chat["choices"]["reason"] == "upstream_error"
    assert chat["plain"]["error"] == "upstream_disconnect"
    assert chat["interrupted"]["problem"].endswith("before its first content event")
    assert chat["refused"]["status"] == 503
    assert chat["schema"]["schema"] == "invalid"
    assert "did not honour the schema (invalid at /role" in chat["schema"]["problem"]
    assert "expected the provider's 4xx" in chat["refused"]["problem"]
    # The same faults land in the Messages rows of the same checks (it has no usage or
    # choices checks); nothing else fails.
    messages = {c.check: c for c in matrix.cells if c.protocol == "messages"}
    assert set(messages) == {"stream", "tool_call", "schema", "plain", "interrupted", "refused"}
    assert messages["schema"].schema == "invalid"
    assert messages["stream"].reason == "missing_done"
    assert messages["tool_call"].reason == "invalid_tool_arguments"
    assert matrix.failed == len(matrix.cells)


def test_a_stream_that_arrives_whole_before_the_probe_leaves_fails_interrupted(
    clean_environ: None,
) -> None:
    """Without pacing the simulator's short answer is relayed whole at once, so the
    gateway rightly records it complete: the check says the route cannot show it."""
    settings = load_settings(simulator=True)
    inject = ["interrupted:x-sim-tps=0", "interrupted:x-sim-tokens=3"]
    matrix = _run(settings, protocols=["gemini"], checks=["interrupted"], inject=inject)
    (cell,) = matrix.cells
    if cell.reason == "client_disconnect":
        pytest.skip("the probe left before the gateway had relayed three events")
    assert not cell.passed
    assert cell.outcome == "complete"
    assert cell.problem is not None
    assert cell.problem.startswith("recorded complete although the probe left")


def test_the_command_exits_1_when_a_check_fails() -> None:
    result = _gateway(
        "probe",
        "--simulator",
        "--protocol",
        "gemini",
        "--check",
        "stream",
        "plain",
        "--inject",
        "stream:x-sim-fault=error_event",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(" stream " in line and "FAIL" in line and "upstream_error" in line for line in lines)
    assert any(" plain " in line and " pass " in line for line in lines)
    assert lines[-1] == "2 checks: 1 passed, 1 failed"


# ------------------------------------------------------------------ configured routes


def test_a_configured_route_is_probed_with_its_credential_through_the_same_path(
    simulator: ServerThread, tmp_path: Path
) -> None:
    """Routes from a config file: the route's own credential reaches the upstream in its
    style, client keys do not stand in the probe's way, and the key is in no report."""
    key = "sk-probe-Okapi-97531"
    client_hash = hashlib.sha256(b"a-client-key").hexdigest()
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'client_key_sha256 = ["{client_hash}"]\n'
        "[[routes]]\n"
        'name = "openai"\n'
        'prefix = "/v1"\n'
        f'upstream = "{simulator.url}/v1"\n'
        'credential_env = "GW_TEST_PROBE_KEY"\n'
        "[[routes]]\n"
        'name = "anthropic"\n'
        'prefix = "/anthropic/v1"\n'
        f'upstream = "{simulator.url}/v1"\n'
        'credential_env = "GW_TEST_PROBE_KEY"\n'
        'credential_style = "x-api-key"\n'
    )
    out = tmp_path / "probe.json"
    web.delete(simulator.url + "/_sim/requests")
    result = _gateway(
        "probe", "--config", str(config), "--model", "sim-model", "--json", str(out),
        # Paced, as a real model's long answer is: the probe leaves before its end.
        "--inject", "interrupted:x-sim-tps=50",
        GW_TEST_PROBE_KEY=key,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())["results"]
    assert {(r["route"], r["protocol"]) for r in rows} == {
        ("openai", "chat"),
        ("anthropic", "messages"),
    }
    assert key not in out.read_text() + result.stdout
    seen = web.get(simulator.url + "/_sim/requests?limit=100").json()["data"]
    assert len(seen) == len(rows)
    bearer = hashlib.sha256(f"Bearer {key}".encode()).hexdigest()
    plain = hashlib.sha256(key.encode()).hexdigest()
    for request in seen:
        headers = request["headers"]
        if request["path"] == "/v1/messages":
            assert headers["x-api-key"]["sha256"] == plain
            assert "authorization" not in headers
        else:
            assert headers["authorization"]["sha256"] == bearer
    assert {r["body"]["model"] for r in seen if r["body"]} == {"sim-model", INVALID_MODEL}


def test_a_failed_probe_stream_leaves_a_capture_that_replays(
    simulator: ServerThread, tmp_path: Path, clean_environ: None
) -> None:
    route = {
        "name": "openai",
        "prefix": "/v1",
        "upstream": simulator.url + "/v1",
        "capture": "incomplete",
        "capture_dir": str(tmp_path),
    }
    settings = load_settings(routes=[route])
    matrix = _run(
        settings,
        models=["sim-model"],
        checks=["stream", "interrupted"],
        inject=["stream:x-sim-fault=drop_mid_event", "interrupted:x-sim-tps=50"],
    )
    assert [(c.check, c.passed) for c in matrix.cells] == [("stream", False), ("interrupted", True)]
    # The probe's gateway wrote its captures before it stopped; client_disconnect is none.
    (path,) = sorted(tmp_path.glob("*" + SUFFIX))
    capture = load(path)
    assert (capture.route, capture.reason) == ("openai", "missing_done")
    assert replay(capture).result == "same"


# ------------------------------------------------------------------ dry run, errors


def test_dry_run_prints_every_request_and_sends_nothing() -> None:
    with raw_upstream() as upstream:
        result = _gateway(
            "probe", "--upstream", upstream.url + "/v1", "--model", "m-1", "--dry-run"
        )
    assert result.returncode == 0, result.stderr
    assert upstream.requests == []
    text = result.stdout
    assert text.count("# default chat m-1 ") == len(checks_for(REGISTRY[0]))
    assert text.count("POST /v1/chat/completions") == len(checks_for(REGISTRY[0]))
    for prompt in PROMPTS:
        assert prompt in text
    assert f'"model": "{INVALID_MODEL}"' in text
    assert '"include_usage": true' in text
    assert '"n": 2' in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--simulator", "--route", "nope"], "no route named nope (routes: simulator, "),
        (["--upstream", "http://127.0.0.1:9/v1"], "no model to probe"),
        (
            ["--simulator", "--check", "vibes"],
            "no check named vibes (checks: stream, usage, tool_call, choices, schema, plain, "
            "interrupted, refused)",
        ),
        (["--simulator", "--protocol", "carrier-pigeon"], "--protocol: one of chat,"),
        (["--simulator", "--inject", "stream:x-leak=1"], "expected CHECK:x-sim-NAME=VALUE"),
        (["--simulator", "--protocol", "sse"], "nothing to probe"),
        (["--upstream", "ftp://x/v1", "--model", "m"], "upstream_url"),
        (["--simulator", "--timeout", "0"], "--timeout must be positive"),
    ],
)
def test_a_configuration_error_exits_2_with_a_message(args: list[str], message: str) -> None:
    result = _gateway("probe", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_the_simulator_refuses_the_probes_invalid_model_like_a_provider(
    simulator: ServerThread,
) -> None:
    assert INVALID_MODEL.startswith(UNKNOWN_MODEL)
    refused = web.post(
        simulator.url + "/v1/messages",
        json={"model": INVALID_MODEL, "max_tokens": 5, "messages": []},
    )
    assert refused.status_code == 404
    assert refused.json()["error"]["type"] == "not_found_error"
    scripted = web.post(
        simulator.url + "/v1/messages",
        json={"model": INVALID_MODEL, "max_tokens": 5, "messages": []},
        headers={"x-sim-fault": "length"},
    )
    assert scripted.status_code == 200  # a fault scripts the answer, whatever the model


def test_dry_run_of_a_plan_names_each_run(clean_environ: None) -> None:
    settings = Settings(simulator=True)
    text = dry_run(make_plan(settings, protocols=["gemini"], checks=["plain"]))
    assert text.startswith("# simulator-gemini gemini sim-model plain\n")
    assert "POST /v1beta/models/sim-model:generateContent\n" in text
