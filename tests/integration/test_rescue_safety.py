"""Continuation never without a verdict, never on the loop: an exception injected at
every step of the continuation path still ends the stream with the protocol's error
event, the annotation, a metric and an access-log line; lone UTF-16 surrogates in the
cut part and in the continuation (Chat and Messages) are relayed exactly and judged;
a 30 MB conversation cut and continued leaves a concurrent stream and /healthz on pace.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.guard.joint import Joint
from gateway.guard.jsonparse import loads
from gateway.proxy import continuation
from gateway.proxy.continuation import Rescuer
from gateway.proxy.request_body import BodyParser
from gateway.simulator import create_simulator_app, expected_text
from tests import web
from tests.conftest import ServerThread, free_port, gateway_process, running
from tests.integration.control import WAIT_SECONDS
from tests.integration.helpers import access_log_until, annotation, gateway_for, metric_value
from tests.integration.raw_upstream import chunk, raw_upstream, sse_head
from tests.integration.test_failover import CHAT, chat_text, metrics
from tests.sdk import anthropic, openai

TEXT = expected_text(20)


def continuing(primary: ServerThread, fallback: ServerThread) -> list[dict[str, Any]]:
    return [
        {
            "name": "chat",
            "prefix": "/v1",
            "continue_after_cut": True,
            "max_attempts": 3,
            "max_ejected_percent": 0,  # the primary cuts every stream, and is never out
            "upstreams": [
                {
                    "name": "primary",
                    "url": primary.url + "/v1",
                    "continuation": "assistant_prefill",
                },
                {
                    "name": "fallback",
                    "url": fallback.url + "/v1",
                    "priority": 1,
                    "continuation": "assistant_prefill",
                },
            ],
        }
    ]


@contextlib.contextmanager
def sim(**options: Any) -> Iterator[ServerThread]:
    with running(create_simulator_app(**options)) as server:
        yield server


# -- an exception at every step --------------------------------------------------------------

#: Every step of the continuation path, in the order it runs.
STEPS: list[tuple[Any, str]] = [
    (Rescuer, "_continuable"),
    (continuation, "_billed"),
    (continuation, "_text"),
    (Rescuer, "_continue"),
    (Rescuer, "_candidates"),
    (Rescuer, "_request"),
    (BodyParser, "continuation"),
    (Rescuer, "_try"),
    (Rescuer, "_hold"),
    (Rescuer, "_read"),
    (continuation, "JointCheck"),  # (its methods are the compiled guard's: not patched)
    (Joint, "rewrite_events"),
    (Rescuer, "_relaying"),
    (Rescuer, "_send"),
]


def _raise(*_: Any, **__: Any) -> Any:
    raise RuntimeError("injected")


def test_an_exception_at_every_step_of_the_continuation_ends_the_stream_with_its_verdict(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with (
        sim(default_fault="drop_after_text") as primary,
        sim() as fallback,
        gateway_for("", routes=continuing(primary, fallback), access_log=True) as gw,
    ):
        for n, (owner, name) in enumerate(STEPS, start=1):
            rid = f"injected-{name}"
            with monkeypatch.context() as patch:
                patch.setattr(owner, name, _raise)
                response = web.post(
                    gw.url + "/v1/chat/completions",
                    json=CHAT,
                    headers={"x-request-id": rid},
                    timeout=30,
                )
            assert response.status_code == 200, name
            note = annotation(response.content)
            assert (note["outcome"], note["reason"]) == ("incomplete", "missing_done"), name
            events = [
                json.loads(line[6:])
                for line in response.content.split(b"\n")
                if line.startswith(b'data: {"error"')
            ]
            assert [e["error"]["code"] for e in events] == ["missing_done"], name
            text = metrics(gw)
            streams = metric_value(
                text, "gateway_streams_total", outcome="incomplete", reason="missing_done"
            )
            assert streams == n, name
            line = access_log_until(capsys, rid)[-1]
            assert (line["outcome"], line["reason"]) == ("incomplete", "missing_done"), name
        # each failure is counted as a failed continuation (some after one had started)
        assert metric_value(text, "gateway_continuations_total", result="failed") >= len(STEPS)
        # and the path works again once nothing is injected
        assert chat_text(web.post(gw.url + "/v1/chat/completions", json=CHAT).content) == TEXT


# -- lone surrogates ---------------------------------------------------------------------------

SURROGATE = {"x-sim-surrogate": "1"}
SURROGATE_TEXT = expected_text(20, surrogate=True)


def test_lone_surrogates_in_the_cut_part_and_the_continuation_of_a_chat_stream(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with (
        sim(default_fault="drop_after_text") as primary,
        sim() as fallback,
        gateway_for("", routes=continuing(primary, fallback), access_log=True) as gw,
    ):
        # the cut part, as the primary sends it
        direct = web.post(
            primary.url + "/v1/chat/completions", json=CHAT, headers=SURROGATE, timeout=30
        ).content
        response = web.post(
            gw.url + "/v1/chat/completions",
            json=CHAT,
            headers={**SURROGATE, "x-request-id": "surrogate-chat"},
            timeout=30,
        )
        body = response.content
        assert body.startswith(direct)  # relayed byte for byte up to the cut
        body.decode("utf-8")  # valid UTF-8 throughout
        # in the cut part and in the continuation, as the upstreams escaped them
        assert direct.count(b"\\ud83d") == 1
        assert body.count(b"\\ud83d") == SURROGATE_TEXT.count("\ud83d") > 1
        assert chat_text(body) == SURROGATE_TEXT
        note = annotation(body)
        assert (note["outcome"], note["reason"], note["continued"]) == ("complete", "stop", "1")
        line = access_log_until(capsys, "surrogate-chat")[-1]
        assert (line["outcome"], line["continued"]) == ("complete", True)
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        chunks = client.chat.completions.create(**CHAT, extra_headers=SURROGATE)
        got = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert got == SURROGATE_TEXT
        text = metrics(gw)
        assert metric_value(text, "gateway_streams_total", outcome="complete") == 2
        assert metric_value(text, "gateway_continuations_total", result="ok") == 2


def test_lone_surrogates_in_a_continued_messages_stream(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with (
        sim(default_fault="drop_after_text") as primary,
        sim() as fallback,
        gateway_for("", routes=continuing(primary, fallback), access_log=True) as gw,
    ):
        client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
        with client.messages.stream(
            model="sim-1",
            max_tokens=256,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={**SURROGATE, "x-request-id": "surrogate-messages"},
        ) as events:
            text = "".join(events.text_stream)
        assert text == SURROGATE_TEXT
        line = access_log_until(capsys, "surrogate-messages")[-1]
        assert (line["outcome"], line["continued"]) == ("complete", True)
        assert metric_value(metrics(gw), "gateway_streams_total", outcome="complete") == 1


def test_lone_surrogates_where_every_continuation_is_cut_still_end_with_the_verdict() -> None:
    # Chat and Messages: the continuation is cut in turn; the stream says so.
    with (
        sim(default_fault="abort_mid_body") as primary,
        sim(default_fault="abort_mid_body") as fb,
        gateway_for("", routes=continuing(primary, fb)) as gw,
    ):
        if True:
            for path, body in [
                ("/v1/chat/completions", CHAT),
                (
                    "/v1/messages",
                    {
                        "model": "sim-1",
                        "max_tokens": 256,
                        "stream": True,
                        "messages": [{"role": "user", "content": "hi"}],
                    },
                ),
            ]:
                response = web.post(gw.url + path, json=body, headers=SURROGATE, timeout=30)
                response.content.decode("utf-8")
                assert response.content.count(b"\\ud83d") >= 2, path
                note = annotation(response.content)
                assert (note["outcome"], note["reason"], note["continued"]) == (
                    "incomplete",
                    "upstream_disconnect",
                    "1",
                ), path
            text = metrics(gw)
            assert metric_value(text, "gateway_streams_total", reason="upstream_disconnect") == 2


# -- a 30 MB conversation ----------------------------------------------------------------------

# A long conversation: 100,000 turns of 270 characters (30 MB), within the body parser's
# memory budget (request_body.PARSE_BUDGET), so that it can be continued.
BIG_BODY = (
    b'{"model":"sim-1","stream":true,"messages":['
    + b",".join([b'{"role":"user","content":"' + b"x" * 270 + b'"}'] * 100_000)
    + b"]}"
)
# The same size in a million one-character turns: past that budget, it is forwarded
# unparsed (docs/deployment.md, "Memory"), so it cannot be continued; its cut still ends
# with its verdict, never a freeze or a stream without an ending.
TINY_TURNS_BODY = (
    b'{"model":"sim-1","stream":true,"messages":['
    + b",".join([b'{"role":"user","content":"x"}'] * 1_000_000)
    + b"]}"
)


@contextlib.contextmanager
def simulator_process(*args: str) -> Iterator[str]:
    """A simulator in its own process (its parse of 30 MB holds no thread of this one)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "simulate", "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if web.get(url + "/_sim/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _gaps_around(
    gw_url: str, during: Callable[[], None]
) -> tuple[list[float], list[float], list[float], list[float]]:
    """A paced stream's gaps and /healthz's answer times, before ``during()`` and while
    it runs."""
    arrivals: list[float] = []
    health: list[tuple[float, float]] = []
    started = threading.Event()
    stop = threading.Event()

    def read() -> None:
        with (
            web.client(timeout=120) as client,
            client.stream(
                "POST",
                gw_url + "/paced/chat/completions",
                json=CHAT,
                headers={"x-sim-tokens": "1500", "x-sim-tps": "50"},
            ) as response,
        ):
            for _ in response.iter_raw():
                arrivals.append(time.perf_counter())
                if len(arrivals) == 50:
                    started.set()

    def poll() -> None:
        with web.client(timeout=30) as client:
            while not stop.is_set():
                sent = time.perf_counter()
                client.get(gw_url + "/healthz")
                health.append((sent, time.perf_counter() - sent))
                time.sleep(0.02)

    reader = threading.Thread(target=read, daemon=True)
    poller = threading.Thread(target=poll, daemon=True)
    reader.start()
    poller.start()
    assert started.wait(WAIT_SECONDS)
    begin = time.perf_counter()
    during()
    end = time.perf_counter()
    stop.set()
    poller.join(WAIT_SECONDS)
    reader.join(120)
    before = [b - a for a, b in itertools.pairwise(arrivals) if b < begin]
    within = [b - a for a, b in itertools.pairwise(arrivals) if begin <= b <= end]
    health_before = [t for s, t in health if s < begin]
    health_within = [t for s, t in health if begin <= s <= end]
    return before, within, health_before, health_within


