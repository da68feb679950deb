"""``gateway probe``: the route acceptance matrix.

For each configured route, model and check (``checks``), a fixed, harmless
request goes through an in-process gateway (``runner``) and the gateway's own
verdict on it becomes one cell of the matrix (``report``). ``plan`` decides
what runs, and refuses what cannot (exit status 2).

Public surface::

    make_plan(settings, routes=, models=, protocols=, checks=, inject=) -> Plan
    await run_plan(settings, plan, check_seconds=) -> Matrix   # .passed, .dumps(), .markdown()
    dry_run(plan) -> str                                 # what would be sent
"""

from __future__ import annotations

import json

from gateway.probe.checks import CHECKS, INVALID_MODEL, Cell, build_request
from gateway.probe.plan import SIMULATOR_MODEL, Plan, ProbeConfigError, make_plan
from gateway.probe.report import SCHEMA, Matrix
from gateway.probe.runner import run_plan

__all__ = [
    "CHECKS",
    "INVALID_MODEL",
    "SCHEMA",
    "SIMULATOR_MODEL",
    "Cell",
    "Matrix",
    "Plan",
    "ProbeConfigError",
    "dry_run",
    "make_plan",
    "run_plan",
]


def dry_run(plan: Plan) -> str:
    """Every request the plan would send, as it would leave the probe (the gateway
    then adds the route's credential)."""
    lines = []
    for number, (target, check) in enumerate(plan.runs, 1):
        request = build_request(check, target, plan.headers.get(check, {}))
        lines.append(f"# {target.route} {target.protocol} {target.model} {check}")
        lines.append(f"POST {request.path}")
        headers = {**request.headers, "x-request-id": f"probe-<run>-{number:03d}"}
        lines.extend(f"{name}: {value}" for name, value in headers.items())
        lines.append("")
        lines.append(json.dumps(request.body, indent=2))
        lines.append("")
    return "\n".join(lines)
