"""The Responses API over WebSocket, through a real gateway in front of the simulator.

openai-python's ``client.responses.connect()`` (3.57) for what SDK users see, and
the ``websockets`` library's own client for the limits, frames and misbehaving
clients. Every response gets its verdict, one access-log line
(``transport: "websocket"``) and the stream metrics; the connection one more line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, ConnectionClosedError, InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as _ws_connect

from tests.conftest import ServerThread
from tests.integration.helpers import (
    access_log_lines,
    access_log_until,
    gateway_for,
    metric_value,
)
from tests.sdk import openai

pytestmark = pytest.mark.timeout(60)


def connect(url: str, **options: Any) -> ClientConnection:
    """The websockets client, with a handshake timeout for a loaded machine."""
    return _ws_connect(url, open_timeout=30, **options)


def _ws_url(server: ServerThread) -> str:
    return f"ws://127.0.0.1:{server.port}/v1/responses"


def _create(**fields: Any) -> str:
    return json.dumps({"type": "response.create", "model": "gpt-sim", "input": "hi", **fields})


def _until_terminal(ws: ClientConnection) -> list[dict[str, Any]]:
    """The events of one response, up to its terminal event (or the error)."""
    events: list[dict[str, Any]] = []
    while True:
        event = json.loads(ws.recv(timeout=20))
        events.append(event)
        if event["type"] in ("response.completed", "response.incomplete", "error"):
            return events


def _closed(ws: ClientConnection) -> ConnectionClosed:
    """Read until the gateway closes the connection; the close it sent."""
    try:
        while True:
            ws.recv(timeout=20)
    except ConnectionClosed as exc:
        return exc
    raise AssertionError("unreachable")


def _lines(capsys: pytest.CaptureFixture[str], connection_id: str) -> list[dict[str, Any]]:
    lines = access_log_until(capsys, connection_id)
    return [
        line
        for line in lines
        if line["request_id"] == connection_id
        or (line.get("websocket") or {}).get("connection_id") == connection_id
    ]


@pytest.fixture(scope="module")
def gateway_settings(simulator: ServerThread) -> dict[str, Any]:
    return {
        "upstream_url": simulator.url + "/v1",
        "access_log": True,
        # 3 s: the stall test's upstream is silent for an hour; a healthy stream on a loaded
        # machine must not meet this deadline (issue 45 item 9)
        "timeouts": {"idle": 3.0},
        "max_ws_message_bytes": 64 * 1024,
        "ws_max_client_messages_per_second": 20,
    }


# ----------------------------------------------------------------- openai-python connect()


def test_two_chained_responses_complete_on_one_connection(
    gateway: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-test", max_retries=0)
    texts: list[str] = []
    with client.responses.connect(extra_headers={"x-request-id": "ws-chained"}) as connection:
        previous = None
        for prompt in ("first", "second"):
            fields = {"previous_response_id": previous} if previous else {}
            connection.response.create(model="gpt-sim", input=prompt, **fields)
            parts = []
            for event in connection:
                if event.type == "response.output_text.delta":
                    parts.append(event.delta)
                if event.type in ("response.completed", "error"):
                    break
            assert event.type == "response.completed"
            previous = event.response.id
            texts.append("".join(parts))
    assert all(texts)
    lines = _lines(capsys, "ws-chained")
    responses = [line for line in lines if line["stream"]]
    assert [(r["outcome"], r["reason"]) for r in responses] == [("complete", "stop")] * 2
    assert all(r["transport"] == "websocket" and r["usage"]["output"] > 0 for r in responses)
    assert all(r["ttft_ms"] is not None for r in responses)
    end = next(line for line in lines if line["request_id"] == "ws-chained")
    assert end["websocket"]["responses"] == 2
    assert end["websocket"]["close"] == "client_closed"
    metrics = httpx.get(gateway.url + "/metrics").text
    assert metric_value(metrics, "gateway_streams_total", outcome="complete") >= 2
    assert metric_value(metrics, "gateway_websocket_connections_total", close="client_closed") >= 1


def _sdk_until_closed(gateway: ServerThread, headers: dict[str, str]) -> tuple[list[Any], Any]:
    """The events openai-python's connect() yields for one response, and what it raised."""
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-test", max_retries=0)
    seen: list[Any] = []
    try:
        with client.responses.connect(extra_headers=headers) as connection:
            connection.response.create(model="gpt-sim", input="hi")
            seen.extend(connection)
    except ConnectionClosedError as exc:
        return seen, exc
    raise AssertionError(f"connect() did not raise; it yielded {[e.type for e in seen]}")