def test_a_30_mb_conversation_is_continued_off_the_loop_within_its_deadline(
    tmp_path: Path,
) -> None:
    total = 120.0
    with (
        simulator_process("--fault", "drop_after_text") as primary,
        simulator_process() as fallback,
        simulator_process() as paced,  # not one of those that parse the 30 MB
    ):
        config = tmp_path / "gateway.toml"
        config.write_text(
            f'[[routes]]\nname = "paced"\nprefix = "/paced"\nupstream = "{paced}/v1"\n'
            '[[routes]]\nname = "chat"\nprefix = "/v1"\ncontinue_after_cut = true\n'
            f"[routes.timeouts]\ntotal = {total}\n"
            f'[[routes.upstreams]]\nname = "primary"\nurl = "{primary}/v1"\n'
            'continuation = "assistant_prefill"\n'
            f'[[routes.upstreams]]\nname = "fallback"\nurl = "{fallback}/v1"\n'
            'priority = 1\ncontinuation = "assistant_prefill"\n'
        )
        with gateway_process(["--config", str(config)], {"GATEWAY_ACCESS_LOG": "false"}) as gw:
            took: list[float] = []

            def post_big() -> None:
                sent = time.monotonic()
                response = web.post(
                    gw.url + "/v1/chat/completions",
                    content=BIG_BODY,
                    headers={"content-type": "application/json"},
                    timeout=total + 30,
                )
                took.append(time.monotonic() - sent)
                note = annotation(response.content)
                assert (note["outcome"], note.get("continued")) == ("complete", "1"), note
                assert chat_text(response.content) == TEXT

            post_big()  # the helper process is started once, before the measured run
            before, within, health_before, health_within = _gaps_around(gw.url, post_big)
            text = web.get(gw.url + "/metrics").text
            tiny = web.post(
                gw.url + "/v1/chat/completions",
                content=TINY_TURNS_BODY,
                headers={"content-type": "application/json"},
                timeout=total + 30,
            )
            assert annotation(tiny.content)["outcome"] == "incomplete"
            assert annotation(tiny.content)["reason"] == "missing_done"
            assert b'"code": "missing_done"' in tiny.content or b'"code":"missing_done"' in (
                tiny.content
            )
        # What building the continuation on the loop would hold it for: the parse, the
        # deep copy and the writing of the document (the way before the helper built it).
        began = time.perf_counter()
        document = loads(BIG_BODY)
        json.dumps(copy.deepcopy(document), ensure_ascii=False).encode()
        on_loop = time.perf_counter() - began
    assert metric_value(text, "gateway_continuations_total", result="ok") == 2
    assert all(t < total for t in took), took
    assert len(within) >= 5, within
    assert health_within, health_within
    # Measured against this stream's own gaps before the big body came, and against what
    # building the continuation on the loop costs on this machine now (both grow with its
    # load): never past 0.6 of that (at least 0.4 s).
    allowed = max(0.4, 0.6 * on_loop)
    assert max(within) < max(before) + allowed, (max(before), max(within), on_loop)
    assert max(health_within) < max(health_before) + allowed, (
        max(health_before),
        max(health_within),
        on_loop,
    )


