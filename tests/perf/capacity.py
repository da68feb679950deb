"""Streams per core: how bench_gateway.py's capacity search (scenario 7) chooses and judges.

The question: the largest number N of concurrent streams at 50 events/s (150 events each,
arrivals spread evenly over 1 s, as in scenario 1) that a target carries on one core.
A trial runs N such streams through a fresh, warmed-up target process. It **passes** when

* its p99 event latency exceeds ``direct``'s p99 at the same N (measured once per N in the
  same run, and cached) by at most 50 ms,
* no stream started late: every stream's first body byte came at most 1 s after the
  stream's scheduled start (a stream without any first byte by then is late too),
* and nothing failed (every stream verified: status, every stamped event, its end).

``direct`` itself is searched first with the same rules, its added p99 taken over zero:
its N is what the harness (one Python process on CPU 0, upstream and load generator)
can drive and measure at all.

The search, per target: N doubles from a start (100) until a trial fails or a cap is
reached, halves from the start if the start fails, then bisects between the largest
passing N and the smallest failing N until they are within ``resolution(N)`` (5 %,
but at least 25 streams, and 10 % for small N), within a trial budget (10) that the caller
also bounds in time. The answer is the largest passing N.

The answer is **harness-bound** (printed "≥ N (harness-bound)") when the harness, not the
target, failed at the smallest failing N: that N is at or above the smallest N at which
``direct``'s own search failed, or the harness's core was at ``HARNESS_BOUND_CPU_PCT`` or
more while all streams were open in the target's trial there, or the target passed at
``direct``'s own largest N (the caller caps a target's search there). (A single ``direct`` trial
that fails below direct's own limit is a disturbed run, reported but not taken as the
bound.) This module holds that logic without any I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

STREAMS_START = 100
STREAMS_CAP = 4000
MAX_TRIALS = 10
MAX_ADDED_P99_MS = 50.0
LATE_START_S = 1.0
HARNESS_BOUND_CPU_PCT = 90.0
RESOLUTION_REL = 0.05
RESOLUTION_ABS = 25


def resolution(n: int) -> int:
    """How close the passing and failing N must be to stop: 5 %, at least 25 (10 % if small)."""
    return max(math.ceil(RESOLUTION_REL * n), min(RESOLUTION_ABS, max(1, n // 10)))


def judge(trial: Mapping[str, Any], baseline: Mapping[str, Any] | None) -> list[str]:
    """Why a trial failed ([] = it passed). ``baseline`` is direct's trial at the same N,
    None for direct itself (its added p99 is over zero)."""
    reasons = []
    if trial.get("aborted"):
        reasons.append(f"stopped early: {trial['aborted']}")
    late = trial.get("late_starts", 0)
    if late:
        reasons.append(
            f"{late} late starts (first byte > {LATE_START_S:g} s after schedule;"
            f" max {trial.get('start_lag_max_ms') or 0:.0f} ms)"
        )
    if trial.get("failures"):
        reasons.append(f"{trial['failures']} failures {trial.get('failure_reasons') or {}}")
    p99 = trial.get("latency_p99_ms")
    base = 0.0 if baseline is None else baseline.get("latency_p99_ms")
    if p99 is None:
        reasons.append("no events measured")
    elif base is None:
        reasons.append("no direct baseline at this N")
    elif p99 - base > MAX_ADDED_P99_MS:
        reasons.append(f"added p99 {p99 - base:.1f} ms > {MAX_ADDED_P99_MS:g} ms")
    return reasons


@dataclass
class Search:
    """Exponential growth, then bisection; fed one verdict at a time (``record``)."""

    start: int = STREAMS_START
    cap: int = STREAMS_CAP
    max_trials: int = MAX_TRIALS
    lo: int = 0  # largest N that passed (0: none yet)
    hi: int | None = None  # smallest N that failed
    trials: list[tuple[int, bool]] = field(default_factory=list)

    def next_n(self) -> int | None:
        """The next N to try, or None when the search is done (or out of trials)."""
        if len(self.trials) >= self.max_trials:
            return None
        if not self.trials:
            return max(min(self.start, self.cap), 1)
        if self.hi is None:  # growing: everything so far passed
            return None if self.lo >= self.cap else min(self.lo * 2, self.cap)
        if self.lo == 0:  # shrinking: nothing passed yet
            return None if self.hi <= 1 else max(self.hi // 2, 1)
        if self.hi - self.lo <= resolution(self.lo):
            return None
        return (self.lo + self.hi) // 2

    def record(self, n: int, passed: bool) -> None:
        self.trials.append((n, passed))
        if passed:
            self.lo = max(self.lo, n)
        else:
            self.hi = n if self.hi is None else min(self.hi, n)

    @property
    def resolved(self) -> bool:
        if self.hi is None:
            return self.lo >= self.cap
        return (self.lo == 0 and self.hi <= 1) or self.hi - self.lo <= resolution(self.lo)


def harness_bound(
    hi: int | None,
    failing_trial: Mapping[str, Any] | None,
    harness_hi: int | None,
) -> list[str]:
    """Why the harness, not the target, was the bound at the target's smallest failing N
    ``hi`` ([] = it was not). ``harness_hi`` is the smallest N at which ``direct``'s own
    search failed (None: it never failed)."""
    if hi is None or failing_trial is None:
        return []
    why = []
    if harness_hi is not None and hi >= harness_hi:
        why.append(f"direct itself fails from N={harness_hi}")
    cpu = failing_trial.get("harness_plateau_cpu_pct")
    if cpu is not None and cpu >= HARNESS_BOUND_CPU_PCT:
        why.append(f"harness core at {cpu:.0f}% with all streams open")
    return why


def describe(result: Mapping[str, Any]) -> str:
    """The capacity as printed: "350", "≥ 1200 (harness-bound)", "< 50", "≥ 4000 (cap)"."""
    lo, hi, bound = result.get("capacity") or 0, result.get("hi"), result.get("bound")
    if bound == "harness":
        return f"≥ {lo} (harness-bound)"
    if bound == "cap":
        return f"≥ {lo} (search cap)"
    if lo == 0:
        return f"< {hi}" if hi else "none"
    if bound == "budget":
        return f"{lo} (< {hi}, unresolved)" if hi else f"≥ {lo} (trial budget)"
    return str(lo)
