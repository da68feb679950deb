"""Observation: what each finished request becomes (metrics and one access-log line)."""

from gateway.observe.accesslog import AccessLog
from gateway.observe.hooks import TraceHook, TracingHook
from gateway.observe.metrics import Metrics, ModelLabels
from gateway.observe.observers import Observer, Observers
from gateway.observe.record import Attempt, RequestRecord

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