def test_the_continuation_request_is_built_once_for_every_candidate_of_a_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    build = BodyParser.continuation

    async def counted(self: BodyParser, body: bytes, *args: Any) -> Any:
        calls.append(len(body))
        return await build(self, body, *args)

    monkeypatch.setattr(BodyParser, "continuation", counted)
    with (
        sim(default_fault="drop_after_text", fault_requests=1) as primary,
        sim(continuation="reject") as first,
        sim(continuation="reject") as second,
    ):
        routes = continuing(primary, first)
        routes[0]["upstreams"].append(
            {
                "name": "second",
                "url": second.url + "/v1",
                "priority": 1,
                "continuation": "assistant_prefill",
            }
        )
        with gateway_for("", routes=routes) as gw:
            response = web.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)
            assert chat_text(response.content) == TEXT
            text = metrics(gw)
    # three upstreams asked (two refused, the primary continued it), one request built
    assert metric_value(text, "gateway_continuations_total", result="rejected") == 2
    assert metric_value(text, "gateway_continuations_total", result="ok") == 1
    assert len(calls) == 1


async def _text_and_error_in_one_read(
    request: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """A first event and the upstream's own error event, in one write (one first read)."""
    events = (
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
        b'"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}\n\n'
        b'data: {"error":{"message":"overloaded","type":"server_error"}}\n\n'
    )
    writer.write(sse_head(b"connection: close\r\n") + chunk(events) + b"0\r\n\r\n")
    await writer.drain()


def test_a_first_read_that_holds_the_fatal_event_is_retried_by_its_real_cause(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with raw_upstream(_text_and_error_in_one_read) as bad, sim() as fallback:
        routes = [
            {
                "name": "chat",
                "prefix": "/v1",
                "max_attempts": 3,
                "upstreams": [
                    {"name": "primary", "url": bad.url + "/v1"},
                    {"name": "fallback", "url": fallback.url + "/v1", "priority": 1},
                ],
            }
        ]
        with gateway_for("", routes=routes, access_log=True) as gw:
            response = web.post(
                gw.url + "/v1/chat/completions",
                json=CHAT,
                headers={"x-request-id": "fatal-first-read"},
                timeout=30,
            )
            assert chat_text(response.content) == TEXT  # nothing of the primary's
            line = access_log_until(capsys, "fatal-first-read")[-1]
    assert [(a["upstream"], a["result"], a.get("retry_cause")) for a in line["attempts"]] == [
        ("primary", "early_eof", "upstream_error"),
        ("fallback", "ok", None),
    ]
