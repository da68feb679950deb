"""Rescuing streams end to end: a route for servers that never send ``[DONE]``
(``termination = "finish"``), and continuation after a cut.

Real gateways in front of simulators, driven with httpx and the real SDKs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.simulator import create_simulator_app, expected_text
from tests import web
from tests.conftest import ServerThread, running
from tests.integration.helpers import (
    access_log_line,
    annotation,
    gateway_for,
    metric_value,
    wait_until,
)
from tests.integration.test_failover import CHAT, chat_text, metrics, stream
from tests.sdk import anthropic, openai

TEXT = expected_text(20)


def route(upstream: ServerThread, **keys: Any) -> list[dict[str, Any]]:
    return [{"name": "chat", "prefix": "/v1", "upstream": upstream.url + "/v1", **keys}]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_termination_finish_makes_a_clean_end_after_the_finish_complete(
    simulator: ServerThread, path: str
) -> None:
    body: dict[str, Any] = (
        CHAT if "chat" in path else {"model": "sim-1", "prompt": "hi", "stream": True}
    )
    with gateway_for("", routes=route(simulator, termination="finish")) as gw:
        response = gw_post(gw, path, body, {"x-sim-fault": "drop_before_done"})
        assert response.status_code == 200
        assert annotation(response.content)["outcome"] == "complete"
        assert annotation(response.content)["reason"] == "stop"
        assert b"[DONE]" not in response.content
        # everything else is as strict as before
        for fault, reason in [
            ("drop_after_text", "missing_done"),
            ("done_without_finish", "missing_finish"),
            ("drop_mid_event", "missing_done"),
        ]:
            cut = gw_post(gw, path, body, {"x-sim-fault": fault})
            assert annotation(cut.content)["outcome"] == "incomplete", fault
            assert annotation(cut.content)["reason"] == reason, fault
        assert metric_value(metrics(gw), "gateway_streams_total", outcome="complete") == 1
    with gateway_for("", routes=route(simulator)) as gw:
        strict = gw_post(gw, path, body, {"x-sim-fault": "drop_before_done"})
        assert annotation(strict.content)["reason"] == "missing_done"


def test_termination_finish_through_the_openai_sdk(simulator: ServerThread) -> None:
    with gateway_for("", routes=route(simulator, termination="finish")) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        chunks = client.chat.completions.create(
            **CHAT, extra_headers={"x-sim-fault": "drop_before_done"}
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TEXT
        assert chat_text(stream(gw, "plain").content) == TEXT


def gw_post(gw: ServerThread, path: str, body: Any, headers: dict[str, str]) -> Any:
    return web.post(gw.url + path, json=body, headers=headers, timeout=30)


# -- continuation after a cut ------------------------------------------------------------------

MESSAGES = {
    "model": "sim-1",
    "max_tokens": 256,
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
}


def continuing(*upstreams: dict[str, Any], **keys: Any) -> list[dict[str, Any]]:
    return [
        {
            "name": "chat",
            "prefix": "/v1",
            "upstreams": list(upstreams),
            "continue_after_cut": True,
            "max_attempts": 3,
            **keys,
        }
    ]


def sim_up(name: str, server: ServerThread, **keys: Any) -> dict[str, Any]:
    return {"name": name, "url": server.url + "/v1", "continuation": "assistant_prefill", **keys}


@contextlib.contextmanager
def sim(**options: Any) -> Iterator[ServerThread]:
    with running(create_simulator_app(**options)) as server:
        yield server


def continued_chat(gw: ServerThread, rid: str) -> Any:
    return web.post(
        gw.url + "/v1/chat/completions", json=CHAT, headers={"x-request-id": rid}, timeout=30
    )


@pytest.mark.parametrize("fault", ["drop_after_text", "abort_mid_body", "invalid_json"])
def test_a_chat_stream_cut_after_some_text_is_continued_exactly(fault: str) -> None:
    with (
        sim(default_fault=fault, fault_requests=1) as upstream,
        gateway_for("", routes=continuing(sim_up("only", upstream))) as gw,
    ):
        response = continued_chat(gw, f"cut-{fault}")
        assert response.status_code == 200
        assert chat_text(response.content) == TEXT
        note = annotation(response.content)
        assert (note["outcome"], note["reason"], note.get("continued")) == (
            "complete",
            "stop",
            "1",
        )
        assert response.content.count(b"data: [DONE]") == 1
        assert response.content.count(b'"role"') == 1
        ids = {
            json.loads(line[6:])["id"]
            for line in response.content.split(b"\n")
            if line.startswith(b"data: {")
        }
        assert len(ids) == 1  # the continuation's chunks carry the original id
        text = metrics(gw)
        assert metric_value(text, "gateway_continuations_total", result="ok") == 1
        assert metric_value(text, "gateway_streams_total", outcome="complete") == 1


def test_openai_sdk_holds_exactly_the_text_after_a_cut_and_a_stall() -> None:
    for fault, keys in [
        ("drop_after_text", {}),
        ("stall_mid_stream", {"timeouts": {"idle": 1.0}}),
        ("invalid_json", {}),
    ]:
        with sim(default_fault=fault, fault_requests=1) as upstream:
            routes = continuing(sim_up("only", upstream), **keys)
            with gateway_for("", routes=routes) as gw:
                client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
                chunks = client.chat.completions.create(**CHAT)
                got = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                assert got == TEXT, fault


def test_anthropic_sdk_holds_exactly_the_text_after_a_cut() -> None:
    for fault, keys in [
        ("drop_after_text", {}),
        ("abort_mid_body", {}),
        ("invalid_json", {}),
        ("stall_mid_stream", {"timeouts": {"idle": 1.0}}),
    ]:
        with sim(default_fault=fault, fault_requests=1) as upstream:
            routes = continuing(sim_up("only", upstream), **keys)
            with gateway_for("", routes=routes) as gw:
                client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
                with client.messages.stream(
                    model="sim-1", max_tokens=256, messages=[{"role": "user", "content": "hi"}]
                ) as events:
                    text = "".join(events.text_stream)
                    final = events.get_final_message()
                assert text == TEXT, fault
                assert final.stop_reason == "end_turn"
                assert [b.type for b in final.content] == ["text"]


def test_a_fallback_that_rejects_prefill_gives_the_original_reason() -> None:
    with (
        sim(default_fault="drop_after_text") as primary,
        sim(continuation="reject") as fallback,
    ):
        routes = continuing(
            sim_up("primary", primary, continuation="none"),
            sim_up("fallback", fallback, priority=1),
        )
        with gateway_for("", routes=routes) as gw:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
            with pytest.raises(openai.APIError) as raised:
                for _ in client.chat.completions.create(**CHAT):
                    pass
            assert "missing_done" in str(raised.value.body or raised.value)
            text = metrics(gw)
            assert metric_value(text, "gateway_continuations_total", result="rejected") == 1
            assert metric_value(text, "gateway_streams_total", reason="missing_done") == 1


def test_a_cut_inside_a_tool_call_is_not_continued() -> None:
    with sim() as upstream, gateway_for("", routes=continuing(sim_up("only", upstream))) as gw:
        body = {**CHAT, "tools": [TOOL]}
        response = web.post(
            gw.url + "/v1/chat/completions",
            json=body,
            headers={"x-sim-fault": "drop_mid_event"},
            timeout=30,
        )
        note = annotation(response.content)
        assert (note["outcome"], note["reason"]) == ("incomplete", "missing_done")
        assert "continued" not in note
        text = metrics(gw)
        assert metric_value(text, "gateway_continuations_total", result="not_continuable") == 1


def test_a_continuation_that_is_itself_cut_gives_the_original_reason() -> None:
    with (
        sim(default_fault="abort_mid_body") as upstream,
        gateway_for("", routes=continuing(sim_up("only", upstream))) as gw,
    ):
        response = continued_chat(gw, "twice")
        note = annotation(response.content)
        assert (note["outcome"], note["reason"], note["continued"]) == (
            "incomplete",
            "upstream_disconnect",
            "1",
        )
        text = metrics(gw)
        assert metric_value(text, "gateway_continuations_total", result="failed") == 1


TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
    },
}


def test_an_upstream_error_event_mid_stream_is_withheld_while_a_continuation_is_tried() -> None:
    with (
        sim(default_fault="error_event", fault_requests=1) as upstream,
        gateway_for("", routes=continuing(sim_up("only", upstream))) as gw,
    ):
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        chunks = client.chat.completions.create(**CHAT)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TEXT
    # with no upstream that can continue, the upstream's own error goes out as before
    with sim(default_fault="error_event") as upstream:
        routes = continuing(sim_up("only", upstream, continuation="none"))
        with gateway_for("", routes=routes) as gw:
            response = continued_chat(gw, "error-kept")
            note = annotation(response.content)
            assert (note["outcome"], note["reason"]) == ("incomplete", "upstream_error")
            assert b'"error"' in response.content
            assert response.content.count(b'data: {"error"') == 1


def test_the_usage_of_a_continued_stream_is_the_sum_of_both_attempts() -> None:
    body = {**CHAT, "stream_options": {"include_usage": True}}
    with (
        sim(default_fault="drop_after_text", fault_requests=1) as upstream,
        gateway_for("", routes=continuing(sim_up("only", upstream))) as gw,
    ):
        response = web.post(gw.url + "/v1/chat/completions", json=body, timeout=30)
        usage = [
            json.loads(line[6:])["usage"]
            for line in response.content.split(b"\n")
            if line.startswith(b"data: {") and b'"usage":{' in line
        ]
        assert len(usage) == 1
        # the cut attempt's 3 deltas (estimated) and the continuation's 17 billed
        assert usage[0]["completion_tokens"] == 20
        assert usage[0]["total_tokens"] == usage[0]["prompt_tokens"] + 20
        text = metrics(gw)
        assert metric_value(text, "gateway_upstream_attempts_total", result="incomplete") == 1
        assert metric_value(text, "gateway_upstream_attempts_total", result="ok") == 1


def test_a_stream_continued_twice_counts_and_charges_every_attempt() -> None:
    # Two cuts, then a whole continuation: the broken continuation's tokens reached the
    # client and were billed, so the usage chunk and the named client's charge hold them.
    body = {**CHAT, "stream_options": {"include_usage": True}}
    key = "sk-twice"
    client = {"name": "twice", "key_sha256": [hashlib.sha256(key.encode()).hexdigest()]}
    with (
        sim(default_fault="drop_after_text", fault_requests=2) as upstream,
        gateway_for(
            "",
            routes=continuing(sim_up("only", upstream), max_continuations=2),
            clients=[client],
        ) as gw,
    ):
        response = web.post(
            gw.url + "/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert chat_text(response.content) == TEXT
        assert annotation(response.content).get("continued") == "2"
        usage = [
            json.loads(line[6:])["usage"]
            for line in response.content.split(b"\n")
            if line.startswith(b"data: {") and b'"usage":{' in line
        ]
        assert len(usage) == 1
        # 3 deltas from each cut attempt (estimated), the last continuation's 14 billed
        assert usage[0]["completion_tokens"] == 20
        text = metrics(gw)
        output = metric_value(text, "gateway_client_tokens_total", client="twice", type="output")
        assert output == 20
        charged = metric_value(text, "gateway_client_tokens_total", client="twice", type="input")
        assert charged == usage[0]["prompt_tokens"]


def test_the_access_log_records_both_attempts_of_a_continued_stream(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with (
        sim(default_fault="drop_after_text", fault_requests=1) as upstream,
        gateway_for("", routes=continuing(sim_up("only", upstream)), access_log=True) as gw,
    ):
        response = continued_chat(gw, "logged")
        assert annotation(response.content)["continued"] == "1"
        line = access_log_line(capsys, "logged")
    assert line["continued"] is True
    assert (line["outcome"], line["reason"]) == ("complete", "stop")
    assert [(a["upstream"], a["result"]) for a in line["attempts"]] == [
        ("only", "incomplete"),
        ("only", "ok"),
    ]


def test_anthropic_sdk_raises_with_the_original_reason_when_the_fallback_rejects_prefill() -> None:
    with (
        sim(default_fault="drop_after_text") as primary,
        sim(continuation="reject") as fallback,
    ):
        routes = continuing(
            sim_up("primary", primary, continuation="none"),
            sim_up("fallback", fallback, priority=1),
        )
        with gateway_for("", routes=routes) as gw:
            client = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0)
            with (
                pytest.raises(anthropic.APIStatusError) as raised,
                client.messages.stream(
                    model="sim-1", max_tokens=256, messages=[{"role": "user", "content": "hi"}]
                ) as events,
            ):
                "".join(events.text_stream)
            assert "missing_done" in str(raised.value)
            text = metrics(gw)
            assert metric_value(text, "gateway_continuations_total", result="rejected") == 1


def test_a_legacy_completions_stream_is_continued_by_appending_to_the_prompt() -> None:
    body = {"model": "sim-1", "prompt": "Say something: ", "stream": True}
    with (
        sim(default_fault="drop_after_text", fault_requests=1) as upstream,
        gateway_for("", routes=continuing(sim_up("only", upstream))) as gw,
    ):
        response = web.post(gw.url + "/v1/completions", json=body, timeout=30)
        note = annotation(response.content)
        assert (note["outcome"], note["continued"]) == ("complete", "1")
        text = "".join(
            c.get("text") or ""
            for line in response.content.split(b"\n")
            if line.startswith(b"data: {")
            for c in json.loads(line[6:])["choices"]
        )
        assert text == TEXT


@pytest.mark.parametrize("size", ["small", "large"])
def test_a_continuation_carries_the_whole_conversation(size: str) -> None:
    # The relay keeps only a request's small top-level members; the continuation parses
    # the body again, so its prefill follows every message the client sent, also for a
    # body large enough to be parsed off the loop.
    history = [
        {"role": "system", "content": "be brief " * (200_000 if size == "large" else 1)},
        {"role": "user", "content": "hi"},
    ]
    body = {**CHAT, "messages": history}
    with (
        sim(default_fault="drop_after_text", fault_requests=1) as upstream,
        gateway_for("", routes=continuing(sim_up("only", upstream))) as gw,
    ):
        rid = f"whole-{size}"
        response = web.post(
            gw.url + "/v1/chat/completions", json=body, headers={"x-request-id": rid}, timeout=60
        )
        assert chat_text(response.content) == TEXT
        assert annotation(response.content).get("continued") == "1"
        seen = web.get(f"{upstream.url}/_sim/requests/{rid}").json()  # the continuation's
        if size == "small":
            messages = seen["body"]["messages"]
            assert messages[:2] == history
            assert messages[2]["role"] == "assistant"
            assert messages[2]["content"]
            assert TEXT.startswith(messages[2]["content"])
        else:  # too large for the simulator to keep: its size says the history went along
            assert seen["body_size"] > len(history[0]["content"])


def test_a_continuation_stopped_by_the_drain_still_says_it_continued(tmp_path: Any) -> None:
    # The drain's timeout lands while a continuation is being relayed: the client has
    # its text, so the annotation and the access log say the stream was continued.
    import signal
    import threading
    import time

    from tests.conftest import gateway_process
    from tests.integration.helpers import access_log_lines

    with sim(default_fault="drop_after_text", fault_requests=1, default_tps=4) as upstream:
        config = tmp_path / "gateway.toml"
        config.write_text(
            '[[routes]]\nname = "chat"\nprefix = "/v1"\ncontinue_after_cut = true\n'
            f'[[routes.upstreams]]\nname = "only"\nurl = "{upstream.url}/v1"\n'
            'continuation = "assistant_prefill"\n'
        )
        with gateway_process(["--config", str(config), "--drain-timeout", "1"]) as gw:
            got: dict[str, Any] = {}
            thread = threading.Thread(
                target=lambda: got.update(response=continued_chat(gw, "drained-continuation"))
            )
            thread.start()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the continuation has been asked
                if web.get(f"{upstream.url}/_sim/requests/drained-continuation").status_code == 200:
                    seen = web.get(f"{upstream.url}/_sim/requests/drained-continuation").json()
                    if seen["body"]["messages"][-1]["role"] == "assistant":
                        break
                time.sleep(0.05)
            first = _sent(upstream.url, "drained-continuation")
            wait_until(  # a delta of it has gone out (4 a second), after its first event
                lambda: _sent(upstream.url, "drained-continuation") > first,
                "a delta of the continuation went out",
            )
            gw.proc.send_signal(signal.SIGTERM)
            thread.join(60)
            gw.proc.wait(timeout=30)
            out, _ = gw.stop()
    response = got["response"]
    note = annotation(response.content)
    assert (note["reason"], note.get("continued")) == ("gateway_shutdown", "1")
    line = next(x for x in access_log_lines(out) if x["request_id"] == "drained-continuation")
    assert line["continued"] is True


def _sent(url: str, request_id: str) -> int:
    """The bytes the simulator has sent of the answer to ``request_id``."""
    return int(web.get(f"{url}/_sim/requests/{request_id}").json()["bytes_sent"])


def _named(name: str) -> tuple[str, dict[str, Any]]:
    key = f"sk-{name}"
    return key, {"name": name, "key_sha256": [hashlib.sha256(key.encode()).hexdigest()]}


def _every_continuation_cut(name: str, path: str, body: bytes) -> tuple[Any, str]:
    """A stream whose original and continuation are both cut, sent by the named client
    ``name``: the response (checked to say it was continued) and the gateway's metrics."""
    key, client = _named(name)
    with (
        sim(default_fault="abort_mid_body") as upstream,
        gateway_for("", routes=continuing(sim_up("only", upstream)), clients=[client]) as gw,
    ):
        response = web.post(
            gw.url + path,
            content=body,
            headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            timeout=30,
        )
        note = annotation(response.content)
        assert (note["outcome"], note["continued"]) == ("incomplete", "1")
        return response, metrics(gw)


