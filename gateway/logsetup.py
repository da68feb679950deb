"""The process's own log lines: timestamped, as text or JSON, at the configured ``log_level``.

``gateway serve`` calls it, and so does every worker process (``--workers N``):
uvicorn starts workers as fresh interpreters, which keep none of the parent's
logging set-up. uvicorn's own loggers (``uvicorn.error``: start-up, shutdown)
get the same format through ``uvicorn_log_config``, so every line on stderr
starts with the same UTC timestamp (RFC 3339, milliseconds, the access log's
``time``). With ``log_format = "json"`` each line is one JSON object
(``time``, ``level``, ``logger``, ``message``, and ``exception`` when there
is one), so both streams ship the same way. The access log is not logging:
it writes its JSON lines to stdout itself.
"""

from __future__ import annotations

import functools
import json
import logging
import logging.config
import time
from typing import Any

__all__ = ["LogGate", "configure_logging", "utc_timestamp", "uvicorn_log_config"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LogGate:
    """Open at most once every ``interval`` seconds: for a warning that input from
    outside (or a failing backend) could otherwise repeat on every request."""

    __slots__ = ("_interval", "_last")

    def __init__(self, interval: float = 60.0) -> None:
        self._interval = interval
        self._last = float("-inf")

    def open(self) -> bool:
        now = time.monotonic()
        if now - self._last < self._interval:
            return False
        self._last = now
        return True


def utc_timestamp(seconds: float) -> str:
    """``seconds`` (a ``time.time()``) as RFC 3339 in UTC with milliseconds."""
    whole = int(seconds)
    millis = int((seconds - whole) * 1000)
    return _utc_second(whole) + f".{millis:03d}Z"


@functools.lru_cache(maxsize=4)
def _utc_second(whole: int) -> str:
    """The date and time of one second: formatted once, not once a log line (~2 µs)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT`` with the timestamp in UTC, RFC 3339."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return utc_timestamp(record.created)


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": utc_timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=True)


def uvicorn_log_config(level: str, log_format: str = "text") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for the gateway's and uvicorn's loggers."""
    formatter = JsonFormatter if log_format == "json" else TextFormatter
    handler = {"class": "logging.StreamHandler", "formatter": "gateway"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"gateway": {"()": f"{__name__}.{formatter.__name__}"}},
        "handlers": {"stderr": handler | {"stream": "ext://sys.stderr"}},
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {
            # uvicorn's own: through the root's handler, so one format for all
            "uvicorn": {"handlers": [], "level": level.upper(), "propagate": True},
            "uvicorn.error": {"handlers": [], "level": level.upper(), "propagate": True},
            "uvicorn.access": {"handlers": [], "level": "INFO", "propagate": True},
            # httpx logs every request at INFO: the access log already has one per request
            "httpx": {"level": "WARNING"},
        },
    }


def configure_logging(level: str, log_format: str = "text") -> None:
    """``level`` is a ``log_level`` value (``debug``, ``info``, ``warning``, ``error``)."""
    logging.config.dictConfig(uvicorn_log_config(level, log_format))
