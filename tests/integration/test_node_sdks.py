"""The official Node SDKs (``openai``, ``@anthropic-ai/sdk``) against a real gateway.

A small Node script drives each SDK through a real gateway in front of the
simulator: a complete stream must give the whole text (the trailing comment
line must not upset the SDK's parser), and a cut stream must make the SDK
throw an error whose machine-readable fields carry the reason
(docs/wire-contract.md, "Incomplete stream"): ``err.code`` for openai,
``err.errorCode`` and ``err.error.error.details.error_code`` for Anthropic.

The packages come from the npm registry, pinned, installed once into a cache
directory (inside the virtualenv when there is one, else a temporary one), in
a bounded time. Without ``node``/``npm``, or without the registry, the tests
skip with the reason; with ``CI=true`` they fail instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from gateway.simulator import expected_text
from tests.conftest import ServerThread
from tests.integration.helpers import gateway_for

#: The SDK versions under test (openai 7 needs Node 22; 6.x runs on Node 18+).
PACKAGES = {"openai": "6.49.0", "@anthropic-ai/sdk": "1.14.0"}
INSTALL_SECONDS = 240
SCRIPT_SECONDS = 60

#: Runs each case given as JSON in argv[3] against the gateway at argv[2]; prints one
#: JSON result per case: {"ok": true, "text"} or {"ok": false, <the error's fields>}.
SCRIPT = r"""
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const base = process.argv[2];
const cases = JSON.parse(process.argv[3]);
const openai = new OpenAI({ baseURL: base + '/v1', apiKey: 'k', maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: base, apiKey: 'k', maxRetries: 0 });
const user = [{ role: 'user', content: 'hi' }];

async function run(api, fault) {
  const options = { headers: { 'x-sim-fault': fault } };
  let text = '';
  if (api === 'chat') {
    const stream = await openai.chat.completions.create(
      { model: 'sim-1', messages: user, stream: true }, options);
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  } else if (api === 'responses') {
    const stream = await openai.responses.create(
      { model: 'sim-1', input: 'hi', stream: true }, options);
    for await (const event of stream) {
      if (event.type === 'response.output_text.delta') text += event.delta;
    }
  } else if (api === 'messages') {
    const stream = await anthropic.messages.create(
      { model: 'claude-sim', max_tokens: 1024, messages: user, stream: true }, options);
    for await (const event of stream) {
      if (event.type === 'content_block_delta' && event.delta.type === 'text_delta') {
        text += event.delta.text;
      }
    }
  } else if (api === 'messages_helper') {
    const stream = anthropic.messages.stream(
      { model: 'claude-sim', max_tokens: 1024, messages: user }, options);
    text = await stream.finalText();
  } else {
    throw new Error('unknown api ' + api);
  }
  return text;
}

