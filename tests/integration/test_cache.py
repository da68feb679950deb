"""The response cache (issue 36) through a real gateway in front of a real simulator.

Every test counts what reached the simulator (its record store): a hit is an
answer that never went upstream. Bytes are compared as the client got them,
the gateway's trailer aside.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.simulator import create_simulator_app
from tests.conftest import ServerThread, running
from tests.integration.helpers import gateway_for

TRAILER = re.compile(rb"(?:data: \{\"error\".*\n\n)?: gateway [^\n]*\n\Z", re.S)
HIT_TRAILER = re.compile(
    rb": gateway outcome=complete reason=(?P<reason>[a-z_]+) cache=hit age=(?P<age>\d+) "
    rb"request_id=(?P<rid>[A-Za-z0-9._-]+)\n\Z"
)
CHAT = {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.fixture
def sim() -> Iterator[ServerThread]:
    with running(create_simulator_app()) as server:
        yield server


def upstream_count(sim: ServerThread) -> int:
    return len(sim.server.config.app.state.records)  # type: ignore[attr-defined]


def route(sim: ServerThread, **extra: Any) -> dict[str, Any]:
    return {"name": "r", "prefix": "/v1", "upstream": f"{sim.url}/v1", "cache": True, **extra}


def without_trailer(body: bytes) -> bytes:
    return TRAILER.sub(b"", body)


def post(gw: ServerThread, body: Any, path: str = "/v1/chat/completions", **kw: Any) -> httpx.Response:
    return httpx.post(f"{gw.url}{path}", json=body, timeout=30, **kw)


def test_a_whole_stream_is_replayed_byte_for_byte(sim: ServerThread) -> None:
    with gateway_for("", routes=[route(sim)]) as gw:
        miss = post(gw, CHAT)
        assert miss.headers["x-gateway-cache"] == "MISS"
        key = miss.headers["x-gateway-cache-key"]
        assert re.fullmatch("[0-9a-f]{64}", key)
        hit = post(gw, CHAT)
        assert hit.headers["x-gateway-cache"] == "HIT"
        assert int(hit.headers["age"]) >= 0
        assert upstream_count(sim) == 1
        assert without_trailer(hit.content) == without_trailer(miss.content)
        found = HIT_TRAILER.search(hit.content)
        assert found is not None and found["reason"] == b"stop"
        assert found["rid"].decode() == hit.headers["x-request-id"] != miss.headers["x-request-id"]


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("drop_before_done", "missing_done"),
        ("invalid_tool_arguments", "invalid_tool_arguments"),
        ("done_without_finish", "missing_finish"),
        ("length", "length"),
        ("error_event", "upstream_error"),
    ],
)
def test_an_answer_not_whole_is_refused(sim: ServerThread, fault: str, reason: str) -> None:
    with gateway_for("", routes=[route(sim)]) as gw:
        first = post(gw, CHAT, headers={"x-sim-fault": fault})
        assert first.headers["x-gateway-cache"] == "MISS"
        second = post(gw, CHAT)
        assert second.headers["x-gateway-cache"] == f"REFUSED; reason={reason}"
        third = post(gw, CHAT)
        assert third.headers["x-gateway-cache"] == "HIT"
        assert upstream_count(sim) == 2
        assert without_trailer(third.content) == without_trailer(second.content)
