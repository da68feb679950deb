"""Observation: what each finished request becomes (metrics and one access-log line).

The record and the observer list are light and imported at once; the access
log, the metrics (``prometheus_client``) and the tracing hooks load on first
use, so that a module which only fills a ``RequestRecord`` loads none of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gateway.observe.observers import Observer, Observers
from gateway.observe.record import Attempt, RequestRecord

if TYPE_CHECKING:
    from gateway.observe.accesslog import AccessLog
    from gateway.observe.hooks import TraceHook, TracingHook
    from gateway.observe.metrics import Metrics, ModelLabels

__all__ = [
    "AccessLog",
    "Attempt",
    "Metrics",
    "ModelLabels",
    "Observer",
    "Observers",
    "RequestRecord",
    "TraceHook",
    "TracingHook",
]

_LAZY = {
    "AccessLog": "gateway.observe.accesslog",
    "TraceHook": "gateway.observe.hooks",
    "TracingHook": "gateway.observe.hooks",
    "Metrics": "gateway.observe.metrics",
    "ModelLabels": "gateway.observe.metrics",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gateway.observe' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
