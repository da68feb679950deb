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
import textwrap
from dataclasses import dataclass, field, fields
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


#: The text table's width (``gateway probe``'s terminal output).
TABLE_WIDTH: Final = 100
_TEXT_HEADER: Final = ("check", "expects", "got", "result", "ttfb", "total")
#: Column widths of the text table (the last two right-aligned): an indent of two,
#: 11 + 28 + 28 + 6 + 7 + 7, and two spaces between columns make 99.
_WIDTHS: Final = (11, 28, 28, 6, 7, 7)
#: What each check holds the answer to, in the words of the text table's ``got``.
_EXPECTS: Final = {
    "stream": "complete",
    "usage": "reported usage",
    "tool_call": "complete/tool_calls",
    "choices": "2 choices finished",
    "schema": "complete, schema=valid",
    "plain": "2xx application/json",
    "interrupted": "incomplete/client_disconnect",
    "refused": "4xx upstream_status",
}


def _got(c: Cell) -> str:
    """What a check got, in the terms of its ``expects``."""
    verdict = f"{c.outcome}/{c.reason}" if c.outcome else None
    status = "-" if c.status is None else str(c.status)
    if c.check == "usage" and c.outcome == "complete":
        return (
            "usage "
            + (c.usage or "unknown")
            + (f" ({c.usage_position})" if c.usage_position else "")
        )
    if c.check == "choices" and c.outcome == "complete":
        return f"{len(c.finish_reasons)} finished ({','.join(c.finish_reasons)})"
    if c.check == "schema" and c.outcome:
        return f"{c.outcome}, schema={c.schema or '-'}"
    if c.check == "plain":
        return f"{status} {c.media_type or '-'}" + (f" ({c.error})" if c.error else "")
    if c.check == "refused":
        return f"{status} {c.reason}" if c.reason else f"{status} ({c.error or '-'})"
    return verdict or c.error or f"status {status}"


def _short_ms(value: float | None) -> str:
    """Milliseconds in at most 7 characters (seconds from 100 s on)."""
    if value is not None and value >= 99_999.95:
        return f"{value / 1000:.0f}s"
    return _number(value)


def _fit(text: str) -> str:
    return text if len(text) <= TABLE_WIDTH else text[: TABLE_WIDTH - 3] + "..."


def _row(cells: tuple[str, ...]) -> str:
    """One line of the text table: columns padded (numbers right-aligned), long ones cut."""
    out = []
    for index, (cell, width) in enumerate(zip(cells, _WIDTHS, strict=True)):
        if len(cell) > width:
            cell = cell[: width - 1] + "~"
        out.append(cell.rjust(width) if index >= 4 else cell.ljust(width))
    return ("  " + "  ".join(out)).rstrip()


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
        head = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "cells"}
        return {
            "schema": SCHEMA,
            **head,
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
        """A plain-text table for the terminal, at most ``TABLE_WIDTH`` columns wide.

        One heading line per route, protocol and model; under it one row per
        check with what the check expects and what it got (an expected
        ``incomplete`` passes), and the problem of a failed one on its own
        indented line. The full detail is in the JSON and the Markdown.
        """
        lines: list[str] = []
        group: tuple[str, str, str] | None = None
        for c in self.cells:
            if (c.route, c.protocol, c.model) != group:
                group = (c.route, c.protocol, c.model)
                if lines:
                    lines.append("")
                heading = f"route {c.route}, protocol {c.protocol}, model {c.model} (times in ms)"
                lines.append(_fit(heading))
                lines.append(_row(_TEXT_HEADER))
            lines.append(
                _row(
                    (
                        c.check,
                        _EXPECTS.get(c.check, "-"),
                        _got(c),
                        "pass" if c.passed else "FAIL",
                        _short_ms(c.ttfb_ms),
                        _short_ms(c.total_ms),
                    )
                )
            )
            if c.problem:
                lines.extend(
                    textwrap.wrap(
                        c.problem,
                        TABLE_WIDTH,
                        initial_indent="    problem: ",
                        subsequent_indent="      ",
                        break_on_hyphens=False,
                    )
                )
        return "\n".join(lines) + "\n" + self.summary() + "\n"

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
