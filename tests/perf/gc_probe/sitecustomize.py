"""The cyclic garbage collector's share of a process's CPU, written when it exits.

Put this directory on a gateway's ``PYTHONPATH`` and name a file in ``GC_PROBE_OUT``;
at exit the process appends one line there: its label (``GC_PROBE_LABEL``), the
collections of each generation, the seconds they took, and the process's CPU seconds.
Used with ``ab_gateway.py``'s ``--a-env`` and ``--b-env`` (docs/performance.md)::

    .venv/bin/python tests/perf/ab_features.py --rounds 1 \\
        --a-env PYTHONPATH=tests/perf/gc_probe --a-env GC_PROBE_OUT=/tmp/gc.txt \\
        --a-env GC_PROBE_LABEL=A --b-env PYTHONPATH=tests/perf/gc_probe \\
        --b-env GC_PROBE_OUT=/tmp/gc.txt --b-env GC_PROBE_LABEL=B

Any other process with this on its path (and no ``GC_PROBE_OUT``) is left alone.
"""

from __future__ import annotations

import atexit
import gc
import os
import time
from typing import Any

_OUT = os.environ.get("GC_PROBE_OUT")
_started: dict[int, float] = {}
_seconds = [0.0, 0.0, 0.0]
_counts = [0, 0, 0]


def _timed(phase: str, info: dict[str, Any]) -> None:
    generation = info["generation"]
    if phase == "start":
        _started[generation] = time.perf_counter()
    elif generation in _started:
        _seconds[generation] += time.perf_counter() - _started.pop(generation)
        _counts[generation] += 1


def _write() -> None:
    assert _OUT is not None
    cpu = time.process_time()
    label = os.environ.get("GC_PROBE_LABEL", str(os.getpid()))
    spent = sum(_seconds)
    with open(_OUT, "a", encoding="utf-8") as out:
        out.write(
            f"{label}: collections {_counts}, seconds {[round(s, 3) for s in _seconds]}, "
            f"{spent:.2f} s of {cpu:.2f} s CPU ({100 * spent / cpu:.1f} %)\n"
        )


if _OUT:
    gc.callbacks.append(_timed)
    atexit.register(_write)
