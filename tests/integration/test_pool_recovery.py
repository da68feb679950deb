"""The failover demo's trap: traffic before the healthy upstream listens ejects it.

An ejected upstream that panic routing sends a request to, and that answers
it, is back in the pool at once (it was staying marked ejected, and the
failing one's 503s went to clients unretried, for the whole ejection).
"""

from __future__ import annotations

import contextlib

from gateway.simulator import create_simulator_app
from tests import web
from tests.conftest import ServerThread, held_port, running
from tests.integration.control import wait_until
from tests.integration.helpers import gateway_for, metric_value

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}


def test_an_upstream_ejected_before_it_listened_is_back_once_it_answers() -> None:
    held = contextlib.ExitStack()
    healthy_port = held.enter_context(held_port())  # nothing listens there yet
    routes = [
        {
            "name": "chat",
            "prefix": "/v1",
            "max_attempts": 2,
            "eject_after": 2,
            "eject_base_seconds": 600,  # far longer than this test: only an answer returns it
            "eject_max_seconds": 600,
            "upstreams": [
                {"name": "failing", "url": "", "weight": 1},
                {"name": "healthy", "url": f"http://127.0.0.1:{healthy_port}/v1", "weight": 50},
            ],
        }
    ]
    failing_app = create_simulator_app(default_fault="status", default_status=503)
    with held, running(failing_app) as failing:
        routes[0]["upstreams"][0]["url"] = failing.url + "/v1"  # type: ignore[index]
        with gateway_for("", routes=routes) as gw:

            def ejected(name: str) -> float:
                metrics = web.get(gw.url + "/metrics").text
                return metric_value(metrics, "gateway_upstream_ejected", upstream=name)

            def healthy_out() -> bool:
                web.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)
                return ejected("healthy") == 1

            wait_until(healthy_out, "the not-yet-listening upstream ejected")
            assert ejected("failing") == 0  # the cap (half the pool) keeps it in
            held.close()  # the port is let go only now, for the healthy upstream to bind
            healthy = ServerThread(create_simulator_app(), port=healthy_port)
            healthy.port = healthy_port
            healthy.start()
            try:

                def served_and_back() -> bool:
                    response = web.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)
                    return response.status_code == 200 and ejected("healthy") == 0

                wait_until(served_and_back, "the healthy upstream back once it answered")
                # and from now on the failing one's 503s are retried on it
                for _ in range(5):
                    response = web.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=30)
                    assert response.status_code == 200
                    assert response.headers["x-gateway-upstream"] == "healthy"
            finally:
                healthy.stop()
