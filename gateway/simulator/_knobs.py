"""Per-request control knobs: ``x-sim-*`` request headers or a ``"sim"`` body object.

Headers win over the body object, so a test can override a knob without
rewriting the request body. Every value is validated; a bad value is a 400
(:class:`KnobError`) that names the knob, never a silently ignored setting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

__all__ = [
    "DEFAULT_HUGE_EVENT_BYTES",
    "DEFAULT_STALL_SECONDS",
    "FAULTS",
    "SHAPES",
    "KnobError",
    "Knobs",
    "knob_header",
    "read_knobs",
]

#: Every fault the simulator can script. ``none`` is a complete, well-formed stream.
FAULTS: Final[tuple[str, ...]] = (
    "none",
    "length",
    "content_filter",
    "tool_calls",
    "choices_2",
    "drop_before_done",
    "drop_after_text",
    "drop_mid_event",
    "drop_mid_utf8",
    "done_without_finish",
    "abort_mid_body",
    "error_event",
    "invalid_json",
    "invalid_shape",
    "content_after_finish",
    "invalid_tool_arguments",
    "stall_before_headers",
    "stall_mid_stream",
    "heartbeats_forever",
    "status",
    "huge_event",
    "done_after_cut",
)

#: Structured answers (``x-sim-structured``): ``valid`` is the document of
#: ``gateway.simulator.STRUCTURED_SCHEMA``; each other shape breaks it one way (the
#: last two in a tool call: its arguments, or the tool's name).
SHAPES: Final[tuple[str, ...]] = (
    "valid",
    "wrong_type",
    "forbidden_member",
    "enum",
    "missing_required",
    "prose_first",
    "cut_mid_object",
    "tool_off_schema",
    "undeclared_tool",
)

DEFAULT_STALL_SECONDS: Final = 3600.0
#: Size of the ``huge_event`` data line when ``x-sim-chunk-bytes`` is not given:
#: twice the guard's default 16 MiB event budget.
DEFAULT_HUGE_EVENT_BYTES: Final = 32 * 1024 * 1024

_MAX_TOKENS: Final = 50_000_000
_MAX_CHUNK_BYTES: Final = 512 * 1024 * 1024
_MAX_STALL_SECONDS: Final = 7 * 24 * 3600.0
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off", ""})
_N = TypeVar("_N", int, float)


class KnobError(ValueError):
    """A control knob has an invalid value; the simulator answers 400."""


@dataclass(frozen=True, slots=True)
class Knobs:
    """The resolved control knobs of one request."""

    fault: str = "none"
    tokens: int = 20
    tps: float = 0.0
    seed: int = 0
    partition: bool = False
    crlf: bool = False
    chunk_bytes: int = 0
    stall_seconds: float = DEFAULT_STALL_SECONDS
    status: int = 500
    #: Every third delta starts with a lone surrogate (``x-sim-surrogate: 1``).
    surrogate: bool = False
    #: A structured answer of this shape (``SHAPES``), "" for the usual text.
    structured: str = ""


def knob_header(name: str) -> str:
    """The request header of a :class:`Knobs` field: ``chunk_bytes`` -> ``x-sim-chunk-bytes``."""
    return "x-sim-" + name.replace("_", "-")


def _pick(headers: Mapping[str, str], sim: Mapping[str, Any], name: str) -> object:
    header = knob_header(name)
    if header in headers:
        return headers[header]
    return sim.get(name)


def _as_int(name: str, raw: object, low: int, high: int) -> int:
    return _as_number(name, raw, int, low, high)


def _as_float(name: str, raw: object, low: float, high: float) -> float:
    return _as_number(name, raw, float, low, high)


def _as_number(name: str, raw: object, kind: type[_N], low: _N, high: _N) -> _N:
    """A knob's number of ``kind`` (a float knob takes an integer too, never a bool),
    from JSON or a header's text, within ``low`` and ``high``."""
    what = "an integer" if kind is int else "a number"
    if isinstance(raw, str):
        try:
            value = kind(raw.strip())
        except ValueError:
            raise KnobError(f"sim knob {name!r} must be {what}, got {raw!r}") from None
    elif isinstance(raw, (int, kind)) and not isinstance(raw, bool):
        value = kind(raw)
    else:
        raise KnobError(f"sim knob {name!r} must be {what}")
    if (isinstance(value, float) and math.isnan(value)) or not low <= value <= high:
        raise KnobError(f"sim knob {name!r} must be between {low} and {high}, got {value}")
    return value


def _as_bool(name: str, raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise KnobError(f"sim knob {name!r} must be 1 or 0, got {raw!r}")


def read_knobs(
    headers: Mapping[str, str],
    body: object,
    *,
    default_tps: float,
    default_tokens: int,
    default_fault: str = "none",
    default_status: int = 500,
    default_seed: int = 0,
    default_structured: str = "",
) -> Knobs:
    """Resolve the knobs of one request from its (lower-case) headers and JSON body;
    a knob the request does not set takes the simulator's default."""
    sim_raw = body.get("sim") if isinstance(body, dict) else None
    if sim_raw is not None and not isinstance(sim_raw, dict):
        raise KnobError('body field "sim" must be an object')
    sim: Mapping[str, Any] = sim_raw or {}

    fault_raw = _pick(headers, sim, "fault")
    fault = default_fault if fault_raw is None else str(fault_raw).strip().lower() or "none"
    if fault not in FAULTS:
        raise KnobError(f"unknown sim fault {fault!r}; known faults: {', '.join(FAULTS)}")

    raw = _pick(headers, sim, "tokens")
    tokens = default_tokens if raw is None else _as_int("tokens", raw, 0, _MAX_TOKENS)
    raw = _pick(headers, sim, "tps")
    tps = default_tps if raw is None else _as_float("tps", raw, 0.0, 1e9)
    raw = _pick(headers, sim, "seed")
    seed = default_seed if raw is None else _as_int("seed", raw, -(2**63), 2**63 - 1)

    raw = _pick(headers, sim, "partition")
    text = "" if raw is None else str(raw).strip().lower()
    if text not in ("", "none", "random"):
        raise KnobError(f"sim knob 'partition' must be 'random' or 'none', got {raw!r}")
    partition = text == "random"

    raw = _pick(headers, sim, "crlf")
    crlf = False if raw is None else _as_bool("crlf", raw)
    raw = _pick(headers, sim, "chunk_bytes")
    chunk_bytes = 0 if raw is None else _as_int("chunk_bytes", raw, 0, _MAX_CHUNK_BYTES)
    raw = _pick(headers, sim, "stall_seconds")
    stall = (
        DEFAULT_STALL_SECONDS
        if raw is None
        else _as_float("stall_seconds", raw, 0.0, _MAX_STALL_SECONDS)
    )
    raw = _pick(headers, sim, "status")
    status = default_status if raw is None else _as_int("status", raw, 300, 599)
    raw = _pick(headers, sim, "surrogate")
    surrogate = False if raw is None else _as_bool("surrogate", raw)
    raw = _pick(headers, sim, "structured")
    structured = default_structured if raw is None else str(raw).strip().lower()
    if structured and structured not in SHAPES:
        raise KnobError(f"unknown sim shape {structured!r}; known shapes: {', '.join(SHAPES)}")

    return Knobs(
        fault=fault,
        tokens=tokens,
        tps=tps,
        seed=seed,
        partition=partition,
        crlf=crlf,
        chunk_bytes=chunk_bytes,
        stall_seconds=stall,
        status=status,
        surrogate=surrogate,
        structured=structured,
    )
