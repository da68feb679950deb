"""Parsing JSON fast without changing what is accepted: orjson first, the standard library after.

orjson parses an LLM event several times faster than ``json.loads``, but it
refuses a few inputs the standard library takes: ``NaN``/``Infinity``,
integers beyond 64 bits, lone surrogate escapes, nesting deeper than 1,024.
``loads`` hands whatever orjson refuses to ``json.loads``, so the result,
and the errors (``ValueError``, ``RecursionError``), are exactly the
standard library's; only what orjson accepts takes the fast path (and only a document under 1 MiB:
orjson sets aside about 13 times a document's length before it parses it).

One difference remains, by orjson's design: an integer beyond 64 bits comes
back as a float. No count, index or sequence number of a real stream is that
large; the contracts then see "not an integer", never a crash.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["loads"]

_fast = orjson.loads


#: Documents with more brackets than this may nest deeper than ``json.loads`` goes
#: (Python's recursion limit, 1,000 by default): they go to ``json.loads`` itself, which
#: raises ``RecursionError`` where it always did; orjson would parse up to 1,024 deep.
_MAX_FAST_BRACKETS = 500

#: Documents longer than this go to ``json.loads`` too: orjson sets aside about 13
#: times a document's length before it parses it (an 8 MiB event: 104 MiB), where
#: ``json.loads`` needs little beyond the values it returns. Events this large are
#: rare, and a worker's memory is budgeted by them (docs/deployment.md, "Memory").
_MAX_FAST_BYTES = 1024 * 1024


def loads(data: str | bytes) -> Any:
    """``json.loads(data)``, through orjson whenever orjson accepts ``data``."""
    if isinstance(data, str):
        brackets = data.count("{") + data.count("[")
    else:
        brackets = data.count(b"{") + data.count(b"[")
    if brackets > _MAX_FAST_BRACKETS or len(data) > _MAX_FAST_BYTES:
        return json.loads(data)
    try:
        return _fast(data)
    except orjson.JSONDecodeError:
        return json.loads(data)
