"""Captures: redacted recordings of what an upstream sent, and replaying them.

A route with ``capture`` set taps its streams (``tap``); the capture writer,
an observer of finished requests, redacts and writes them (``writer``,
``redact``, ``fileformat``); ``replay`` feeds one back through the guard.
"""

from gateway.capture.fileformat import SUFFIX, Capture, CaptureError, dumps, load, loads
from gateway.capture.redact import Redactor, redact_stream
from gateway.capture.replay import Replayed, replay
from gateway.capture.tap import Tap

__all__ = [
    "SUFFIX",
    "Capture",
    "CaptureError",
    "Redactor",
    "Replayed",
    "Tap",
    "dumps",
    "load",
    "loads",
    "redact_stream",
    "replay",
]
