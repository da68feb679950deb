"""The benchmark's pure rules: the capacity search, the verdicts over runs, LiteLLM's config.

bench_gateway.py itself is a script run by hand (it needs psutil, nginx and two quiet
cores); what it decides with is plain code, checked here on made-up measurements.
"""

from __future__ import annotations

import json

import capacity
import litellm_peer
import pytest
import verdicts


def _search_until_done(search: capacity.Search, true_capacity: int) -> list[int]:
    tried = []
    while (n := search.next_n()) is not None:
        tried.append(n)
        search.record(n, n <= true_capacity)
    return tried


def test_search_grows_then_bisects_to_the_resolution() -> None:
    search = capacity.Search(start=100, cap=4000, max_trials=20)
    tried = _search_until_done(search, 330)
    assert tried[:3] == [100, 200, 400]
    assert search.lo <= 330 < search.hi
    assert search.hi - search.lo <= capacity.resolution(search.lo)
    assert search.resolved


def test_search_halves_when_the_start_fails() -> None:
    search = capacity.Search(start=100, cap=4000, max_trials=20)
    tried = _search_until_done(search, 30)
    assert tried[:3] == [100, 50, 25]
    assert search.lo <= 30 < search.hi
    assert search.resolved


def test_search_stops_at_the_cap_and_at_the_trial_budget() -> None:
    capped = capacity.Search(start=100, cap=300, max_trials=20)
    assert _search_until_done(capped, 10_000) == [100, 200, 300]
    assert capped.lo == 300
    assert capped.hi is None
    assert capped.resolved
    short = capacity.Search(start=100, cap=4000, max_trials=3)
    assert len(_search_until_done(short, 10_000)) == 3
    assert not short.resolved


def test_resolution_is_five_percent_but_at_least_25_streams_when_large() -> None:
    assert capacity.resolution(2000) == 100
    assert capacity.resolution(300) == 25
    assert capacity.resolution(40) == 4


def _trial(p99: float, **extra: object) -> dict[str, object]:
    return {"latency_p99_ms": p99, "failures": 0, "late_starts": 0, **extra}


def test_judge_takes_added_latency_late_starts_and_failures() -> None:
    base = _trial(10.0)
    assert capacity.judge(_trial(59.0), base) == []
    assert "added p99" in capacity.judge(_trial(61.0), base)[0]
    assert "late starts" in capacity.judge(_trial(20.0, late_starts=3), base)[0]
    assert "failures" in capacity.judge(_trial(20.0, failures=1), base)[0]
    assert capacity.judge(_trial(49.0), None) == []  # direct: over zero
    assert capacity.judge(_trial(51.0), None) != []


def test_harness_bound_needs_the_harness_to_fail_not_one_disturbed_trial() -> None:
    quiet = _trial(80.0, harness_plateau_cpu_pct=40.0)
    assert capacity.harness_bound(400, quiet, harness_hi=800) == []
    assert capacity.harness_bound(800, quiet, harness_hi=800) != []
    busy = _trial(80.0, harness_plateau_cpu_pct=97.0)
    assert capacity.harness_bound(400, busy, harness_hi=None) != []


def test_describe() -> None:
    assert capacity.describe({"capacity": 350, "hi": 375, "bound": "target"}) == "350"
    assert "harness-bound" in capacity.describe({"capacity": 1200, "hi": 1600, "bound": "harness"})
    assert capacity.describe({"capacity": 0, "hi": 25, "bound": "target"}) == "< 25"


def _run(gw_cpu: float, gw_failures: int) -> dict[str, object]:
    targets = {
        "direct": {"latency_p99_ms": 5.0, "failures": 0},
        "minimal": {"cpu_us_per_event": 50.0, "failures": 0, "latency_p99_ms": 20.0},
        "minimal-raw": {"cpu_us_per_event": 40.0, "failures": 0, "latency_p99_ms": 15.0},
        "gateway": {"cpu_us_per_event": gw_cpu, "failures": gw_failures, "latency_p99_ms": 30.0},
    }
    checks = {"gateway": verdicts.checks(1, targets, "gateway")}
    return {"scenarios": {"1": {"title": "s1", "targets": targets, "checks": checks}}}


def _checks(run: dict[str, object]) -> dict[str, dict[str, object]]:
    items = run["scenarios"]["1"]["checks"]["gateway"]
    return {c["check"]: c for c in items}


def test_checks_of_one_run_against_the_yardsticks() -> None:
    good = _checks(_run(45.0, 0))
    assert good["CPU per event / minimal"]["result"] == "PASS"  # 0.9 <= 1.0
    assert good["CPU per event / minimal-raw"]["result"] == "PASS"  # 1.125 <= 1.25
    assert good["added p99 event latency (ms, over direct)"]["value"] == 25.0
    assert good["failures"]["result"] == "PASS"
    bad = _checks(_run(55.0, 1))
    assert bad["CPU per event / minimal"]["result"] == "FAIL"  # 1.1
    assert bad["CPU per event / minimal-raw"]["result"] == "FAIL"  # 1.375
    assert bad["failures"]["result"] == "FAIL"


def test_a_check_without_its_yardstick_is_skipped() -> None:
    targets = {"gateway": {"cpu_us_per_event": 45.0, "failures": 0}}
    by_name = {c["check"]: c for c in verdicts.checks(1, targets, "gateway")}
    assert by_name["CPU per event / minimal"]["result"] == "SKIP"


def test_medians_over_runs_and_failures_judged_on_the_worst_run() -> None:
    runs = [_run(45.0, 0), _run(55.0, 0), _run(48.0, 2)]
    summary = verdicts.summarize_runs(runs)
    gw = summary["1"]["targets"]["gateway"]["cpu_us_per_event"]
    assert (gw["median"], gw["min"], gw["max"]) == (48.0, 45.0, 55.0)
    by_name = {c["check"]: c for c in summary["1"]["checks"]["gateway"]}
    assert by_name["CPU per event / minimal"]["value"] == pytest.approx(0.96)
    assert by_name["CPU per event / minimal"]["result"] == "PASS"
    assert by_name["failures"]["value"] == 2.0
    assert by_name["failures"]["result"] == "FAIL"
    assert verdicts.failed(summary["1"]["checks"])


def test_litellm_config_has_one_model_per_stream_and_the_master_key() -> None:
    config = json.loads(
        litellm_peer.config_yaml(4321, ["mode=hold", "mode=burst&n=5", "mode=hold"])
    )
    names = [m["model_name"] for m in config["model_list"]]
    assert names == ["bench?mode=burst&n=5", "bench?mode=hold"]
    assert config["model_list"][0]["litellm_params"]["model"] == "openai/bench?mode=burst&n=5"
    assert config["model_list"][0]["litellm_params"]["api_base"] == "http://127.0.0.1:4321/v1"
    assert config["general_settings"]["master_key"] == litellm_peer.MASTER_KEY
