"""``observe_all`` puts a stream's chunk gaps into a histogram exactly as ``observe`` does.

It increments each bucket once instead of once per value, through the
histogram child's own fields; these tests hold it to ``observe``'s result,
in one process and in multiprocess mode (several workers), so that a
prometheus-client release that changes those fields fails here first.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from gateway.observe.metrics import observe_all

BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def _samples(registry: CollectorRegistry, name: str) -> dict[str, float]:
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for metric in registry.collect()
        if metric.name == name
        for s in metric.samples
        if not s.name.endswith("_created")
    }


@given(
    st.lists(
        st.floats(min_value=0.0, max_value=5.0, allow_nan=False)
        | st.sampled_from([*BOUNDS, 0.0, 5.0]),  # exactly on a bound: that bucket
        max_size=60,
    )
)
def test_bulk_equals_one_observe_per_value(values: list[float]) -> None:
    registry = CollectorRegistry()
    one = Histogram("one", "each", ["route"], buckets=BOUNDS, registry=registry)
    bulk = Histogram("bulk", "all", ["route"], buckets=BOUNDS, registry=registry)
    each = one.labels("r")
    for value in values:
        each.observe(value)
    observe_all(bulk.labels("r"), values)
    got = {k.replace("bulk", "x"): v for k, v in _samples(registry, "bulk").items()}
    want = {k.replace("one", "x"): v for k, v in _samples(registry, "one").items()}
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key


def test_bulk_adds_to_what_the_histogram_already_holds() -> None:
    registry = CollectorRegistry()
    histogram = Histogram("h", "gaps", buckets=BOUNDS, registry=registry)
    histogram.observe(0.3)
    observe_all(histogram, [0.001, 0.3, 2.0])
    text = generate_latest(registry).decode()
    assert 'h_bucket{le="0.005"} 1.0' in text
    assert 'h_bucket{le="0.5"} 3.0' in text
    assert 'h_bucket{le="+Inf"} 4.0' in text
    assert "h_count 4.0" in text


def test_a_child_without_the_fields_gets_observe_per_value() -> None:
    class Plain:
        def __init__(self) -> None:
            self.seen: list[float] = []

        def observe(self, value: float) -> None:
            self.seen.append(value)

    plain = Plain()
    observe_all(plain, [0.1, 0.2])
    assert plain.seen == [0.1, 0.2]


def test_bulk_equals_observe_in_multiprocess_mode(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        from prometheus_client import CollectorRegistry, Histogram, generate_latest, multiprocess
        from gateway.observe.metrics import observe_all

        values = [0.001, 0.004, 0.01, 0.07, 0.07, 0.3, 1.0, 3.5]
        bounds = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
        one = Histogram("one", "each", buckets=bounds)
        bulk = Histogram("bulk", "all", buckets=bounds)
        for value in values:
            one.observe(value)
        observe_all(bulk, values)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        text = generate_latest(registry).decode()
        lines = sorted(
            line.replace("bulk", "x") for line in text.splitlines() if line.startswith("bulk")
        )
        want = sorted(
            line.replace("one", "x") for line in text.splitlines() if line.startswith("one")
        )
        assert lines == want, (lines, want)
        assert any('x_bucket{le="0.005"} 2.0' == line for line in lines), lines
        print("ok", len(lines))
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
    assert done.stdout.split() == ["ok", "11"]  # 9 buckets, count and sum