def test_a_stream_whose_every_continuation_fails_charges_every_attempt() -> None:
    # The original and its continuation are both cut after three deltas: the client got
    # both parts, and both attempts were billed upstream (each with the whole prompt).
    body = json.dumps(CHAT).encode()
    response, text = _every_continuation_cut("failing", "/v1/chat/completions", body)
    assert (
        chat_text(response.content) == expected_text(3) + expected_text(6)[len(expected_text(3)) :]
    )
    output = metric_value(
        text, "gateway_client_tokens_total", client="failing", type="output", source="estimated"
    )
    assert output == 6  # one a content event relayed, three from each attempt
    charged = metric_value(
        text, "gateway_client_tokens_total", client="failing", type="input", source="estimated"
    )
    assert charged == 2 * max(1, len(body) // 4)  # the body's estimate, once an attempt


def test_a_continuation_the_client_leaves_charges_both_attempts() -> None:
    # The client leaves while the (slow) continuation is being relayed: it had the cut
    # attempt's three deltas and some of the continuation's, and both attempts were
    # billed upstream.
    import time

    import httpx

    key, client = _named("leaving")
    body = json.dumps(CHAT).encode()
    with (
        sim(default_fault="drop_after_text", fault_requests=1, default_tps=4) as upstream,
        gateway_for("", routes=continuing(sim_up("only", upstream)), clients=[client]) as gw,
    ):
        deltas = 0
        with (
            httpx.Client(timeout=30) as http,
            http.stream(
                "POST",
                gw.url + "/v1/chat/completions",
                content=body,
                headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            ) as response,
        ):
            for line in response.iter_lines():
                if line.startswith("data: {") and chat_text(line.encode()):
                    deltas += 1
                if deltas == 5:  # two of the continuation's
                    break
        assert deltas == 5
        output = 0.0
        deadline = time.monotonic() + 30
        while output == 0 and time.monotonic() < deadline:
            text = metrics(gw)
            output = metric_value(
                text, "gateway_client_tokens_total", client="leaving", type="output"
            )
            time.sleep(0.05)
    assert output >= 5  # one a content event relayed: at least what the client read
    charged = metric_value(
        text, "gateway_client_tokens_total", client="leaving", type="input", source="estimated"
    )
    assert charged == 2 * max(1, len(body) // 4)  # the body's estimate, once an attempt


def test_a_messages_stream_whose_every_continuation_fails_charges_every_attempt() -> None:
    # A cut Messages stream has reported usage (message_start's) for its first attempt
    # only: the charge is every attempt's, each by what it reported, estimated overall.
    body = json.dumps(MESSAGES).encode()
    response, text = _every_continuation_cut("failing-messages", "/v1/messages", body)
    events = [
        json.loads(line[6:])
        for line in response.content.split(b"\n")
        if line.startswith(b"data: {")
    ]
    first_input = next(e for e in events if e["type"] == "message_start")["message"]["usage"][
        "input_tokens"
    ]
    charged = {
        kind: metric_value(
            text,
            "gateway_client_tokens_total",
            client="failing-messages",
            type=kind,
            source="estimated",
        )
        for kind in ("input", "output")
    }
    assert charged["output"] == 6  # three content events from each attempt
    # The continuation's prompt holds the original's and the text so far.
    assert charged["input"] > 2 * first_input


def test_a_continued_answer_names_the_upstream_that_finished_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 45 item 15: the access log named the upstream that cut the stream as the one
    that answered; the answer's end came from the one that continued it."""
    with (
        sim(default_fault="drop_after_text") as primary,
        sim() as fallback,
    ):
        routes = continuing(sim_up("primary", primary), sim_up("fallback", fallback, priority=1))
        with gateway_for("", routes=routes, access_log=True) as gw:
            response = continued_chat(gw, "finished-by")
            assert annotation(response.content)["continued"] == "1"
            line = access_log_line(capsys, "finished-by")
    assert [(a["upstream"], a["result"]) for a in line["attempts"]] == [
        ("primary", "incomplete"),
        ("fallback", "ok"),
    ]
    assert line["upstream"] == "fallback"
    assert response.headers["x-gateway-upstream"] == "primary"  # sent before the cut


def test_a_continuation_to_an_upstream_that_signs_is_signed() -> None:
    """Issue 45 item 16: on an ``auto`` route whose pool mixes a chat upstream with one
    that signs (SigV4), a continuation to the signing one went without its signature."""
    from gateway.protocols.sigv4 import AwsKeys

    keys = AwsKeys("AKIDCONTINUE", "continue-secret")
    with (
        sim(default_fault="drop_after_text") as primary,
        sim() as fallback,
    ):
        routes = continuing(
            sim_up("primary", primary),
            sim_up("fallback", fallback, priority=1, aws={"region": "us-east-1"}),
        )
        credentials = {"chat": {"fallback": keys.packed()}}
        with gateway_for("", routes=routes, credentials=credentials) as gw:
            response = continued_chat(gw, "signed-continuation")
            assert annotation(response.content)["continued"] == "1"
        (record,) = fallback.server.config.app.state.records.latest(10)
        assert record.headers["authorization"]["present"]
        assert record.headers["x-amz-date"]


def test_a_cut_stream_whose_body_cannot_be_read_says_why_it_was_not_continued(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 45 item 8: a body of many tiny messages past the body parser's budget (here
    made small: 150,000 messages pass it) was forwarded unparsed; cut, it was silently not
    continued and the access log said ``model: null``. The log and the metrics now say
    why (``body_unreadable``), and the model is read where the bytes name it."""
    body = (
        b'{"model":"sim-1","stream":true,"messages":['
        + b",".join([b'{"role":"user","content":"x"}'] * 150_000)
        + b"]}"
    )
    with (
        sim(default_fault="drop_after_text", fault_requests=1) as upstream,
        gateway_for("", routes=continuing(sim_up("only", upstream)), access_log=True) as gw,
    ):
        bodies = gw.server.config.app.gateway.relay.bodies
        bodies.off_loop_bytes, bodies.parse_budget = 64 * 1024, 16 * 1024 * 1024
        response = web.post(
            gw.url + "/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json", "x-request-id": "unreadable"},
            timeout=60,
        )
        note = annotation(response.content)
        line = access_log_line(capsys, "unreadable")
        text = metrics(gw)
    assert (note["outcome"], note["reason"]) == ("incomplete", "missing_done")
    assert line["model"] == "sim-1"
    assert line["continued"] is False
    assert line["not_continued"] == "body_unreadable"
    assert metric_value(text, "gateway_continuations_total", result="body_unreadable") == 1
