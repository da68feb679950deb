"""The metrics are a table (gateway.observe.table): one row a metric, built by one loop.

What the registry exposes is exactly the rows, each with its row's kind, help
and labels; no metric is made anywhere else in the observe folder, so a new
metric is one row, never another block of declarations in ``__init__``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.observe.metrics import Metrics
from gateway.observe.table import Bounds, Declared, build, rows
from gateway.observe.ws_metrics import WsMetrics

ROOT = Path(__file__).resolve().parents[2]
KINDS = {Counter: "counter", Gauge: "gauge"}


def test_the_registry_holds_exactly_the_rows() -> None:
    metrics = Metrics()
    table = {row.name: row for row in rows(Metrics) + rows(WsMetrics)}
    exposed = {}
    for family in metrics.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        exposed[name] = family
    assert set(exposed) == set(table)
    for name, row in table.items():
        family = exposed[name]
        assert family.documentation == row.help, name
        assert family.type == KINDS.get(row.kind, "histogram"), name
        sample_labels = {k for s in family.samples for k in s.labels} - {"le"}
        assert sample_labels <= set(row.labels), name


def test_each_row_is_its_attribute() -> None:
    metrics = Metrics()
    for row in rows(Metrics):
        assert isinstance(getattr(metrics, row.attr), row.kind), row.attr
    assert isinstance(Metrics.requests, Declared)  # the class keeps the row


def test_histogram_buckets_follow_the_bounds() -> None:
    short = Metrics(longest_request_seconds=10.0, longest_first_byte_seconds=10.0)
    long = Metrics(longest_request_seconds=7200.0, longest_first_byte_seconds=600.0)
    assert short.request_duration._upper_bounds[-2] < long.request_duration._upper_bounds[-2]
    assert long.request_duration._upper_bounds[-2] >= 7200.0
    assert long.time_to_first_token._upper_bounds[-2] >= 600.0


def test_a_row_not_yet_built_says_so() -> None:
    class Table:
        hits = Declared("t_hits", Counter, "Hits.", ("route",))

    table = Table()
    with pytest.raises(AttributeError, match="hits"):
        table.hits  # noqa: B018
    build(table, CollectorRegistry(), Bounds())
    table.hits.labels("r").inc()
    assert table.hits.labels("r")._value.get() == 1


@pytest.mark.parametrize("module", sorted((ROOT / "gateway" / "observe").glob("*.py")))
def test_no_metric_is_made_outside_a_table(module: Path) -> None:
    """prometheus-client's ``Counter``, ``Gauge`` and ``Histogram`` are made only by the table."""
    if module.name == "table.py":
        return
    tree = ast.parse(module.read_text())
    kinds = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "prometheus_client"
        for alias in node.names
    } & {"Counter", "Gauge", "Histogram"}
    made = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in kinds
    ]
    assert not made, f"{module.name} makes a metric at lines {made}"