for (const [api, fault] of cases) {
  try {
    console.log(JSON.stringify({ api, fault, ok: true, text: await run(api, fault) }));
  } catch (err) {
    console.log(JSON.stringify({
      api, fault, ok: false,
      name: err?.constructor?.name ?? null,
      isOpenAIError: err instanceof OpenAI.APIError,
      isAnthropicError: err instanceof Anthropic.APIError,
      code: err?.code ?? null,
      errorCode: err?.errorCode ?? null,
      error: err?.error ?? null,
      message: String(err?.message ?? err),
    }));
  }
}
"""


def _unavailable(message: str) -> NoReturn:
    if os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}:
        pytest.fail(f"{message} (CI=true: this is a failure, not a skip)")
    pytest.skip(message)


def _cache_root() -> Path:
    """Inside the virtualenv (removed with it by ``make clean``), else a temp dir."""
    if sys.prefix != sys.base_prefix and os.access(sys.prefix, os.W_OK):
        return Path(sys.prefix) / "node-sdks"
    return Path(tempfile.gettempdir()) / f"llm-stream-gateway-node-sdks-{os.getuid()}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One installer at a time (pytest-xdist workers share the cache)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _install() -> Path:
    """A directory holding the pinned packages and the script; built once per key."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        _unavailable("node and npm are not on PATH: the Node SDK checks need them")
    key = hashlib.sha256(json.dumps([PACKAGES, SCRIPT], sort_keys=True).encode()).hexdigest()
    root = _cache_root()
    target = root / key[:16]
    with _locked(root / ".lock"):
        if (target / "probe.mjs").is_file():
            return target
        building = Path(tempfile.mkdtemp(prefix="building-", dir=root))
        try:
            package = {"private": True, "type": "module", "dependencies": PACKAGES}
            (building / "package.json").write_text(json.dumps(package), encoding="utf-8")
            try:
                result = subprocess.run(
                    [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"],
                    cwd=building,
                    capture_output=True,
                    text=True,
                    timeout=INSTALL_SECONDS,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                _unavailable(f"npm install did not finish in {INSTALL_SECONDS} s")
            if result.returncode != 0:
                tail = (result.stdout + result.stderr)[-800:]
                _unavailable(f"npm install of {PACKAGES} failed (registry unreachable?):\n{tail}")
            (building / "probe.mjs").write_text(SCRIPT, encoding="utf-8")
            building.rename(target)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return target


@pytest.fixture(scope="module")
def node_sdks() -> Path:
    return _install()


@pytest.fixture(scope="module")
def gateway(simulator: ServerThread) -> Iterator[ServerThread]:
    with gateway_for(simulator.url + "/v1", timeouts={"idle": 1.0, "total": 5.0}) as server:
        yield server


def run_node(directory: Path, base: str, cases: list[tuple[str, str]]) -> list[dict[str, Any]]:
    result = subprocess.run(
        ["node", str(directory / "probe.mjs"), base, json.dumps(cases)],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=SCRIPT_SECONDS,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    results = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [(r["api"], r["fault"]) for r in results] == cases
    return results


APIS = ["chat", "responses", "messages", "messages_helper"]


def test_complete_streams_give_the_whole_text(node_sdks: Path, gateway: ServerThread) -> None:
    results = run_node(node_sdks, gateway.url, [(api, "none") for api in APIS])
    for result in results:
        assert result["ok"], result
        assert result["text"] == expected_text(20), result["api"]


CUTS = [
    ("drop_before_done", "missing_done"),
    ("drop_mid_event", "missing_done"),
    ("invalid_json", "invalid_json"),
    ("abort_mid_body", "upstream_disconnect"),
]


def test_openai_errors_carry_the_reason(node_sdks: Path, gateway: ServerThread) -> None:
    cases = [(api, fault) for api in ("chat", "responses") for fault, _ in CUTS]
    reasons = [reason for _ in ("chat", "responses") for _, reason in CUTS]
    for result, reason in zip(run_node(node_sdks, gateway.url, cases), reasons, strict=True):
        assert not result["ok"], result
        assert result["isOpenAIError"], result
        assert result["code"] == reason, result
        assert result["error"]["code"] == reason
        assert result["error"]["type"] == "stream_incomplete"
        assert f"({reason})" in result["message"]


def test_anthropic_errors_carry_the_reason(node_sdks: Path, gateway: ServerThread) -> None:
    cases = [(api, fault) for api in ("messages", "messages_helper") for fault, _ in CUTS]
    reasons = [reason for _ in ("messages", "messages_helper") for _, reason in CUTS]
    for result, reason in zip(run_node(node_sdks, gateway.url, cases), reasons, strict=True):
        assert not result["ok"], result
        assert result["isAnthropicError"], result
        assert result["errorCode"] == reason, result
        body = result["error"]
        assert body["type"] == "error"
        assert body["error"]["type"] == "api_error"
        assert body["error"]["details"] == {"error_code": reason}
        assert f"({reason})" in body["error"]["message"]
