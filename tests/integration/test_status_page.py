"""The ``/status`` page on a real gateway: who may see it, and what a browser shows.

Access is driven for real: a client that is not on loopback is made with a
trusted proxy on 127.0.0.1 and an ``X-Forwarded-For`` naming a remote
address (the gateway then judges that address, as it would behind a real
proxy). The page itself is loaded by a real headless Chromium while streams
run through the gateway: its rendered text must show the live stream, the
cut stream's request id and reason, and a model name with HTML in it as the
text it is; a screenshot is kept (``status.png`` in the test's tmp_path).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tests import web
from tests.conftest import ServerThread
from tests.integration.browser import chromium
from tests.integration.helpers import annotation, gateway_for
from tests.integration.raw_upstream import RawRequest, chunk, raw_upstream, sse_head

KEY = "sk-status-test-key"
REMOTE = {"x-forwarded-for": "203.0.113.7"}
HTML_MODEL = '<img src=x onerror="window.__pwned=1"><b>bold</b>&amp;'
CHAT = {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def test_the_status_page_is_off_by_default(simulator: ServerThread) -> None:
    with gateway_for(simulator.url + "/v1") as gw:
        response = web.get(gw.url + "/status")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "no_route"


def test_loopback_only_without_client_keys(simulator: ServerThread) -> None:
    with gateway_for(simulator.url + "/v1", status_page=True, trusted_proxies=["127.0.0.1"]) as gw:
        local = web.get(gw.url + "/status")
        remote = web.get(gw.url + "/status", headers=REMOTE)
        local_behind_proxy = web.get(gw.url + "/status", headers={"x-forwarded-for": "::1"})
    assert local.status_code == 200
    assert local.headers["content-type"].startswith("text/html")
    assert local.headers["cache-control"] == "no-store"
    assert "script-src" not in local.headers["content-security-policy"]
    assert local.headers["content-security-policy"].startswith("default-src 'none'")
    assert "llm-stream-gateway status" in local.text
    assert remote.status_code == 403
    assert remote.json()["error"]["code"] == "forbidden"
    assert "llm-stream-gateway status" not in remote.text
    assert local_behind_proxy.status_code == 200


def test_with_client_keys_a_remote_client_needs_one(simulator: ServerThread) -> None:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    with gateway_for(
        simulator.url + "/v1",
        status_page=True,
        trusted_proxies=["127.0.0.1"],
        client_key_sha256=[digest],
    ) as gw:
        without = web.get(gw.url + "/status", headers=REMOTE)
        wrong = web.get(gw.url + "/status", headers=REMOTE | {"x-api-key": "sk-wrong"})
        bearer = web.get(gw.url + "/status", headers=REMOTE | {"authorization": f"Bearer {KEY}"})
        local = web.get(gw.url + "/status")
    assert (without.status_code, wrong.status_code) == (401, 401)
    assert without.json()["error"]["code"] == "unauthorized"
    assert bearer.status_code == 200
    assert local.status_code == 200
    # the key never shows, its digest only cut short (check-config's redaction)
    assert KEY not in bearer.text
    assert digest not in bearer.text
    assert digest[:8] in bearer.text


@contextlib.contextmanager
def slow_stream(base: str, request_id: str) -> Iterator[None]:
    """A slow stream through the gateway, read in a thread until the block ends."""
    stop = threading.Event()

    def read() -> None:
        with (
            web.client(timeout=60) as client,
            client.stream(
                "POST",
                base + "/v1/chat/completions",
                json=CHAT,
                headers={"x-request-id": request_id, "x-sim-tps": "5", "x-sim-tokens": "300"},
            ) as response,
        ):
            for _ in response.iter_raw():
                if stop.is_set():
                    return  # closing the response is the client leaving

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


def _wait_for_text(url: str, text: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in web.get(url, timeout=5).text:
        assert time.monotonic() < deadline, f"{text!r} never appeared on {url}"
        time.sleep(0.05)


def test_a_browser_shows_live_and_cut_streams_and_escapes_what_it_shows(
    simulator: ServerThread, tmp_path: Path
) -> None:
    with gateway_for(simulator.url + "/v1", status_page=True) as gw:
        with web.client(base_url=gw.url, timeout=15) as client:
            for index in range(3):
                body = client.post(
                    "/v1/chat/completions",
                    json=CHAT,
                    headers={"x-request-id": f"status-ok-{index}"},
                ).content
                assert annotation(body)["outcome"] == "complete"
            cut = client.post(
                "/v1/chat/completions",
                json=CHAT | {"model": HTML_MODEL},
                headers={"x-request-id": "status-cut-1", "x-sim-fault": "drop_before_done"},
            ).content
            assert annotation(cut)["reason"] == "missing_done"
            invalid = client.post(
                "/v1/chat/completions",
                json=CHAT,
                headers={"x-request-id": "status-invalid-1", "x-sim-fault": "invalid_json"},
            ).content
            assert annotation(invalid)["reason"] == "invalid_json"
        with slow_stream(gw.url, "status-live"), chromium() as page:
            _wait_for_text(gw.url + "/status", "status-live")
            page.open(gw.url + "/status")
            text = page.text()
            shot = page.screenshot(tmp_path / "status.png")
            pwned = page.evaluate("typeof window.__pwned")
            elements = page.evaluate("document.querySelectorAll('img, script, b').length")

    assert shot[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(shot) > 10_000
    # the live stream, while it runs
    assert "Active streams: 1" in text
    assert "status-live" in text
    # the cut stream's row: its request id and reason, its model as plain text
    cut_row = next(line for line in text.splitlines() if "status-cut-1" in line)
    assert "missing_done" in cut_row
    assert HTML_MODEL in cut_row
    assert "invalid_json" in next(line for line in text.splitlines() if "status-invalid-1" in line)
    # nothing of the model name became markup, nothing ran
    assert pwned == "undefined"
    assert elements == 0
    # the counts, and the build and configuration summary
    assert "Requests in the last 15 minutes" in text
    counts_row = next(line for line in text.splitlines() if line.startswith("default\tdefault\t"))
    assert counts_row.split("\t")[2:5] == ["3", "2", "40.0 %"]
    assert "Build and configuration" in text
    assert '"status_page": true' in text


CHAT_HEAD = b'{"messages":[{"role":"user","content":"hi"}],"stream":true,"model":'


CUT_CHAT = b'data: {"choices":[{"index":0,"delta":{"content":"hel"}}]}\n\n'


async def _answer_cut(
    request: RawRequest, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """A Chat stream that ends cleanly before its terminator."""
    writer.write(sse_head(b"connection: close\r\n") + chunk(CUT_CHAT) + b"0\r\n\r\n")
    await writer.drain()


def test_the_status_page_renders_a_lone_surrogate_a_client_sent_as_its_model() -> None:
    with (
        raw_upstream(_answer_cut) as upstream,
        gateway_for(upstream.url + "/v1", status_page=True) as gw,
        web.client(base_url=gw.url, timeout=15) as client,
    ):
        cut = client.post(
            "/v1/chat/completions",
            content=CHAT_HEAD + b'"\\ud800<b>"}',
            headers={"content-type": "application/json", "x-request-id": "surrogate-cut"},
        ).content
        assert annotation(cut)["reason"] == "missing_done"
        page = client.get("/status")
    assert page.status_code == 200
    row = next(line for line in page.text.split("<tr>") if "surrogate-cut" in line)
    assert "\ufffd&lt;b&gt;" in row


def test_the_page_shows_the_cache_resume_the_stream_store_and_redis(
    simulator: ServerThread,
) -> None:
    """Issue 45 item 14: the page showed nothing of the cache, resume, the stream store
    or Redis."""
    routes = [
        {"name": "cached", "prefix": "/v1", "upstream": simulator.url + "/v1", "cache": True},
        {"name": "kept", "prefix": "/r/v1", "upstream": simulator.url + "/v1", "resume": True},
    ]
    with gateway_for("", routes=routes, status_page=True) as gw:
        for _ in range(2):
            web.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)
        page = web.get(gw.url + "/status").text
    section = page.split('<section id="services">', 1)[1].split("</section>", 1)[0]
    assert "Cache, resume, stores and Redis" in section
    assert "<td>cache</td><td>on for routes cached</td>" in section
    assert "<td>resume</td><td>on for routes kept</td>" in section
    assert "stream store: memory" in section
    assert "of 256 MiB held" in section
    assert "limits backend: memory</td><td>unused (no client has limits)" in section
    assert "<td>Redis</td><td>not configured</td>" in section
    assert "cache_hit 1" in section
    assert "cache_miss 1" in section
