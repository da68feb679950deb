"""OpenAI's Codex CLI (``codex exec``) through the gateway, over the Responses WebSocket.

Codex is an npm package with its binary inside (``npm install @openai/codex``); the
test runs the binary that ``CODEX_BIN`` names, or ``codex`` on the PATH, and is
skipped when there is none. It points a custom model provider's ``base_url`` at the
gateway fronting the simulator, with ``supports_websockets = true``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ServerThread
from tests.integration.helpers import access_log_lines, gateway_for

pytestmark = pytest.mark.timeout(120)


def _codex() -> str:
    found = os.environ.get("CODEX_BIN") or shutil.which("codex")
    if not found:
        pytest.skip("no Codex CLI: set CODEX_BIN, or npm install -g @openai/codex")
    return found


def _run(
    codex: str, home: Path, gateway: ServerThread, headers: str = ""
) -> subprocess.CompletedProcess[str]:
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "gpt-sim"\n'
        'model_provider = "gateway"\n\n'
        "[model_providers.gateway]\n"
        'name = "gateway"\n'
        f'base_url = "{gateway.url}/v1"\n'
        'env_key = "GATEWAY_TEST_KEY"\n'
        'wire_api = "responses"\n'
        "supports_websockets = true\n"
        "stream_max_retries = 0\n"
        "request_max_retries = 0\n" + headers,
        encoding="utf-8",
    )
    work = home / "work"
    work.mkdir()
    env = {**os.environ, "CODEX_HOME": str(home), "GATEWAY_TEST_KEY": "sk-test"}
    return subprocess.run(
        [codex, "exec", "--skip-git-repo-check", "say hi"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_codex_exec_completes_over_the_websocket(
    simulator: ServerThread, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    codex = _codex()
    with gateway_for(simulator.url + "/v1", access_log=True) as gateway:
        done = _run(codex, tmp_path / "home", gateway)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = access_log_lines(capsys.readouterr().out)
    responses = [line for line in lines if line["stream"]]
    assert responses
    assert all(line["transport"] == "websocket" for line in responses)
    assert all(line["outcome"] == "complete" for line in responses)
    assert responses[-1]["reason"] == "stop"


def test_codex_sees_the_reason_of_a_cut(
    simulator: ServerThread, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    codex = _codex()
    headers = 'http_headers = { "x-sim-fault" = "drop_after_text" }\n'
    with gateway_for(simulator.url + "/v1", access_log=True) as gateway:
        done = _run(codex, tmp_path / "home", gateway, headers)
    assert done.returncode != 0
    assert "upstream_disconnect" in done.stderr
    lines = access_log_lines(capsys.readouterr().out)
    cut = [line for line in lines if line["stream"] and line["transport"] == "websocket"]
    assert cut
    assert cut[0]["reason"] == "upstream_disconnect"
