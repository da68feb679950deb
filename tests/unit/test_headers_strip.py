"""``strip_hop_by_hop`` in one pass gives what the rule says, for any headers.

The reference is the rule written plainly (lower-case every name; drop the
hop-by-hop ones, those a ``Connection`` header names, and the caller's).
"""

from __future__ import annotations

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
