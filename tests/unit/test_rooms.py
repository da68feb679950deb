"""The package's rooms are stacked: no import runs from a lower room up to one that
builds on it.

``ROOMS`` is the stack, lowest first: a room may import itself and any room below
it, never one above (imports inside functions and under ``TYPE_CHECKING`` count:
the graph is read from the source, ``tests/unit/test_layout.py``). The relay
(``proxy``) sits below the features it runs as stages (``resume``, ``cache``,
``spend``, ``keys``), which the app lists, and below the log design the cache and
resume share (``streamlog``); ``money`` (prices, charges) is below the limits and
the observers that use its types; ``observe`` is below ``capture``.
"""

from __future__ import annotations

from tests.unit.test_layout import GRAPH

ROOMS = (
    "guard",
    "schema",
    "simulator",
    "redisconn",
    "gateway",  # the package itself (its version)
    "protocols",
    "settings",
    "redaction",
    "logsetup",
    "lifecycle",
    "policy",
    "money",
    "observe",
    "capture",
    "store",
    "limits",
    "proxy",
    "server",
    "streamlog",
    "resume",
    "cache",
    "spend",
    "keys",
    "app",
    "probe",
    "cli",
    "__main__",
)


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _upward() -> set[tuple[str, str]]:
    rank = {room: i for i, room in enumerate(ROOMS)}
    found = set()
    for module, imported in GRAPH.items():
        for target in imported:
            low, high = _room(module), _room(target)
            if low != high and rank[low] < rank[high]:
                found.add((low, high))
    return found


def test_every_room_is_in_the_stack() -> None:
    rooms = {_room(module) for module in GRAPH}
    assert rooms <= set(ROOMS), rooms - set(ROOMS)


def test_no_import_runs_up_the_stack() -> None:
    """A lower room that needs a higher one's object is handed it by the app (the
    composition root), typed by a protocol of its own (``proxy/pricing.py:Receipts``,
    ``proxy/admission.py:IssuedKeys``), or the shared name moves down."""
    assert not _upward()


def test_the_relay_imports_nothing_of_resume_or_the_cache() -> None:
    """proxy/ runs them as stages the app lists: it never names them."""
    proxy = {target for module, imported in GRAPH.items() if _room(module) == "proxy"
             for target in imported}  # fmt: skip
    assert not {_room(target) for target in proxy} & {"resume", "cache"}
