"""``strip_hop_by_hop`` in one pass gives what the rule says, for any headers.

The reference is the rule written plainly (lower-case every name; drop the
hop-by-hop ones, those a ``Connection`` header names, and the caller's).
Every set of header names the gateway drops lives in ``gateway/proxy/headers.py``
(a protocol's own, such as the headers a signature replaces, in its spec).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.proxy.headers import FORWARDING_HEADERS, HOP_BY_HOP, strip_hop_by_hop


def _reference(headers: list[tuple[bytes, bytes]], also: frozenset[bytes]) -> list[object]:
    pairs = [(k.lower(), v) for k, v in headers]
    named: set[bytes] = set()
    for key, value in pairs:
        if key == b"connection":
            named.update(t.strip().lower() for t in value.split(b",") if t.strip())
    drop = HOP_BY_HOP | named | also
    return [(k, v) for k, v in pairs if k not in drop]


ROOT = Path(__file__).resolve().parents[2]

_NAMES = st.sampled_from(
    [*sorted(HOP_BY_HOP), *sorted(FORWARDING_HEADERS), b"Connection", b"X-Foo", b"x-foo", b"host"]
) | st.binary(min_size=1, max_size=6)
_CONNECTION_VALUES = st.lists(
    st.sampled_from([b"close", b"keep-alive", b" X-Foo ", b"x-bar", b"", b"Host"]), max_size=4
).map(b",".join)
_HEADERS = st.lists(
    st.tuples(_NAMES, st.binary(max_size=8) | _CONNECTION_VALUES)
    | st.tuples(st.just(b"connection"), _CONNECTION_VALUES),
    max_size=12,
)
_ALSO = st.sampled_from(
    [frozenset(), frozenset({b"host", b"content-length"}), FORWARDING_HEADERS | {b"x-bar"}]
)


@given(_HEADERS, _ALSO)
def test_one_pass_is_the_rule(headers: list[tuple[bytes, bytes]], also: frozenset[bytes]) -> None:
    assert strip_hop_by_hop(headers, also) == _reference(headers, also)


def _header_sets(path: Path) -> list[int]:
    """Lines of ``path`` holding a set of header names (lower-case bytes): a drop set."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Set) and any(
            isinstance(e, ast.Constant)
            and isinstance(e.value, bytes)
            and re.fullmatch(rb"[a-z0-9-]+", e.value)
            for e in node.elts
        ):
            found.append(node.lineno)
    return found


@pytest.mark.parametrize(
    "path",
    sorted(
        p
        for p in (ROOT / "gateway").rglob("*.py")
        # a protocol's own headers (a signature's) are its spec's; the simulator stands apart
        if not {"simulator", "protocols"} & set(p.parts) and p != ROOT / "gateway/proxy/headers.py"
    ),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_header_dropping_set_is_in_the_headers_module(path: Path) -> None:
    assert not _header_sets(path), f"{path.name} holds a header set at {_header_sets(path)}"


def test_the_header_set_scan_sees_one() -> None:
    assert _header_sets(ROOT / "gateway/proxy/headers.py")
