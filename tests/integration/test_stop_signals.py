"""Ctrl-C (SIGINT) drains as SIGTERM does; a second signal stops at once, still annotated."""

from __future__ import annotations

import signal
import threading
from typing import Any

from tests import web
from tests.conftest import GatewayProcess, gateway_process
from tests.integration.control import WAIT_SECONDS, GatedUpstream, gated_upstream, wait_until
from tests.integration.helpers import access_log_lines, annotation

CHAT = {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _streams(gw: GatewayProcess, upstream: GatedUpstream, names: list[str]) -> Any:
    """Start one gated stream per name, each held at its gate with its first event at
    the client (not only written by the upstream); the results dict and the threads."""
    results: dict[str, bytes] = {}
    started = {name: threading.Event() for name in names}

    def stream(name: str) -> None:
        with (
            web.client(timeout=60) as client,
            client.stream(
                "POST", gw.url + "/v1/chat/completions", json=CHAT, headers={"x-gate": name}
            ) as response,
        ):
            body = b""
            for chunk in response.iter_raw():
                body += chunk
                started[name].set()
            results[name] = body

    threads = [threading.Thread(target=stream, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for name in names:
        assert upstream.gate(name).reached.wait(WAIT_SECONDS), name
        assert started[name].wait(WAIT_SECONDS), name
    return results, threads


def _assert_clean(out: bytes, err: bytes, requests: int) -> list[dict[str, Any]]:
    text = err.decode(errors="replace")
    assert "Traceback" not in text, text
    assert "Exception in ASGI application" not in text, text
    assert "CancelledError" not in text, text
    lines = access_log_lines(out)
    assert len(lines) == requests, out
    assert all(line["outcome"] is not None for line in lines), lines
    return lines


def test_ctrl_c_drains_like_sigterm() -> None:
    with (
        gated_upstream() as upstream,
        gateway_process(["--upstream", upstream.url + "/v1", "--drain-timeout", "2"]) as gw,
    ):
        results, threads = _streams(gw, upstream, ["short", "long"])
        gw.proc.send_signal(signal.SIGINT)
        wait_until(lambda: web.get(gw.url + "/readyz", timeout=5).status_code == 503, "not ready")
        upstream.gate("short").open()  # ends during the drain: complete
        for thread in threads:
            thread.join(60)
        gw.proc.wait(timeout=30)
        out, err = gw.stop()
    assert gw.proc.returncode == 130, err  # 128 + SIGINT, as a shell expects (issue 45)
    assert annotation(results["short"])["outcome"] == "complete"
    note = annotation(results["long"])
    assert (note["outcome"], note["reason"]) == ("incomplete", "gateway_shutdown")
    assert b"drained" in err
    lines = _assert_clean(out, err, requests=2)
    streams = sorted((line["outcome"], line["reason"]) for line in lines if line["stream"])
    assert streams == [("complete", "stop"), ("incomplete", "gateway_shutdown")]


def test_a_second_ctrl_c_stops_at_once_with_annotations() -> None:
    with (
        gated_upstream() as upstream,
        gateway_process(["--upstream", upstream.url + "/v1", "--drain-timeout", "600"]) as gw,
    ):
        results, threads = _streams(gw, upstream, ["first", "second"])
        gw.proc.send_signal(signal.SIGINT)
        gw.wait_stderr(b"draining: 2 request(s) in flight")
        gw.proc.send_signal(signal.SIGINT)  # the impatient operator: stop now
        for thread in threads:
            thread.join(60)
        gw.proc.wait(timeout=30)  # long before the 600 s drain
        out, err = gw.stop()
    assert gw.proc.returncode == 130, err  # 128 + SIGINT, as a shell expects (issue 45)
    for name in ("first", "second"):
        note = annotation(results[name])
        assert (note["outcome"], note["reason"]) == ("incomplete", "gateway_shutdown"), name
        assert b'"code":"gateway_shutdown"' in results[name]
    lines = _assert_clean(out, err, requests=2)
    assert {(line["outcome"], line["reason"]) for line in lines} == {
        ("incomplete", "gateway_shutdown")
    }


def test_ctrl_c_drains_every_worker() -> None:
    """A terminal's Ctrl-C reaches the supervisor and each worker (one process group);
    the supervisor then sends each worker a SIGTERM too: that is no second signal, so the
    workers drain, and a stream that ends during the drain ends complete."""
    import psutil

    with (
        gated_upstream() as upstream,
        gateway_process(
            ["--upstream", upstream.url + "/v1", "--workers", "2", "--drain-timeout", "600"],
            env={"GATEWAY_ACCESS_LOG": "false"},
        ) as gw,
    ):
        gw.wait_stderr(b"Application startup complete.", count=2)
        results, threads = _streams(gw, upstream, ["during"])
        children = psutil.Process(gw.proc.pid).children()  # the workers (and a helper)
        assert len(children) >= 2, children
        for process in [gw.proc, *children]:  # what the terminal does: the whole group
            process.send_signal(signal.SIGINT)
        gw.wait_stderr(b"draining: 1 request(s) in flight")
        gw.wait_stderr(b"draining: 0 request(s) in flight")
        gw.wait_stderr(b"Terminated child process")  # the supervisor's SIGTERM to the busy one
        assert not results  # still in flight: the drain waits for it
        upstream.gate("during").open()
        for thread in threads:
            thread.join(60)
        gw.proc.wait(timeout=60)
        _out, err = gw.stop()
    assert annotation(results["during"])["outcome"] == "complete"
    assert gw.proc.returncode == 130, err  # 128 + SIGINT, as a shell expects (issue 45)
    assert err.count(b"INFO gateway: drained") == 2, err
    assert b"Traceback" not in err, err
