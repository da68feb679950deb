"""The official Node SDKs the integration tests drive, installed once per virtualenv.

``tests/integration/test_node_sdks.py`` runs a small Node script (``SCRIPT``)
against a real gateway with the pinned ``openai`` and ``@anthropic-ai/sdk``
packages, and ``tests/integration/test_resume_eventsource.py`` a browser-style
``EventSource`` (the ``eventsource`` package). They come from the npm registry
into a cache directory (inside the virtualenv when there is one, so ``make
clean`` removes them; else a temporary one), in a bounded time, one installer
at a time.

``make test`` installs them with the other test extras (``python -m
tests.node_sdks``), so that the suite does not wait on npm; the tests' fixture
installs them itself when that step did not run. Without ``node``/``npm`` or
the registry, the install step says so and carries on: the tests then skip
with the reason, or fail with ``CI=true``.
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

#: The SDK versions under test (openai 7 needs Node 22; 6.x runs on Node 18+).
PACKAGES = {"openai": "6.49.0", "@anthropic-ai/sdk": "1.14.0", "eventsource": "3.0.7"}
INSTALL_SECONDS = 240

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


#: A browser-style ``EventSource`` (the ``eventsource`` package) on the URL in argv[2]:
#: it reconnects by itself with ``Last-Event-ID`` until the ``[DONE]`` event; prints
#: {"data": [...every message's data in order], "opens": n, "lastIds": [...]}.
EVENTSOURCE_SCRIPT = r"""
import { EventSource } from 'eventsource';

const es = new EventSource(process.argv[2]);
const data = [];
const ids = [];
let opens = 0;
const timer = setTimeout(() => { es.close(); done('timeout'); }, 60000);
function done(error) {
  clearTimeout(timer);
  console.log(JSON.stringify({ data, opens, ids, error }));
}
es.onopen = () => { opens += 1; };
es.onmessage = (event) => {
  data.push(event.data);
  ids.push(event.lastEventId);
  if (event.data === '[DONE]') { es.close(); done(null); }
};
"""


class NodeSDKsUnavailable(Exception):
    """node/npm is missing, or the packages could not be installed (the message says)."""


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


def install() -> Path:
    """A directory holding the pinned packages and the script; built once per key."""
    npm = shutil.which("npm")
    if shutil.which("node") is None or npm is None:
        raise NodeSDKsUnavailable("node and npm are not on PATH: the Node SDK checks need them")
    scripts = [PACKAGES, SCRIPT, EVENTSOURCE_SCRIPT]
    key = hashlib.sha256(json.dumps(scripts, sort_keys=True).encode()).hexdigest()
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
                raise NodeSDKsUnavailable(
                    f"npm install did not finish in {INSTALL_SECONDS} s"
                ) from None
            if result.returncode != 0:
                tail = (result.stdout + result.stderr)[-800:]
                raise NodeSDKsUnavailable(
                    f"npm install of {PACKAGES} failed (registry unreachable?):\n{tail}"
                )
            (building / "eventsource.mjs").write_text(EVENTSOURCE_SCRIPT, encoding="utf-8")
            (building / "probe.mjs").write_text(SCRIPT, encoding="utf-8")
            building.rename(target)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return target


def main() -> int:
    """``make``'s install step: install now, or say why not and leave it to the tests."""
    try:
        target = install()
    except NodeSDKsUnavailable as exc:
        print(f"Node SDKs not installed ({exc}); their tests will say so", file=sys.stderr)
    else:
        print(f"Node SDKs {PACKAGES} in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