def test_a_cut_response_yields_the_reason_then_raises_on_1011(
    gateway: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    headers = {"x-sim-fault": "drop_after_text", "x-request-id": "ws-cut"}
    seen, raised = _sdk_until_closed(gateway, headers)
    assert seen[-1].type == "error"
    assert seen[-1].error.code == "upstream_disconnect"
    assert raised.rcvd.code == 1011
    response = next(line for line in _lines(capsys, "ws-cut") if line["stream"])
    assert (response["outcome"], response["reason"]) == ("incomplete", "upstream_disconnect")


def test_a_stall_hits_the_idle_deadline(gateway: ServerThread) -> None:
    seen, raised = _sdk_until_closed(gateway, {"x-sim-fault": "stall_mid_stream"})
    assert seen[-1].type == "error"
    assert seen[-1].error.code == "idle_timeout"
    assert any(event.type == "response.output_text.delta" for event in seen)
    assert raised.rcvd.code == 1011


# ---------------------------------------------------------------------------- raw clients


def test_invalid_json_from_the_upstream_is_withheld_and_reported(gateway: ServerThread) -> None:
    with connect(_ws_url(gateway)) as ws:
        ws.send(_create(sim={"fault": "invalid_json"}))
        events = _until_terminal(ws)
        assert events[-1]["type"] == "error"
        assert events[-1]["error"]["code"] == "invalid_json"
        assert events[-1]["sequence_number"] == events[-2]["sequence_number"] + 1
        closed = _closed(ws)
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1011


def test_the_upstreams_own_failure_is_forwarded_and_the_connection_stays(
    gateway: ServerThread,
) -> None:
    with connect(_ws_url(gateway)) as ws:
        ws.send(_create(sim={"fault": "error_event"}))
        events = _until_terminal_or_failed(ws)
        assert events[-1]["type"] == "response.failed"
        ws.send(_create())
        assert _until_terminal(ws)[-1]["type"] == "response.completed"


def _until_terminal_or_failed(ws: ClientConnection) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while not events or events[-1]["type"] not in ("response.failed", "error"):
        events.append(json.loads(ws.recv(timeout=20)))
    return events


def test_an_upstream_close_code_mid_response_is_a_cut(gateway: ServerThread) -> None:
    with connect(_ws_url(gateway)) as ws:
        ws.send(_create(sim={"fault": "drop_after_text", "ws_close_code": 1000}))
        events = _until_terminal(ws)
        assert events[-1]["error"]["code"] == "missing_done"
        assert _closed(ws).rcvd.code == 1011  # type: ignore[union-attr]


def test_a_binary_message_is_refused_with_1003(gateway: ServerThread) -> None:
    with connect(_ws_url(gateway)) as ws:
        ws.send(b"\x00\x01")
        closed = _closed(ws)
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1003


def test_an_oversized_message_closes_with_1009(gateway: ServerThread) -> None:
    with connect(_ws_url(gateway), max_size=None) as ws:
        ws.send(_create(input="x" * (128 * 1024)))
        closed = _closed(ws)
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1009


def test_a_fragmented_message_is_joined_and_relayed(gateway: ServerThread) -> None:
    text = _create()
    with connect(_ws_url(gateway)) as ws:
        ws.send([text[:10], text[10:30], text[30:]])
        assert _until_terminal(ws)[-1]["type"] == "response.completed"


def test_too_many_messages_per_second_close_with_1008(gateway: ServerThread) -> None:
    with connect(_ws_url(gateway)) as ws:
        for _ in range(40):
            try:
                ws.send(json.dumps({"type": "session.ping"}))
            except ConnectionClosed:
                break
        closed = _closed(ws)
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1008


def test_a_ping_flood_closes_with_1008(gateway: ServerThread) -> None:
    with connect(_ws_url(gateway)) as ws:
        try:
            for i in range(200):
                ws.ping(str(i))
        except ConnectionClosed:
            pass
        closed = _closed(ws)
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1008


def test_a_second_create_while_one_is_in_flight_is_refused(gateway: ServerThread) -> None:
    with connect(_ws_url(gateway)) as ws:
        ws.send(_create(sim={"tps": 50, "tokens": 10}))
        ws.send(_create())
        events = _until_terminal(ws)
        refusals = [e for e in events if e["type"] == "error"]
        while not refusals or events[-1]["type"] != "response.completed":
            events += _until_terminal(ws)
            refusals = [e for e in events if e["type"] == "error"]
        assert refusals[0]["error"]["code"] == "response_in_progress"


def test_a_path_of_another_protocol_refuses_the_handshake(gateway: ServerThread) -> None:
    with pytest.raises(InvalidStatus) as raised:
        connect(f"ws://127.0.0.1:{gateway.port}/v1/chat/completions").close()
    assert raised.value.response.status_code == 403


# ----------------------------------------------------------------------- connection limits


def test_idle_and_max_duration_close_with_1000(simulator: ServerThread) -> None:
    with gateway_for(simulator.url + "/v1", ws_idle_seconds=0.3) as server:
        with connect(_ws_url(server)) as ws:
            ws.send(_create())
            assert _until_terminal(ws)[-1]["type"] == "response.completed"
            closed = _closed(ws)
        assert closed.rcvd is not None
        assert (closed.rcvd.code, closed.rcvd.reason) == (1000, "idle")
    with (
        gateway_for(simulator.url + "/v1", ws_max_connection_seconds=0.5) as server,
        connect(_ws_url(server)) as ws,
    ):
        ws.send(_create(sim={"fault": "stall_mid_stream"}))
        events = _until_terminal(ws)
        assert events[-1]["error"]["code"] == "total_timeout"
        assert _closed(ws).rcvd.code == 1011  # type: ignore[union-attr]


def test_a_client_key_is_checked_at_the_handshake(simulator: ServerThread) -> None:
    import hashlib

    digest = hashlib.sha256(b"sk-good").hexdigest()
    with gateway_for(simulator.url + "/v1", client_key_sha256=[digest]) as server:
        with pytest.raises(InvalidStatus) as raised:
            connect(_ws_url(server)).close()
        assert raised.value.response.status_code == 401
        headers = {"Authorization": "Bearer sk-good"}
        with connect(_ws_url(server), additional_headers=headers) as ws:
            ws.send(_create())
            assert _until_terminal(ws)[-1]["type"] == "response.completed"


def test_a_failed_connect_fails_over_before_the_handshake(
    simulator: ServerThread, capsys: pytest.CaptureFixture[str], dead_port: int
) -> None:
    dead = f"http://127.0.0.1:{dead_port}/v1"
    route = {
        "name": "pool",
        "prefix": "/v1",
        "upstreams": [
            {"name": "dead", "url": dead},
            {"name": "sim", "url": simulator.url + "/v1"},
        ],
    }
    with gateway_for("", routes=[route], access_log=True) as server:
        for n in range(2):  # whichever the pool picks first, each connection gets through
            headers = {"x-request-id": f"ws-failover-{n}"}
            with connect(_ws_url(server), additional_headers=headers) as ws:
                ws.send(_create())
                assert _until_terminal(ws)[-1]["type"] == "response.completed"
        end = next(
            line
            for line in _lines(capsys, "ws-failover-1")
            if line["request_id"] == "ws-failover-1"
        )
    assert end["upstream"] == "sim"


def test_a_busy_gateway_refuses_a_response_not_the_connection(simulator: ServerThread) -> None:
    limits = {"max_concurrent_streams": 1}
    with (
        gateway_for(simulator.url + "/v1", limits=limits) as server,
        connect(_ws_url(server)) as first,
        connect(_ws_url(server)) as second,
    ):
        first.send(_create(sim={"fault": "stall_mid_stream"}))
        json.loads(first.recv(timeout=20))  # in flight: it holds the one stream
        second.send(_create())
        refused = json.loads(second.recv(timeout=20))
        assert refused["type"] == "error"
        assert refused["error"]["code"] == "overloaded"


@contextlib.contextmanager
def _silent_upstream() -> Iterator[tuple[str, threading.Event]]:
    """A WebSocket upstream that starts a response and then says nothing; the event is
    set when the gateway closes its socket."""
    from websockets.sync.server import ServerConnection, serve

    closed = threading.Event()

    def handler(ws: ServerConnection) -> None:
        ws.recv()
        ws.send(json.dumps({"type": "response.created", "sequence_number": 0, "response": {}}))
        with contextlib.suppress(ConnectionClosed):
            ws.recv()
        closed.set()

    with serve(handler, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{server.socket.getsockname()[1]}/v1", closed
        server.shutdown()


def test_the_client_leaving_closes_the_upstream_at_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with _silent_upstream() as (url, upstream_closed), gateway_for(url, access_log=True) as gw:
        with connect(_ws_url(gw), additional_headers={"x-request-id": "ws-left"}) as ws:
            ws.send(_create())
            assert json.loads(ws.recv(timeout=20))["type"] == "response.created"
        # Idle and first-byte deadlines are minutes away: only the client's leaving
        # can close the upstream socket now.
        assert upstream_closed.wait(10)
        lines = _lines(capsys, "ws-left")
    end = next(line for line in lines if line["request_id"] == "ws-left")
    response = next(line for line in lines if line["stream"])
    assert response["reason"] == "client_disconnect"
    assert end["websocket"]["close"] == "client_closed"


def test_a_client_that_never_reads_is_cut_as_stalled(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.simulator import create_simulator_app
    from tests.conftest import running

    settings = {"access_log": True, "timeouts": {"client_send": 0.5}}
    # Its own simulator: the long unpaced answer keeps it busy until the cut.
    with (
        running(create_simulator_app()) as simulator,
        gateway_for(simulator.url + "/v1", **settings) as server,
    ):
        headers = {"x-request-id": "ws-stalled"}
        # max_queue=1: the client's library stops reading its socket after one message.
        with connect(_ws_url(server), additional_headers=headers, max_queue=1) as ws:
            ws.send(_create(sim={"tokens": 2_000_000}))
            lines = _lines_when(capsys, "ws-stalled")
    response = next(line for line in lines if line["stream"])
    assert response["reason"] == "client_stalled"
    end = next(line for line in lines if line["request_id"] == "ws-stalled")
    assert end["websocket"]["close"] == "client_stalled"


def _lines_when(capsys: pytest.CaptureFixture[str], connection_id: str) -> list[dict[str, Any]]:
    """The connection's access-log lines, waiting up to 40 s for its own (the last)."""
    seen = ""
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        seen += capsys.readouterr().out
        lines = [
            line
            for line in access_log_lines(seen)
            if line["request_id"] == connection_id
            or (line.get("websocket") or {}).get("connection_id") == connection_id
        ]
        if any(line["request_id"] == connection_id for line in lines):
            return lines
        time.sleep(0.05)
    raise AssertionError(f"no access-log line for {connection_id}")


def test_a_client_that_stops_reading_is_stalled_and_never_blamed_on_the_upstream(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The upstream's idle deadline (1 s) is shorter than the send timeout (3 s): while
    the gateway waits on the client it does not read the upstream, so the upstream's
    silence is the client's doing. Over HTTP the same is client_stalled; and a stall
    is not an upstream failure (eject_after = 1 would eject it at once)."""
    from gateway.simulator import create_simulator_app
    from tests.conftest import running

    with running(create_simulator_app()) as simulator:
        upstream = {"url": simulator.url + "/v1", "weight": 1}
        routes = [
            {
                "name": "ws",
                "prefix": "/v1",
                "eject_after": 1,
                "eject_base_seconds": 600,
                "eject_max_seconds": 600,
                "upstreams": [{"name": "a", **upstream}, {"name": "b", **upstream}],
            }
        ]
        settings = {"timeouts": {"idle": 1.0, "client_send": 3.0}, "access_log": True}
        with gateway_for("", routes=routes, **settings) as server:
            headers = {"x-request-id": "ws-unread"}
            options = {"max_queue": 1, "close_timeout": 1}  # it reads nothing: no close reply
            with connect(_ws_url(server), additional_headers=headers, **options) as ws:
                ws.send(_create(sim={"tokens": 2_000_000}))
                lines = _lines_when(capsys, "ws-unread")
            response = next(line for line in lines if line["stream"])
            assert (response["outcome"], response["reason"]) == ("incomplete", "client_stalled")
            end = next(line for line in lines if line["request_id"] == "ws-unread")
            assert end["websocket"]["close"] == "client_stalled"
            metrics = httpx.get(server.url + "/metrics").text
    assert metric_value(metrics, "gateway_upstream_ejected") == 0
    assert metric_value(metrics, "gateway_websocket_connections_total", close="client_stalled") == 1


def test_the_drain_cuts_a_response_with_gateway_shutdown_then_1001() -> None:
    """SIGTERM: an idle connection closes with 1001 at once; a response in flight gets
    the gateway_shutdown error at the drain timeout, then 1001; the process exits 0."""
    import signal

    from tests.conftest import gateway_process

    env = {"GATEWAY_DRAIN_TIMEOUT": "1"}
    with gateway_process(["--simulator"], env) as gw:
        url = f"ws://127.0.0.1:{gw.port}/v1/responses"
        with connect(url) as busy, connect(url) as idle:
            busy.send(_create(sim={"fault": "stall_mid_stream"}))
            json.loads(busy.recv(timeout=20))  # in flight
            idle.send(_create())
            assert _until_terminal(idle)[-1]["type"] == "response.completed"
            gw.proc.send_signal(signal.SIGTERM)
            closed = _closed(idle)
            assert closed.rcvd is not None
            assert closed.rcvd.code == 1001
            events = _until_terminal(busy)
            assert events[-1]["type"] == "error"
            assert events[-1]["error"]["code"] == "gateway_shutdown"
            closed = _closed(busy)
            assert closed.rcvd is not None
            assert closed.rcvd.code == 1001
        gw.proc.wait(timeout=30)
        assert gw.proc.returncode == 0


def test_a_quiet_client_is_pinged_and_closed_when_it_does_not_answer(
    simulator: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = {"access_log": True, "ws_ping_interval_seconds": 1.0}
    with gateway_for(simulator.url + "/v1", **settings) as server:
        # A client that answers: it outlives several ping intervals.
        with connect(_ws_url(server), additional_headers={"x-request-id": "ws-pinged"}) as ws:
            ws.send(_create(sim={"tps": 5, "tokens": 15}))  # 3 s: three intervals
            assert _until_terminal(ws)[-1]["type"] == "response.completed"
        # One that stops reading (its library pauses at max_queue, pongs included).
        headers = {"x-request-id": "ws-unanswered"}
        with connect(_ws_url(server), additional_headers=headers, max_queue=1) as ws:
            ws.send(_create(sim={"tokens": 50}))
            lines = _lines_when(capsys, "ws-unanswered")
    end = next(line for line in lines if line["request_id"] == "ws-unanswered")
    assert end["websocket"]["close"] == "ping_timeout"


def test_the_upstreams_pings_are_answered() -> None:
    from websockets.sync.server import ServerConnection, serve

    answered = threading.Event()

    def handler(ws: ServerConnection) -> None:
        ws.recv()
        if ws.ping().wait(10):
            answered.set()
        completed = {"id": "r", "output": [], "usage": None}
        ws.send(json.dumps({"type": "response.completed", "response": completed}))
        with contextlib.suppress(ConnectionClosed):
            ws.recv()

    with serve(handler, "127.0.0.1", 0) as upstream:
        threading.Thread(target=upstream.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{upstream.socket.getsockname()[1]}/v1"
        with gateway_for(url) as server, connect(_ws_url(server)) as ws:
            ws.send(_create())
            assert _until_terminal(ws)[-1]["type"] == "response.completed"
        upstream.shutdown()
    assert answered.is_set()


def test_lanes_are_judged_apart(gateway: ServerThread) -> None:
    """Two responses in flight at once on two lanes (``stream_id``): each its own verdict;
    a cut on one lane names that lane in its error."""
    with connect(_ws_url(gateway)) as ws:
        ws.send(_create(stream_id="a", sim={"tokens": 5}))
        ws.send(_create(stream_id="b", sim={"tokens": 5}))
        done: dict[str, str] = {}
        while len(done) < 2:
            event = json.loads(ws.recv(timeout=20))
            if event["type"] in ("response.completed", "error"):
                done[event["stream_id"]] = event["type"]
        assert done == {"a": "response.completed", "b": "response.completed"}
        ws.send(_create(stream_id="c", sim={"fault": "invalid_json"}))
        events = _until_terminal(ws)
        assert events[-1]["type"] == "error"
        assert events[-1]["stream_id"] == "c"
        assert events[-1]["error"]["code"] == "invalid_json"


@contextlib.contextmanager
def _recording_upstream() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A WebSocket upstream that records each handshake's headers and then waits."""
    from websockets.sync.server import ServerConnection, serve

    seen: list[dict[str, str]] = []

    def handler(ws: ServerConnection) -> None:
        assert ws.request is not None
        seen.append({k.lower(): v for k, v in ws.request.headers.raw_items()})
        with contextlib.suppress(ConnectionClosed):
            ws.recv()

    with serve(handler, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{server.socket.getsockname()[1]}/v1", seen
        server.shutdown()


def test_a_gateway_key_never_reaches_the_upstream_socket() -> None:
    import hashlib

    key = "sk-gateway-team-a"
    clients = [{"name": "team-a", "key_sha256": [hashlib.sha256(key.encode()).hexdigest()]}]
    with (
        _recording_upstream() as (url, seen),
        gateway_for(url, clients=clients) as server,
        connect(_ws_url(server), additional_headers={"Authorization": f"Bearer {key}"}),
    ):
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            time.sleep(0.02)
    assert len(seen) == 1
    assert key not in " ".join(seen[0].values())
    assert "authorization" not in seen[0]


def test_a_client_with_limits_is_refused_the_upgrade_and_told_to_use_http(
    simulator: ServerThread,
) -> None:
    import hashlib

    key = "sk-limited"
    clients = [
        {
            "name": "team-b",
            "key_sha256": [hashlib.sha256(key.encode()).hexdigest()],
            "limits": {"requests_per_minute": 10},
        }
    ]
    with gateway_for(simulator.url + "/v1", clients=clients) as server:
        with pytest.raises(InvalidStatus) as raised:
            connect(_ws_url(server), additional_headers={"Authorization": f"Bearer {key}"})
        assert raised.value.response.status_code == 403
        assert b"limited_client_websocket" in (raised.value.response.body or b"")
        # the same client streams over HTTP, within its limits
        response = httpx.post(
            f"{server.url}/v1/responses",
            json={"model": "gpt-sim", "input": "hi", "stream": True},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert response.status_code == 200
        assert b"outcome=complete" in response.content
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        assert (
            metric_value(text, "gateway_rejected_requests_total", reason="limited_client_websocket")
            == 1
        )


def test_a_named_clients_responses_over_a_websocket_are_charged_to_it(
    simulator: ServerThread,
) -> None:
    # A named client without limits may use a WebSocket; what its responses cost
    # counts in its tokens as over HTTP.
    import hashlib

    key = "sk-metered"
    clients = [{"name": "team-w", "key_sha256": [hashlib.sha256(key.encode()).hexdigest()]}]
    prices = [{"model": "*", "input": "1", "output": "2"}]  # USD a million tokens
    with gateway_for(simulator.url + "/v1", clients=clients, prices=prices) as server:
        with connect(_ws_url(server), additional_headers={"Authorization": f"Bearer {key}"}) as ws:
            ws.send(_create())
            events = _until_terminal(ws)
        usage = events[-1]["response"]["usage"]
        assert events[-1]["type"] == "response.completed"
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        tokens = {
            kind: metric_value(
                text, "gateway_client_tokens_total", client="team-w", type=kind, source="reported"
            )
            for kind in ("input", "output")
        }
        assert tokens == {"input": usage["input_tokens"], "output": usage["output_tokens"]}
        # and its money, priced as over HTTP
        spent = metric_value(text, "gateway_spend_usd_total", client="team-w", evidence="reported")
        expected = (usage["input_tokens"] * 1 + usage["output_tokens"] * 2) / 1e6
        assert abs(spent - expected) < 1e-12


def _receipt(server: ServerThread, key: str, request_id: str, poll: bool = True) -> httpx.Response:
    """A receipt, polled (it is written by a task of its own once the response ends)."""
    url = f"{server.url}/v1/gateway/receipts/{request_id}"
    deadline = time.monotonic() + (20 if poll else 0)
    while True:
        found = httpx.get(url, headers={"authorization": f"Bearer {key}"}, timeout=10)
        if found.status_code != 404 or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_every_response_on_a_websocket_gets_its_owners_receipt(
    simulator: ServerThread, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two responses, then a cut one, on one connection: each has a receipt under its
    request id and under its ``resp_`` id, priced as the metric counted it, its owner's
    only; the handshake has its own, and a refused handshake too."""
    import hashlib

    keys = {"ws-a": "sk-ws-receipts-a", "ws-b": "sk-ws-receipts-b", "ws-l": "sk-ws-receipts-l"}
    clients: list[dict[str, Any]] = [
        {"name": name, "key_sha256": [hashlib.sha256(key.encode()).hexdigest()]}
        for name, key in keys.items()
    ]
    clients[2]["limits"] = {"requests_per_minute": 10}
    prices = [{"model": "*", "input": "1", "output": "2"}]  # USD a million tokens
    mine = {"authorization": f"Bearer {keys['ws-a']}", "x-request-id": "ws-receipts"}
    with gateway_for(
        simulator.url + "/v1", clients=clients, prices=prices, access_log=True
    ) as server:
        with connect(_ws_url(server), additional_headers=mine) as ws:
            answers = []
            for seed in (1, 2):  # the simulator's response id is its seed's
                ws.send(_create(sim={"seed": seed}))
                answers.append(_until_terminal(ws))
            # a second create while one is in flight: refused, with a receipt of its own
            ws.send(_create(sim={"seed": 3, "tps": 50, "tokens": 10}))
            ws.send(_create())
            events = _until_terminal(ws)
            while events[-1]["type"] != "response.completed":
                events += _until_terminal(ws)
            (refusal,) = [e for e in events if e["type"] == "error"]
            answers.append([e for e in events if e["type"] != "error"])
            ws.send(_create(sim={"fault": "drop_after_text"}))
            cut = _until_terminal(ws)
            _closed(ws)
        assert [a[-1]["type"] for a in answers] == ["response.completed"] * 3
        assert cut[-1]["type"] == "error"
        responses = [line for line in _lines(capsys, "ws-receipts") if line["stream"]]
        assert len(responses) == 4
        assert refusal["error"]["code"] == "response_in_progress"
        refused_create = refusal["error"]["message"].rpartition("request_id=")[2].rstrip(")")
        found = _receipt(server, keys["ws-a"], refused_create)
        assert found.status_code == 200, found.text
        assert (found.json()["status"], found.json()["rejected"]) == (409, "response_in_progress")
        assert found.json()["cost"]["nanos"] == 0
        assert _receipt(server, keys["ws-b"], refused_create, poll=False).status_code == 404
        by_request = {}
        for line in responses:
            found = _receipt(server, keys["ws-a"], line["request_id"])
            assert found.status_code == 200, found.text
            by_request[line["request_id"]] = found.json()
            # another client's key: the same 404 as an unknown id
            denied = _receipt(server, keys["ws-b"], line["request_id"], poll=False)
            unknown = _receipt(server, keys["ws-b"], "no-such-response", poll=False)
            assert denied.status_code == unknown.status_code == 404
            assert denied.json()["error"]["code"] == unknown.json()["error"]["code"]
        receipts = list(by_request.values())
        assert all(r["transport"] == "websocket" and r["client"] == "ws-a" for r in receipts)
        assert all(r["websocket"]["connection_id"] == "ws-receipts" for r in receipts)
        # a whole response: its reported usage at the override's prices
        for events in answers:
            response_id = events[-1]["response"]["id"]
            usage = events[-1]["response"]["usage"]
            found = _receipt(server, keys["ws-a"], response_id)
            assert found.status_code == 200, found.text
            receipt = found.json()
            assert receipt["websocket"]["response_id"] == response_id
            assert receipt["verdict"] == {"outcome": "complete", "reason": "stop"}
            assert receipt["cost"]["evidence"] == "reported"
            expected = usage["input_tokens"] * 1000 + usage["output_tokens"] * 2000
            assert receipt["cost"]["nanos"] == expected
            assert _receipt(server, keys["ws-b"], response_id, poll=False).status_code == 404
        # the cut one: its estimate, labelled, never $0
        cut_receipt = next(r for r in receipts if r["verdict"]["outcome"] == "incomplete")
        assert cut_receipt["verdict"]["reason"] == "upstream_disconnect"
        assert cut_receipt["cost"]["evidence"] == "estimated"
        assert cut_receipt["cost"]["nanos"] > 0
        # the sum of the receipts is what the metric counted
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        spent = metric_value(text, "gateway_spend_usd_total", client="ws-a")
        assert round(spent * 10**9) == sum(r["cost"]["nanos"] for r in receipts)
        # the handshake's own: the connection's end, costing nothing itself
        connection = _receipt(server, keys["ws-a"], "ws-receipts")
        assert connection.status_code == 200, connection.text
        assert connection.json()["websocket"]["responses"] == 4
        assert connection.json()["cost"]["nanos"] == 0
        # a refused handshake has one too, under the X-Request-ID it was answered with
        with pytest.raises(InvalidStatus) as raised:
            connect(
                _ws_url(server),
                additional_headers={"authorization": f"Bearer {keys['ws-l']}"},
            )
        refused_id = raised.value.response.headers["x-request-id"]
        refused = _receipt(server, keys["ws-l"], refused_id)
        assert refused.status_code == 200, refused.text
        assert refused.json()["rejected"] == "limited_client_websocket"
        assert refused.json()["status"] == 403
        # the report counts the responses and the refused create, not the connection
        report = httpx.get(
            f"{server.url}/v1/gateway/spend",
            headers={"authorization": f"Bearer {keys['ws-a']}"},
            timeout=10,
        ).json()
        assert report["total"]["requests"] == 5
        assert report["total"]["nanos"] == sum(r["cost"]["nanos"] for r in receipts)


@contextlib.contextmanager
def _scripted_upstream(
    handler: Any,
) -> Iterator[str]:
    """A WebSocket upstream that runs ``handler(ws)`` on each connection; its base URL."""
    from websockets.sync.server import serve

    def run(ws: Any) -> None:
        with contextlib.suppress(ConnectionClosed):
            handler(ws)
            ws.recv()  # until the gateway closes

    with serve(run, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.socket.getsockname()[1]}/v1"
        server.shutdown()


_COMPLETED = json.dumps(
    {
        "type": "response.completed",
        "sequence_number": 1,
        "response": {"id": "r1", "status": "completed", "output": [], "usage": None},
    }
)
_DELTA = json.dumps(
    {
        "type": "response.output_text.delta",
        "sequence_number": 2,
        "item_id": "m",
        "output_index": 0,
        "content_index": 0,
        "delta": "injected",
    }
)


def _answer_then_inject(ws: Any) -> None:
    """One honest response, then an extra delta and a forged completion after its end."""
    ws.recv()
    ws.send(json.dumps({"type": "response.created", "sequence_number": 0, "response": {}}))
    ws.send(_COMPLETED)
    ws.send(_DELTA)
    ws.send(_COMPLETED.replace('"r1"', '"forged"'))


def _speak_first(ws: Any) -> None:
    """A message before the client created any response."""
    ws.send(_COMPLETED.replace('"r1"', '"forged"'))


def _received_until_closed(ws: ClientConnection) -> tuple[list[dict[str, Any]], ConnectionClosed]:
    received: list[dict[str, Any]] = []
    try:
        while True:
            received.append(json.loads(ws.recv(timeout=20)))
    except ConnectionClosed as exc:
        return received, exc


@pytest.mark.parametrize("handler", [_answer_then_inject, _speak_first])
def test_an_upstream_message_outside_a_response_is_withheld_and_ends_the_connection(
    handler: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """As after [DONE] over HTTP: what follows a response's end (or precedes its
    creation) is never relayed; the SDK would take it for its next response."""
    with _scripted_upstream(handler) as url, gateway_for(url, access_log=True) as server:
        headers = {"x-request-id": "ws-outside"}
        with connect(_ws_url(server), additional_headers=headers) as ws:
            if handler is _answer_then_inject:
                ws.send(_create())
            received, closed = _received_until_closed(ws)
        lines = _lines_when(capsys, "ws-outside")
        metrics = httpx.get(server.url + "/metrics").text
    types = [event["type"] for event in received]
    expected = ["response.created", "response.completed"] if handler is _answer_then_inject else []
    assert types == expected
    assert all(event.get("response", {}).get("id") != "forged" for event in received)
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1011
    end = next(line for line in lines if line["request_id"] == "ws-outside")
    assert end["websocket"]["close"] == "invalid_shape"
    assert [(r["outcome"], r["reason"]) for r in lines if r["stream"]] == [
        ("complete", "stop")
    ] * len([t for t in types if t == "response.completed"])
    assert metric_value(metrics, "gateway_websocket_connections_total", close="invalid_shape") == 1


def test_the_upstreams_error_answer_outside_a_response_is_relayed(gateway: ServerThread) -> None:
    """A client message that starts no response gets the upstream's own error back, and
    the connection goes on."""
    with connect(_ws_url(gateway)) as ws:
        ws.send(json.dumps({"type": "session.ping"}))
        answer = json.loads(ws.recv(timeout=20))
        assert answer["type"] == "error"
        ws.send(_create())
        assert _until_terminal(ws)[-1]["type"] == "response.completed"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_an_invalid_utf8_text_message_closes_with_1007_and_one_log_line(
    gateway: ServerThread,
) -> None:
    records = _Records()
    loggers = [logging.getLogger(name) for name in ("gateway", "uvicorn.error")]
    for logger in loggers:
        logger.addHandler(records)
    try:
        with connect(_ws_url(gateway)) as ws:
            ws.send(b"\xff\xfe not utf-8", text=True)
            closed = _closed(ws)
    finally:
        for logger in loggers:
            logger.removeHandler(records)
    assert closed.rcvd is not None
    assert closed.rcvd.code == 1007
    about = [r for r in records.records if "UTF-8" in r.getMessage()]
    assert len(about) == 1
    assert all(r.exc_info is None for r in records.records)


def test_a_ping_flood_in_one_write_is_closed_before_its_pongs() -> None:
    """200 pings in one TCP write: the limit (20 a second) is counted before any is
    answered, so the client gets the 1008 close and at most the limit's pongs."""
    import socket

    from websockets.client import ClientProtocol
    from websockets.frames import Opcode
    from websockets.uri import parse_uri

    from gateway.simulator import create_simulator_app
    from tests.conftest import running

    limit = 20
    with (
        running(create_simulator_app()) as simulator,
        gateway_for(simulator.url + "/v1", ws_max_client_messages_per_second=limit) as server,
    ):
        protocol = ClientProtocol(parse_uri(_ws_url(server)))
        protocol.send_request(protocol.connect())
        with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
            sock.sendall(b"".join(protocol.data_to_send()))
            while not protocol.handshake_exc and protocol.state.name == "CONNECTING":
                protocol.receive_data(sock.recv(65536))
            assert protocol.handshake_exc is None
            protocol.events_received()
            for i in range(200):
                protocol.send_ping(str(i).encode())
            sock.sendall(b"".join(protocol.data_to_send()))  # one write
            pongs, close = 0, None
            while close is None:
                data = sock.recv(65536)
                if not data:
                    break
                protocol.receive_data(data)
                for event in protocol.events_received():
                    if event.opcode is Opcode.PONG:
                        pongs += 1
                    elif event.opcode is Opcode.CLOSE:
                        close = protocol.close_rcvd
    assert close is not None
    assert close.code == 1008
    assert pongs <= limit
