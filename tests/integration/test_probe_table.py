"""``gateway probe``'s text table: 100 columns at most, with what each check expects."""

from __future__ import annotations

from gateway.probe.checks import CHECKS, Cell
from gateway.probe.report import TABLE_WIDTH, Matrix
from tests.cli import run_cli


def _rows(text: str) -> dict[str, list[str]]:
    """Each check's row, split on its runs of two or more spaces."""
    rows = {}
    for line in text.splitlines():
        cells = [cell for cell in line.strip().split("  ") if cell.strip()]
        cells = [cell.strip() for cell in cells]
        if cells and cells[0] in CHECKS:
            rows[cells[0]] = cells
    return rows


def test_the_simulator_probe_fits_100_columns_and_shows_what_each_check_expects() -> None:
    result = run_cli("probe", "--simulator", "--protocol", "chat", "messages", env={})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= TABLE_WIDTH, result.stdout
    assert any(line.split()[:3] == ["check", "expects", "got"] for line in lines if line), lines
    rows = _rows(result.stdout)
    # an expected incomplete passes, and says that it was expected
    interrupted = rows["interrupted"]
    assert interrupted[1:4] == [
        "incomplete/client_disconnect",
        "incomplete/client_disconnect",
        "pass",
    ]
    assert rows["refused"][1:4] == ["4xx upstream_status", "404 upstream_status", "pass"]
    assert rows["stream"][1:4] == ["complete", "complete/stop", "pass"]


def test_long_values_and_problems_stay_within_100_columns() -> None:
    cell = Cell(
        "a-route-with-a-rather-long-name-" * 3,
        "responses",
        "a-model-with-an-extremely-long-name-for-testing",
        "interrupted",
        "2026-12-01T00:00:00Z",
        passed=False,
        problem="recorded complete although the probe left after the first content event "
        "(the whole answer was relayed before the gateway saw it leave) " * 2,
        outcome="complete",
        reason="stop",
        ttfb_ms=123456.7,
        total_ms=1234567.8,
    )
    table = Matrix("0", {}, "", "", False, [cell]).table()
    assert max(len(line) for line in table.splitlines()) <= TABLE_WIDTH, table
    assert "FAIL" in table
    assert "problem: recorded complete although" in table
