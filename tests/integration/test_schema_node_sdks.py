"""openai-node and the Anthropic TypeScript SDK against a real gateway with
``schema_check = "end"`` in front of the simulator's structured answers: a valid answer
reads whole, and a shape fault makes the SDK throw at the violating event, with the
reason ``schema_mismatch`` (the chunks it yielded first are counted)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.simulator import STRUCTURED_SCHEMA
from tests.conftest import ServerThread
from tests.integration.helpers import gateway_for
from tests.integration.test_node_sdks import SCRIPT_SECONDS, node_sdks  # noqa: F401

#: Each case [api, shape] as JSON in argv[3], the schema in argv[4]; one JSON line each.
SCRIPT = r"""
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const base = process.argv[2];
const cases = JSON.parse(process.argv[3]);
const schema = JSON.parse(process.argv[4]);
const openai = new OpenAI({ baseURL: base + '/v1', apiKey: 'k', maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: base, apiKey: 'k', maxRetries: 0 });
const user = [{ role: 'user', content: 'Invent a person.' }];

for (const [api, shape] of cases) {
  const options = { headers: { 'x-sim-structured': shape } };
  let text = '';
  let chunks = 0;
  try {
    if (api === 'chat') {
      const stream = await openai.chat.completions.create({
        model: 'sim-1', messages: user, stream: true,
        response_format: { type: 'json_schema', json_schema: { name: 'person', schema } },
      }, options);
      for await (const chunk of stream) {
        chunks += 1;
        text += chunk.choices[0]?.delta?.content ?? '';
      }
    } else {
      const stream = await anthropic.messages.create({
        model: 'claude-sim', max_tokens: 256, messages: user, stream: true,
        output_format: { type: 'json_schema', schema },
      }, options);
      for await (const event of stream) {
        chunks += 1;
        if (event.type === 'content_block_delta' && event.delta.type === 'text_delta') {
          text += event.delta.text;
        }
      }
    }
    console.log(JSON.stringify({ api, shape, ok: true, text, chunks }));
  } catch (err) {
    console.log(JSON.stringify({
      api, shape, ok: false, text, chunks,
      isOpenAIError: err instanceof OpenAI.APIError,
      isAnthropicError: err instanceof Anthropic.APIError,
      code: err?.code ?? null,
      errorCode: err?.errorCode ?? null,
      message: String(err?.message ?? err),
    }));
  }
}
"""


@pytest.fixture(scope="module")
def schema_gateway(simulator: ServerThread) -> Iterator[ServerThread]:
    routes = [
        {
            "name": "default",
            "prefix": "/v1",
            "upstreams": [{"name": "sim", "url": simulator.url + "/v1"}],
            "schema_check": "end",
        }
    ]
    with gateway_for("", routes=routes) as server:
        yield server


def run(directory: Path, base: str, cases: list[list[str]]) -> list[dict[str, Any]]:
    script = directory / "schema_probe.mjs"
    script.write_text(SCRIPT)
    result = subprocess.run(
        ["node", str(script), base, json.dumps(cases), json.dumps(STRUCTURED_SCHEMA)],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=SCRIPT_SECONDS,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_node_sdks_read_a_valid_answer_and_throw_at_the_violating_event(
    node_sdks: Path,  # noqa: F811
    schema_gateway: ServerThread,
) -> None:
    cases = [[api, shape] for api in ("chat", "messages") for shape in ("valid", "enum")]
    results = run(node_sdks, schema_gateway.url, cases)
    assert [[r["api"], r["shape"]] for r in results] == cases
    by = {(r["api"], r["shape"]): r for r in results}
    for api in ("chat", "messages"):
        valid, broken = by[api, "valid"], by[api, "enum"]
        assert valid["ok"], valid
        assert json.loads(valid["text"]) == {"name": "Ada Lovelace", "age": 36, "role": "admin"}
        assert not broken["ok"], broken
        assert '"root"' not in broken["text"]  # the closing delta was withheld
        assert 0 < broken["chunks"] < valid["chunks"]
    assert by["chat", "enum"]["isOpenAIError"]
    assert by["chat", "enum"]["code"] == "schema_mismatch"
    assert by["messages", "enum"]["isAnthropicError"]
    assert by["messages", "enum"]["errorCode"] == "schema_mismatch"
