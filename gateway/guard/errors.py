"""The guard's exception hierarchy: budget violations raised by the decoder.

Every error carries a stable ``reason`` string from the outcome vocabulary
(docs/wire-contract.md, "Outcomes and reasons") so that the relay can turn it
into a verdict without a table.
"""

from __future__ import annotations

from typing import ClassVar


class GuardError(Exception):
    """Base class of everything the guard raises on bad input."""

    reason: ClassVar[str] = "invalid_shape"


class BudgetExceeded(GuardError):
    """A configured byte budget was exceeded; the stream cannot be verified further."""

    reason = "limit_exceeded"


class LineTooLong(BudgetExceeded):
    """A physical line of the event stream is longer than ``max_line_bytes``."""


class EventTooLarge(BudgetExceeded):
    """An event's data (or its block's raw bytes) exceeds ``max_event_bytes``."""
