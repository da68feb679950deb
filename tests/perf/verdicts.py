"""The benchmark's targets and verdicts: a run's checks, and medians over repeated runs.

bench_gateway.py measures; this module judges, without I/O. The PASS/FAIL checks are
issue 17's, stated against yardsticks of the same stack measured in the same run
(``minimal``: Starlette + aiohttp, ``minimal-raw``: a bare ASGI callable + aiohttp):

* scenario 1: CPU per event ≤ 1.0x ``minimal`` and ≤ 1.25x ``minimal-raw``; added p99
  event latency over ``direct`` ≤ 50 ms; no failures;
* scenario 4: streams/s ≥ 1.0x ``minimal`` and ≥ 0.6x ``minimal-raw``; no failures;
* scenario 5: RSS per idle stream ≤ 24 KiB; every stream held; no failures;
* scenario 6: added time to first byte over nginx ≤ 0.3 ms at p50; no failures;
* scenarios 2 and 3: no failures.

Issue 7's ratios against nginx are still computed and printed, as information only.
With ``--repeat K`` each check's value is taken in each run; the verdict is on the median
of the K values, except failures, which must be 0 in every run (the verdict is on the
largest). A check whose yardstick was not among the targets is SKIP.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping
from typing import Any

# Issue 17 (same run, medians of runs)
S1_MAX_CPU_VS_MINIMAL = 1.0
S1_MAX_CPU_VS_MINIMAL_RAW = 1.25
S1_MAX_ADDED_P99_MS = 50.0
S4_MIN_STREAMS_VS_MINIMAL = 1.0
S4_MIN_STREAMS_VS_MINIMAL_RAW = 0.6
S5_MAX_RSS_PER_STREAM_KIB = 24.0
S6_MAX_ADDED_TTFB_P50_MS = 0.3

# Issue 7 (gateway / nginx), information only
I7_S1_MIN_EVENTS_RATIO = 0.95
I7_S1_MAX_CPU_RATIO = 1.5
I7_S4_MIN_STREAMS_RATIO = 0.2
I7_S5_MAX_RSS_PER_STREAM_KIB = 40.0
I7_S6_MAX_ADDED_TTFB_P50_MS = 1.0

Results = Mapping[str, Mapping[str, Any]]  # target -> summary, for one scenario of one run


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b:
        return None
    return a / b


def added(results: Results, target: str, key: str, base: str = "direct") -> float | None:
    mine = results.get(target, {}).get(key)
    ref = results.get(base, {}).get(key)
    if mine is None or ref is None:
        return None
    return float(mine - ref)


def check(name: str, value: float | None, limit: float, op: str) -> dict[str, Any]:
    if value is None:
        verdict = "SKIP"
    elif op == ">=":
        verdict = "PASS" if value >= limit else "FAIL"
    else:
        verdict = "PASS" if value <= limit else "FAIL"
    return {"check": name, "value": value, "limit": limit, "op": op, "result": verdict}


def _failures(summary: Mapping[str, Any]) -> float | None:
    if not summary:
        return None
    return float(summary.get("failures", 0) + summary.get("held_failures", 0))


Value = Callable[[Results, str], float | None]  # a check's value for a target


def _over(key: str, base: str) -> Value:
    """The target's ``key`` over ``base``'s, in the same run."""
    return lambda results, gw: ratio(results.get(gw, {}).get(key), results.get(base, {}).get(key))


def _own(key: str) -> Value:
    return lambda results, gw: results.get(gw, {}).get(key)


def _added(key: str, base: str = "direct") -> Value:
    return lambda results, gw: added(results, gw, key, base)


#: Issue 17's PASS/FAIL checks: scenario, name, value, limit, direction.
ISSUE17: tuple[tuple[int, str, Value, float, str], ...] = (
    (
        1,
        "CPU per event / minimal",
        _over("cpu_us_per_event", "minimal"),
        S1_MAX_CPU_VS_MINIMAL,
        "<=",
    ),
    (
        1,
        "CPU per event / minimal-raw",
        _over("cpu_us_per_event", "minimal-raw"),
        S1_MAX_CPU_VS_MINIMAL_RAW,
        "<=",
    ),
    (
        1,
        "added p99 event latency (ms, over direct)",
        _added("latency_p99_ms"),
        S1_MAX_ADDED_P99_MS,
        "<=",
    ),
    (4, "streams/s / minimal", _over("streams_per_s", "minimal"), S4_MIN_STREAMS_VS_MINIMAL, ">="),
    (
        4,
        "streams/s / minimal-raw",
        _over("streams_per_s", "minimal-raw"),
        S4_MIN_STREAMS_VS_MINIMAL_RAW,
        ">=",
    ),
    (5, "RSS per idle stream (KiB)", _own("rss_per_stream_kib"), S5_MAX_RSS_PER_STREAM_KIB, "<="),
    (
        6,
        "added TTFB p50 over nginx (ms)",
        _added("ttfb_p50_ms", base="nginx"),
        S6_MAX_ADDED_TTFB_P50_MS,
        "<=",
    ),
)

#: Issue 7's checks against nginx, information only.
ISSUE7: tuple[tuple[int, str, Value, float, str], ...] = (
    (1, "events/s / nginx", _over("events_per_s", "nginx"), I7_S1_MIN_EVENTS_RATIO, ">="),
    (1, "CPU per event / nginx", _over("cpu_us_per_event", "nginx"), I7_S1_MAX_CPU_RATIO, "<="),
    (4, "streams/s / nginx", _over("streams_per_s", "nginx"), I7_S4_MIN_STREAMS_RATIO, ">="),
    (5, "RSS per stream (KiB)", _own("rss_per_stream_kib"), I7_S5_MAX_RSS_PER_STREAM_KIB, "<="),
    (
        6,
        "added TTFB p50 over nginx (ms)",
        _added("ttfb_p50_ms", base="nginx"),
        I7_S6_MAX_ADDED_TTFB_P50_MS,
        "<=",
    ),
)


def _table_checks(
    table: tuple[tuple[int, str, Value, float, str], ...], sid: int, results: Results, gw: str
) -> list[dict[str, Any]]:
    return [
        check(name, value(results, gw), limit, op)
        for scenario, name, value, limit, op in table
        if scenario == sid
    ]


def checks(sid: int, results: Results, gw: str) -> list[dict[str, Any]]:
    """Issue 17's PASS/FAIL checks of one guarded target in one scenario of one run."""
    out = _table_checks(ISSUE17, sid, results, gw)
    if sid in (1, 2, 3, 4, 5, 6, 8):
        out.append(check("failures", _failures(results.get(gw, {})), 0, "<="))
    return out


