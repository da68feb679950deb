"""A built-in OpenAI/Anthropic/Gemini-compatible fake provider with scripted faults.

It stands in for a remote provider, so it imports nothing from the rest of
the ``gateway`` package. Per-request control comes from ``x-sim-*`` request
headers (or a ``"sim"`` body object); see docs/simulator.md.

Public surface::

    create_simulator_app(*, default_tps=0, default_tokens=20,
                         default_fault="none", default_status=500) -> Starlette
    serve(host, port, **kw)                       # blocking
    await start_in_background(host, port, **kw)   # -> RunningSimulator (.port, .stop())
    FAULTS, expected_text(), tool_arguments()     # for tests
    SHAPES, STRUCTURED_SCHEMA, structured_answer()  # structured answers (x-sim-structured)
    UNKNOWN_MODEL                                 # model names starting so get a 404
"""

from gateway.simulator._app import UNKNOWN_MODEL, create_simulator_app
from gateway.simulator._knobs import FAULTS, SHAPES, KnobError, Knobs
from gateway.simulator._records import RecordStore, RequestRecord
from gateway.simulator._server import RunningSimulator, serve, start_in_background
from gateway.simulator._text import (
    STRUCTURED_SCHEMA,
    expected_text,
    structured_answer,
    tool_arguments,
)

__all__ = [
    "FAULTS",
    "SHAPES",
    "STRUCTURED_SCHEMA",
    "UNKNOWN_MODEL",
    "KnobError",
    "Knobs",
    "RecordStore",
    "RequestRecord",
    "RunningSimulator",
    "create_simulator_app",
    "expected_text",
    "serve",
    "start_in_background",
    "structured_answer",
    "tool_arguments",
]
