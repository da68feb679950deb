"""A metrics table: each metric one row (name, kind, help, labels), built by one loop.

A class lists its metrics as class attributes, ``requests = Declared("gateway_
requests_total", Counter, "help", ("route", ...))``, in the order they are
exposed; ``build(instance, registry, bounds)`` makes each row's metric on the
registry and puts it on the instance under the row's attribute name. A row is
a non-data descriptor, so once built the instance's own attribute is read
directly (no call on the hot path), and mypy reads its type from the kind.

A Gauge's row may name its multiprocess mode (``livesum``, ``mostrecent``, ...);
a Histogram's names its buckets as a function of the request bounds (the
longest a request and a first byte may take), so buckets follow the deadlines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar, overload

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Bounds", "Declared", "build", "rows"]

M = TypeVar("M", Counter, Gauge, Histogram)


class Bounds(NamedTuple):
    """How long a request, and its first byte, may take (seconds): the buckets' reach."""

    request: float = 3600.0
    first_byte: float = 300.0


@dataclass(frozen=True)
class Declared(Generic[M]):
    """One metric: its exposed name, kind, help and label names."""

    name: str
    kind: type[M]
    help: str
    labels: tuple[str, ...] = ()
    #: A Gauge's ``multiprocess_mode`` (prometheus-client's default, ``all``, when None).
    mode: str | None = None
    #: A Histogram's bucket bounds, from the request bounds.
    buckets: Callable[[Bounds], Sequence[float]] | None = None
    attr: str = field(default="", init=False)

    def __set_name__(self, owner: type, attr: str) -> None:
        object.__setattr__(self, "attr", attr)

    @overload
    def __get__(self, instance: None, owner: type) -> Declared[M]: ...
    @overload
    def __get__(self, instance: object, owner: type) -> M: ...
    def __get__(self, instance: object | None, owner: type) -> Declared[M] | M:
        if instance is None:
            return self
        raise AttributeError(f"{self.attr} ({self.name}) is not built yet")

    def make(self, registry: CollectorRegistry, bounds: Bounds) -> M:
        options: dict[str, Any] = {"registry": registry}
        if self.mode is not None:
            options["multiprocess_mode"] = self.mode
        if self.buckets is not None:
            options["buckets"] = self.buckets(bounds)
        return self.kind(self.name, self.help, self.labels, **options)


def rows(owner: type) -> list[Declared[Any]]:
    """The rows a class declares, in declaration order (its bases' first)."""
    found: dict[str, Declared[Any]] = {}
    for cls in reversed(owner.__mro__):
        found |= {k: v for k, v in vars(cls).items() if isinstance(v, Declared)}
    return list(found.values())


DEFAULT_BOUNDS = Bounds()


def build(instance: object, registry: CollectorRegistry, bounds: Bounds = DEFAULT_BOUNDS) -> None:
    """Make every row of ``instance``'s class on ``registry``, as its attributes."""
    for row in rows(type(instance)):
        instance.__dict__[row.attr] = row.make(registry, bounds)
