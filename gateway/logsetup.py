"""The process's own log lines: one plain format, at the configured ``log_level``.

``gateway serve`` calls it, and so does every worker process (``--workers N``):
uvicorn starts workers as fresh interpreters, which keep none of the parent's
logging set-up. The access log is not logging: it writes its JSON lines itself.
"""

from __future__ import annotations

import logging


def configure_logging(level: str) -> None:
    """``level`` is a ``log_level`` value (``debug``, ``info``, ``warning``, ``error``)."""
    logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO: the access log already has one line per request
    logging.getLogger("httpx").setLevel(logging.WARNING)
