"""``fast_add`` and ``fast_observe`` give prometheus-client's own results, without its checks.

They read private fields of a metric's child (``_value``; ``_sum``,
``_buckets``, ``_upper_bounds``): these tests pin that the fields are there
(the fast path is taken) and that the exposition is the one ``inc``, ``dec``
and ``observe`` give, in one process and with several workers' files.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.observe.metrics import OPERATION_DURATION_BUCKETS, fast_add, fast_observe


def _samples(registry: CollectorRegistry, name: str) -> dict[str, float]:
    return {
        f"{s.name.replace(name, 'x', 1)}{sorted(s.labels.items())}": s.value
        for metric in registry.collect()
        if metric.name == name
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def _same(got: dict[str, float], want: dict[str, float]) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == value or abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key


def test_the_private_fields_are_there() -> None:
    registry = CollectorRegistry()
    counter = Counter("c", "c", ["a"], registry=registry).labels("x")
    gauge = Gauge("g", "g", ["a"], registry=registry, multiprocess_mode="livesum").labels("x")
    histogram = Histogram("h", "h", ["a"], registry=registry).labels("x")
    assert fast_add(counter) == counter._value.inc
    assert fast_add(gauge) == gauge._value.inc
    assert fast_observe(histogram) != histogram.observe  # the bisect, not the fallback


_AMOUNTS = st.lists(st.floats(min_value=0.0, max_value=1e9) | st.integers(0, 10**6), max_size=30)


@given(_AMOUNTS, _AMOUNTS)
def test_counter_and_gauge_as_inc_and_dec(ups: list[float], downs: list[float]) -> None:
    registry = CollectorRegistry()
    for name, kind in (("c", Counter), ("g", Gauge)):
        theirs = kind(name + "1", "t", ["a"], registry=registry).labels("x")
        ours = fast_add(kind(name + "2", "o", ["a"], registry=registry).labels("x"))
        for amount in ups:
            theirs.inc(amount)
            ours(amount)
        if kind is Gauge:
            for amount in downs:
                theirs.dec(amount)  # type: ignore[attr-defined]
                ours(-amount)
        _same(_samples(registry, name + "2"), _samples(registry, name + "1"))


_DURATIONS = st.lists(
    st.floats(min_value=0.0, max_value=200.0)
    | st.sampled_from([*OPERATION_DURATION_BUCKETS, 0.0, 1e9, -1.0, math.inf, math.nan]),
    max_size=40,
)


@given(_DURATIONS)
def test_histogram_as_observe(values: list[float]) -> None:
    registry = CollectorRegistry()
    theirs = Histogram("one", "t", ["a"], buckets=OPERATION_DURATION_BUCKETS, registry=registry)
    ours = Histogram("two", "o", ["a"], buckets=OPERATION_DURATION_BUCKETS, registry=registry)
    each = theirs.labels("x")
    observe = fast_observe(ours.labels("x"))
    for value in values:
        each.observe(value)
        observe(value)
    got, want = _samples(registry, "two"), _samples(registry, "one")
    assert got.keys() == want.keys()
    for key, value in want.items():
        if math.isnan(value):
            assert math.isnan(got[key]), key
        else:
            assert got[key] == value or abs(got[key] - value) <= 1e-9 * abs(value), key


def test_the_same_in_multiprocess_mode(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        from prometheus_client import generate_latest, multiprocess
        from gateway.observe.metrics import fast_add, fast_observe

        values = [0.001, 0.004, 0.01, 0.07, 0.07, 0.3, 1.0, 3.5, 90.0]
        for name, kind in (("c", Counter), ("g", Gauge)):
            extra = {"multiprocess_mode": "livesum"} if kind is Gauge else {}
            theirs = kind(name + "one", "t", ["a"], **extra).labels("x")
            ours = fast_add(kind(name + "two", "o", ["a"], **extra).labels("x"))
            assert ours == ours.__self__.inc and type(ours.__self__).__name__ == "MmapedValue"
            for v in values:
                theirs.inc(v)
                ours(v)
        one = Histogram("hone", "t", ["a"]).labels("x")
        two = fast_observe(Histogram("htwo", "o", ["a"]).labels("x"))
        for v in values:
            one.observe(v)
            two(v)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        text = generate_latest(registry).decode().splitlines()
        n = 0
        for name in ("c", "g", "h"):
            got = sorted(l.replace(name + "two", "x") for l in text if l.startswith(name + "two"))
            want = sorted(l.replace(name + "one", "x") for l in text if l.startswith(name + "one"))
            assert got == want and got, (got, want)
            n += len(got)
        print("ok", n)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "ok"
