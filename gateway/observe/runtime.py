"""The process's own metrics: prometheus-client's ``process_*`` and ``python_*`` collectors.

They live on a registry of their own (``runtime_registry``), apart from the
gateway's metrics, and are appended to ``/metrics``. With one process they
describe it. With several workers (multiprocess mode) each scrape reaches one
worker, so ``WorkerProcesses`` reads every live worker's ``/proc`` entry
instead: each ``process_*`` sample carries a ``pid`` label (one per worker
alive now, so bounded by ``workers``), the workers being the processes that
own files in the multiprocess directory. ``python_*`` (the interpreter's GC
and version) is the answering worker's in both modes.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

__all__ = ["WorkerProcesses", "alive", "runtime_registry"]

_PID_FILE = re.compile(r"_(\d+)\.db\Z")


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (one of another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WorkerProcesses(Collector):
    """``process_*`` of every live worker whose metric files are in ``directory``."""

    def __init__(self, directory: str, proc: str = "/proc") -> None:
        self._directory = Path(directory)
        self._proc = proc

    def pids(self) -> list[int]:
        found = {
            int(match.group(1))
            for path in self._directory.glob("*.db")
            if (match := _PID_FILE.search(path.name))
        }
        return sorted(pid for pid in found if alive(pid))

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for pid in self.pids():
            collector = ProcessCollector(
                pid=functools.partial(int, pid), proc=self._proc, registry=None
            )
            for family in collector.collect():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                for sample in family.samples:
                    merged.add_sample(sample.name, {**sample.labels, "pid": str(pid)}, sample.value)
        yield from families.values()


def runtime_registry(multiprocess_dir: str | None) -> CollectorRegistry:
    """A registry of the process collectors (per worker when ``multiprocess_dir`` is set)."""
    registry = CollectorRegistry(auto_describe=True)
    if multiprocess_dir:
        registry.register(WorkerProcesses(multiprocess_dir))
    else:
        ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry
