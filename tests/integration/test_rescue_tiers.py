"""Priority tiers and the retry policy end to end: real gateways in front of simulators
that fail for a while, once, or for good, then recover.

The outage is shortened (``fault_seconds``) from the minute a real provider may be
down to a few seconds of the same shape; ``tests/perf/outage_tiers.py`` runs the
literal timings (a 60 s outage, 20 requests 4 s apart).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from gateway.simulator import create_simulator_app
from tests import web
from tests.conftest import ServerThread, running
from tests.integration.helpers import gateway_for, metric_value
from tests.integration.test_failover import (
    ATTEMPTS,
    CHAT,
    assert_complete_from,
    metrics,
    stream,
    up,
)
from tests.sdk import openai


def tiers(*upstreams: dict[str, Any], **route: Any) -> list[dict[str, Any]]:
    return [{"name": "chat", "prefix": "/v1", "upstreams": list(upstreams), **route}]


def sim_starts(server: ServerThread) -> list[float]:
    """When the simulator got each request (monotonic, in order)."""
    return list(server.server.config.app.state.arrivals)


@contextlib.contextmanager
def simulator(**options: Any) -> Iterator[ServerThread]:
    with running(create_simulator_app(**options)) as server:
        yield server


def attempts(gw: ServerThread, upstream: str, result: str | None = None) -> float:
    labels = {"upstream": upstream} | ({"result": result} if result else {})
    return metric_value(metrics(gw), ATTEMPTS, **labels)


def test_a_pool_with_tiers_sends_nothing_to_the_fallback_while_the_primary_serves() -> None:
    with simulator() as primary, simulator() as fallback:
        routes = tiers(
            up("primary", primary.url + "/v1"), up("fallback", fallback.url + "/v1", priority=1)
        )
        with gateway_for("", routes=routes) as gw:
            for i in range(10):
                assert_complete_from(stream(gw, f"tier-{i}"), "primary")
            assert attempts(gw, "fallback") == 0


def test_a_500_once_is_retried_on_the_same_upstream() -> None:
    with (
        simulator(default_fault="status", default_status=500, fault_requests=1) as primary,
        simulator() as fallback,
    ):
        routes = tiers(
            up("primary", primary.url + "/v1"),
            up("fallback", fallback.url + "/v1", priority=1),
            max_attempts=3,
        )
        with gateway_for("", routes=routes) as gw:
            assert_complete_from(stream(gw, "once"), "primary")
            assert attempts(gw, "primary", "status_5xx") == 1
            assert attempts(gw, "primary", "ok") == 1
            assert attempts(gw, "fallback") == 0


def test_a_short_retry_after_on_the_only_primary_is_waited_out_on_it() -> None:
    with (
        simulator(
            default_fault="status", default_status=429, fault_requests=1, retry_after="2"
        ) as primary,
        simulator() as fallback,
    ):
        routes = tiers(
            up("primary", primary.url + "/v1"),
            up("fallback", fallback.url + "/v1", priority=1),
            max_attempts=3,
        )
        with gateway_for("", routes=routes) as gw:
            assert_complete_from(stream(gw, "wait"), "primary")
            first, second = sim_starts(primary)
            assert second - first >= 1.8
            assert second - first < 10  # bounded, not a timing claim: 2 s asked
            assert attempts(gw, "fallback") == 0


def test_a_long_retry_after_sends_the_retry_to_the_next_tier_at_once() -> None:
    with (
        simulator(default_fault="status", default_status=503, retry_after="60") as primary,
        simulator() as fallback,
    ):
        routes = tiers(
            up("primary", primary.url + "/v1"),
            up("fallback", fallback.url + "/v1", priority=1),
            max_attempts=3,
        )
        with gateway_for("", routes=routes) as gw:
            assert_complete_from(stream(gw, "long"), "fallback")
            # cooling down: the next requests go straight to the fallback tier
            for i in range(3):
                assert_complete_from(stream(gw, f"long-{i}"), "fallback")
            assert len(sim_starts(primary)) == 1


def test_a_persistent_429_without_retry_after_gets_at_most_4_attempts_in_3_s() -> None:
    with (
        simulator(default_fault="status", default_status=429, retry_after=None) as primary,
        simulator() as fallback,
    ):
        routes = tiers(
            up("primary", primary.url + "/v1"),
            up("fallback", fallback.url + "/v1", priority=1),
            max_attempts=3,
        )
        with gateway_for("", routes=routes) as gw:
            end = time.monotonic() + 3.5
            i = 0
            while time.monotonic() < end:
                assert_complete_from(stream(gw, f"limited-{i}"), "fallback")
                i += 1
            starts = sim_starts(primary)
            assert len(starts) >= 2  # it was tried, and once more after the backoff
            worst = max(sum(1 for t in starts if s <= t < s + 3.0) for s in starts)
            assert worst <= 4, starts


def test_context_length_goes_once_to_the_primary_tier_then_to_the_larger_one() -> None:
    with (
        simulator(default_fault="status", default_status=400, context_length=True) as small_a,
        simulator(default_fault="status", default_status=400, context_length=True) as small_b,
        simulator() as large,
    ):
        routes = tiers(
            up("small-a", small_a.url + "/v1"),
            up("small-b", small_b.url + "/v1"),
            up("large", large.url + "/v1", priority=1, models={"*": "sim-large"}),
            max_attempts=4,
            retry_on=["connect", "429", "5xx", "early_eof", "context_length"],
        )
        with gateway_for("", routes=routes) as gw:
            response = stream(gw, "long-prompt")
            assert_complete_from(response, "large")
            assert attempts(gw, "small-a") + attempts(gw, "small-b") == 1
            assert (
                attempts(gw, "small-a", "context_length")
                + attempts(gw, "small-b", "context_length")
                == 1
            )
            seen = web.get(f"{large.url}/_sim/requests/long-prompt").json()
            assert seen["body"]["model"] == "sim-large"  # the "*" entry of its model map
        # Without the opt-in, the 400 travels back unchanged and nothing else is tried.
        routes = tiers(
            up("small-a", small_a.url + "/v1"),
            up("large", large.url + "/v1", priority=1),
            max_attempts=4,
        )
        with gateway_for("", routes=routes) as gw:
            response = stream(gw, "long-prompt-2")
            assert response.status_code == 400
            assert response.json()["error"]["code"] == "context_length_exceeded"
            assert attempts(gw, "large") == 0


def test_a_silent_primary_with_a_short_first_byte_deadline_fails_over_in_time() -> None:
    with simulator(default_fault="stall_before_headers") as primary, simulator() as fallback:
        routes = tiers(
            up("primary", primary.url + "/v1", timeouts={"first_byte": 1.0}),
            up("fallback", fallback.url + "/v1", priority=1),
            max_attempts=3,
            retry_on=["connect", "429", "5xx", "early_eof", "first_byte_timeout"],
            timeouts={"total": 30},
        )
        with gateway_for("", routes=routes) as gw:
            started = time.monotonic()
            assert_complete_from(stream(gw, "silent"), "fallback")
            assert time.monotonic() - started < 30
            # never twice on the silent one
            assert attempts(gw, "primary", "timeout") == 1


def test_an_outage_of_the_primary_is_served_by_the_fallback_and_traffic_comes_back() -> None:
    outage = 4.0
    with (
        simulator(
            default_fault="status", default_status=503, fault_seconds=outage, retry_after=None
        ) as primary,
        simulator() as fallback,
    ):
        routes = tiers(
            up("primary", primary.url + "/v1"),
            up("fallback", fallback.url + "/v1", priority=1),
            max_attempts=3,
            eject_after=2,
            eject_base_seconds=1.0,
            eject_max_seconds=2.0,
        )
        with gateway_for("", routes=routes) as gw:
            served: list[tuple[float, str]] = []
            first = time.monotonic()
            # Until the primary has served three in a row after the outage (a loaded machine
            # may take longer over each request: the loop waits for the state, bounded)
            while time.monotonic() - first < outage + 60.0:
                tail = [u for t, u in served[-3:] if t > outage]
                if tail == ["primary"] * 3:
                    break
                sent = time.monotonic()
                response = stream(gw, f"outage-{len(served)}")
                assert response.status_code == 200, response.text
                assert time.monotonic() - sent < 10
                served.append((sent - first, response.headers["x-gateway-upstream"]))
                time.sleep(0.25)
            during = [u for t, u in served if 0.5 < t < outage - 0.5]
            assert during
            assert set(during) == {"fallback"}, served
            # back on the primary after its recovery (the ejection lasts at most 2 s), and it
            # stays there
            back = [t for t, u in served if t > outage and u == "primary"]
            assert back, served
            assert back[0] < outage + 20.0, served  # not held off for long: 2 s and a probe
            assert all(u == "primary" for t, u in served if t > back[0]), served
            text = metrics(gw)
            assert metric_value(text, "gateway_upstream_ejected", upstream="primary") == 0


def test_openai_sdk_gets_its_answer_from_the_fallback_tier_when_the_primary_is_down() -> None:
    with (
        simulator(default_fault="status", default_status=503, retry_after=None) as primary,
        simulator() as fallback,
    ):
        routes = tiers(
            up("primary", primary.url + "/v1"),
            up("fallback", fallback.url + "/v1", priority=1),
            max_attempts=3,
        )
        with gateway_for("", routes=routes) as gw:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
            chunks = client.chat.completions.create(**CHAT)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text
            assert attempts(gw, "primary") == 2  # once, and once more after the backoff
            assert attempts(gw, "fallback", "ok") == 1


def test_the_status_page_shows_each_tier_and_whether_its_upstream_is_out() -> None:
    with (
        simulator(default_fault="status", default_status=503, retry_after=None) as primary,
        simulator() as fallback,
    ):
        routes = tiers(
            up("primary", primary.url + "/v1"),
            up("fallback", fallback.url + "/v1", priority=1),
            max_attempts=3,
            eject_after=1,
        )
        with gateway_for("", routes=routes, status_page=True) as gw:
            assert_complete_from(stream(gw, "to-status"), "fallback")
            page = web.get(gw.url + "/status").text
            section = page[page.index('<section id="pools">') :]
            section = section[: section.index("</section>")]
            assert "<td>primary</td>" in section
            assert '<span class="bad">ejected</span>' in section
            assert metric_value(metrics(gw), "gateway_upstream_ejected", upstream="primary") == 1


def test_a_same_upstream_retry_is_decided_after_the_failure_is_recorded() -> None:
    # The failure ejects the primary (eject_after = 1): its retry goes to the next tier,
    # never to the upstream that was just ejected.
    with (
        simulator(default_fault="status", default_status=500) as primary,
        simulator() as fallback,
    ):
        routes = tiers(
            up("primary", primary.url + "/v1"),
            up("fallback", fallback.url + "/v1", priority=1),
            max_attempts=3,
            eject_after=1,
        )
        with gateway_for("", routes=routes) as gw:
            assert_complete_from(stream(gw, "ejected-first"), "fallback")
            assert len(sim_starts(primary)) == 1
            assert metric_value(metrics(gw), "gateway_upstream_ejected", upstream="primary") == 1


LONG_MODEL = "m" * 5000


def test_a_model_name_of_any_length_is_mapped_logged_and_cools_down_only_itself(
    capsys: Any,
) -> None:
    from tests.integration.helpers import access_log_until

    body = {**CHAT, "model": LONG_MODEL}
    with (
        simulator(default_fault="status", default_status=429, retry_after="60") as primary,
        simulator() as fallback,
    ):
        routes = tiers(
            up("primary", primary.url + "/v1"),
            up("fallback", fallback.url + "/v1", priority=1, models={"*": "sim-fallback"}),
            max_attempts=3,
        )
        with gateway_for("", routes=routes, access_log=True) as gw:
            response = web.post(
                gw.url + "/v1/chat/completions",
                json=body,
                headers={"x-request-id": "long-model"},
                timeout=30,
            )
            assert_complete_from(response, "fallback")
            # the "*" entry of the fallback's map was applied to the long name
            seen = web.get(f"{fallback.url}/_sim/requests/long-model").json()
            assert seen["body"]["model"] == "sim-fallback"
            line = access_log_until(capsys, "long-model")[-1]
            assert line["model"].startswith("m" * 100)
            assert len(line["model"]) < len(LONG_MODEL)  # cut for the log, as documented
            # the 429 cooled the primary down for that model only: another model goes to it
            other = web.post(
                gw.url + "/v1/chat/completions",
                json=CHAT,
                headers={"x-sim-fault": "none"},
                timeout=30,
            )
            assert_complete_from(other, "primary")
