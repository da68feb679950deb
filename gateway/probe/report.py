"""The acceptance matrix and its three renderings: JSON (stable), Markdown, a text table.

The JSON follows ``docs/probe-matrix.schema.json`` (``schema:
"gateway-probe/1"``); a new field may be added, none renamed or removed
without a new schema version, so that CI can diff two probes of one route.
Rows come in the order the probe ran them (route, protocol, model, check).
Only categories, counts, times and versions: never a key, a prompt, an
answer's text or an upstream URL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from gateway.probe.checks import Cell

__all__ = ["SCHEMA", "Matrix"]

SCHEMA: Final = "gateway-probe/1"


_HEADER: Final = (
    "route",
    "protocol",
    "model",
    "check",
    "result",
    "status",
    "verdict",
    "finish",
    "usage",
    "ttfb ms",
    "ttft ms",
    "total ms",
    "problem",
)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


@dataclass(slots=True)
class Matrix:
    """The result of one probe."""

    gateway_version: str
    client: dict[str, str]
    started_at: str
    finished_at: str
    simulator: bool
    cells: list[Cell] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(cell.passed for cell in self.cells)

    @property
    def failed(self) -> int:
        return sum(not cell.passed for cell in self.cells)

    def as_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "gateway_version": self.gateway_version,
            "client": self.client,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "simulator": self.simulator,
            "summary": {
                "checks": len(self.cells),
                "passed": len(self.cells) - self.failed,
                "failed": self.failed,
            },
            "results": [cell.as_dict() for cell in self.cells],
        }

    def dumps(self) -> str:
        return json.dumps(self.as_json(), indent=2) + "\n"

    def _rows(self) -> list[list[str]]:
        rows = []
        for c in self.cells:
            verdict = f"{c.outcome}/{c.reason}" if c.outcome else (c.error or "-")
            rows.append(
                [
                    c.route,
                    c.protocol,
                    c.model,
                    c.check,
                    "pass" if c.passed else "FAIL",
                    "-" if c.status is None else str(c.status),
                    verdict,
                    ",".join(c.finish_reasons) or "-",
                    (c.usage or "-") + (f" ({c.usage_position})" if c.usage_position else ""),
                    _number(c.ttfb_ms),
                    _number(c.ttft_ms),
                    _number(c.total_ms),
                    c.problem or "",
                ]
            )
        return rows

    def summary(self) -> str:
        total, failed = len(self.cells), self.failed
        return f"{total} checks: {total - failed} passed, {failed} failed"

    def table(self) -> str:
        """A plain-text table for the terminal."""
        rows = [list(_HEADER), *self._rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER) - 1)]
        lines = [
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
            + ("  " + row[-1] if row[-1] else "")
            for row in rows
        ]
        return "\n".join(line.rstrip() for line in lines) + "\n" + self.summary() + "\n"

    def markdown(self) -> str:
        """A Markdown report: the versions, the times and the table."""
        client = ", ".join(f"{name} {version}" for name, version in self.client.items())
        lines = [
            "# Route acceptance matrix",
            "",
            f"- gateway {self.gateway_version}; client: {client}",
            f"- from {self.started_at} to {self.finished_at}"
            + (" (built-in simulator)" if self.simulator else ""),
            f"- {self.summary()}",
            "",
            "| " + " | ".join(_HEADER) + " |",
            "|" + " --- |" * len(_HEADER),
        ]
        for row in self._rows():
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
        return "\n".join(lines) + "\n"
