"""A finished request leaves nothing for the garbage collector: its objects are freed as it
ends, by reference counting.

Resume, the cache, a named client's limits and its receipt each hang hooks on a request
(send wrappers, a detach hook, readers of its events, a log's cancel hook) that refer back
to it. Left in place, every request's objects (its exchange, record, guard, decoder, log
recorder, task) formed reference cycles that only the cyclic collector frees, and the
collector walked them beside everything the stores keep: a fifth of the gateway's CPU with
these features on (docs/performance.md). A real gateway, in this process, with the
collector off: once the requests are done no exchange, record, log or recorder of theirs
may still exist.
"""

from __future__ import annotations

import gc
import hashlib
import json
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from gateway.observe.record import RequestRecord
from gateway.proxy.detach import Detachment
from gateway.proxy.exchange import Exchange
from gateway.resume.recorder import StreamLog
from gateway.streamlog.recorder import Recorder
from tests.conftest import ServerThread
from tests.integration.helpers import gateway_for, wait_until

KEY = "sk-garbage-team-0123"
#: What a request's hooks used to keep alive in cycles.
KINDS = (Exchange, RequestRecord, StreamLog, Recorder, Detachment)


def _alive() -> list[str]:
    return sorted(type(o).__name__ for o in gc.get_objects() if type(o) in KINDS)


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def test_a_finished_request_leaves_no_reference_cycle(
    simulator: ServerThread, collector_off: None
) -> None:
    route = {
        "name": "chat",
        "prefix": "/v1",
        "upstream": simulator.url + "/v1",
        "resume": True,
        "cache": True,
    }
    clients = [
        {
            "name": "team",
            "key_sha256": [hashlib.sha256(KEY.encode()).hexdigest()],
            "limits": {"tokens_per_minute": 10**9},
        }
    ]
    headers = {"authorization": f"Bearer {KEY}", "x-sim-tokens": "5"}
    with (
        gateway_for(simulator.url + "/v1", routes=[route], clients=clients) as gw,
        httpx.Client(base_url=gw.url, headers=headers, timeout=30) as http,
    ):
        answers = []
        for index in range(4):
            body = {
                "model": "gpt-4o",
                "messages": [{"role": "user", "content": f"question {index % 3}"}],
                "stream": index != 1,  # one plain answer
            }
            answers.append(http.post("/v1/chat/completions", json=body))
        cut = {"model": "gpt-4o", "messages": [{"role": "user", "content": "cut"}], "stream": True}
        answers.append(
            http.post("/v1/chat/completions", json=cut, headers={"x-sim-fault": "drop_after_text"})
        )
        assert [a.status_code for a in answers] == [200] * 5
        assert answers[3].headers["x-gateway-cache"] == "HIT"  # question 0 again
        assert "x-gateway-stream-id" in answers[4].headers  # a resumable stream
        receipt = http.get("/v1/gateway/receipts/" + answers[0].headers["x-request-id"])
        assert json.loads(receipt.content)["client"] == "team"
        # Each request's last step (its hooks let go) may follow the client's last byte.
        try:
            wait_until(lambda: not _alive(), "every request's objects freed", seconds=10)
        except AssertionError:
            raise AssertionError(f"left for the collector: {Counter(_alive())}") from None