def relay_checks(sid: int, results: Results, gw: str) -> list[dict[str, Any]]:
    """Issue 7's checks against nginx: printed as information, not part of the verdict."""
    return _table_checks(ISSUE7, sid, results, gw)


def capacity_ratios(results: Results, gw: str) -> list[dict[str, Any]]:
    """Scenario 7, information: the target's streams per core over each yardstick's."""
    mine = results.get(gw, {})
    out = []
    for base in ("minimal", "minimal-raw", "nginx", "litellm"):
        if base in results and base != gw:
            theirs = results[base]
            name = f"capacity / {base}"
            # a harness-bound capacity is a lower bound: the ratio over it an upper one
            if theirs.get("bound") == "harness" and mine.get("bound") != "harness":
                name += " (at most: its capacity is harness-bound)"
            elif mine.get("bound") == "harness" and theirs.get("bound") != "harness":
                name += f" (at least: {gw}'s capacity is harness-bound)"
            value = ratio(mine.get("capacity"), theirs.get("capacity"))
            out.append({"check": name, "value": value, "result": "INFO"})
    return out


# ---------------------------------------------------------------------------------------------
# Repeated runs: medians and ranges
# ---------------------------------------------------------------------------------------------


def spread(values: Iterable[float | None]) -> dict[str, Any] | None:
    """Median and range of the values that exist; None when there are none."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return None
    return {
        "median": statistics.median(present),
        "min": min(present),
        "max": max(present),
        "values": present,
    }


#: Per-target numbers summarized over runs (the rest of a summary is in each run's JSON).
METRICS = (
    "events_per_s",
    "streams_per_s",
    "mb_per_s",
    "latency_p50_ms",
    "latency_p99_ms",
    "added_p50_ms",
    "added_p99_ms",
    "ttfb_p50_ms",
    "ttfb_p99_ms",
    "cpu_us_per_event",
    "cpu_us_per_request",
    "rss_per_stream_kib",
    "failures",
    "late_starts",
    "harness_cpu_pct",
    "capacity",
)


def summarize_runs(runs: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians and ranges over runs: per scenario, per target and metric, and per check.

    ``runs`` are the runs' ``{"scenarios": {sid: {"targets": ..., "checks": ...}}}``.
    """
    out: dict[str, Any] = {}
    sids = sorted({sid for run in runs for sid in run["scenarios"]}, key=int)
    for sid in sids:
        per_run = [run["scenarios"].get(sid) for run in runs]
        per_run = [s for s in per_run if s]
        targets: dict[str, dict[str, Any]] = {}
        names = [t for s in per_run for t in s["targets"]]
        for target in dict.fromkeys(names):
            rows = [s["targets"].get(target, {}) for s in per_run]
            metrics: dict[str, Any] = {}
            for key in METRICS:
                if any(key in r for r in rows):
                    value = spread(r.get(key) for r in rows)
                    if value is not None:
                        metrics[key] = value
            if any("bound" in r for r in rows):  # scenario 7: what bounded each run's answer
                metrics["bounds"] = [r.get("bound") for r in rows]
            labels = [r["label"] for r in rows if r.get("label")]
            if labels:
                metrics["label"] = labels[0]
            targets[target] = metrics
        out[sid] = {
            "title": per_run[0]["title"],
            "runs": len(per_run),
            "targets": targets,
            "checks": _aggregate_checks(per_run, "checks"),
            "relay_checks": _aggregate_checks(per_run, "relay_checks"),
            "info": _aggregate_checks(per_run, "info"),
        }
    return out


def _aggregate_checks(per_run: list[Mapping[str, Any]], key: str) -> dict[str, list[Any]]:
    grouped: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for scenario in per_run:
        for gw, items in scenario.get(key, {}).items():
            for item in items:
                grouped.setdefault(gw, {}).setdefault(item["check"], []).append(item)
    out: dict[str, list[Any]] = {}
    for gw, by_name in grouped.items():
        rows = []
        for name, items in by_name.items():
            stats = spread(i["value"] for i in items)
            first = items[0]
            row: dict[str, Any] = {"check": name, **(stats or {"median": None})}
            if "limit" in first:
                # failures must be 0 in every run: judge the worst; the rest on the median
                judged = (stats or {}).get("max" if name == "failures" else "median")
                row.update(check(name, judged, first["limit"], first["op"]))
                row["value"] = judged
                row["judged_on"] = "max" if name == "failures" else "median"
            else:
                row["result"] = first.get("result", "INFO")
            rows.append(row)
        out[gw] = rows
    return out


def failed(checks_by_target: Mapping[str, list[Mapping[str, Any]]]) -> bool:
    return any(c.get("result") == "FAIL" for items in checks_by_target.values() for c in items)
