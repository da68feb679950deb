"""Forwarding headers: what the upstream is told and who the access log names."""

from __future__ import annotations

import pytest

from gateway.proxy.headers import Forwarding

XFF = b"x-forwarded-for"


def _xff(*values: str) -> list[tuple[bytes, bytes]]:
    return [(XFF, v.encode()) for v in values]


@pytest.mark.parametrize(
    ("trusted", "headers", "peer", "client"),
    [
        ([], _xff("1.1.1.1"), "10.0.0.5", "10.0.0.5"),
        (["10.0.0.0/8"], _xff("1.1.1.1"), "10.0.0.5", "1.1.1.1"),
        # read from the right, past every trusted hop
        (["10.0.0.0/8"], _xff("6.6.6.6, 1.1.1.1, 10.0.0.9"), "10.0.0.5", "1.1.1.1"),
        # several header lines are one list, in order
        (["10.0.0.0/8"], _xff("6.6.6.6", "1.1.1.1, 10.0.0.9"), "10.0.0.5", "1.1.1.1"),
        # every entry trusted: the leftmost
        (["10.0.0.0/8"], _xff("10.1.1.1, 10.2.2.2"), "10.0.0.5", "10.1.1.1"),
        # no header from a trusted proxy: the proxy itself
        (["10.0.0.0/8"], [], "10.0.0.5", "10.0.0.5"),
        # ports and brackets, as some proxies write them
        (["10.0.0.0/8"], _xff("[2001:db8::1]:443, 10.0.0.9"), "10.0.0.5", "2001:db8::1"),
        (["10.0.0.0/8"], _xff("192.0.2.3:8080"), "10.0.0.5", "192.0.2.3"),
        (["::1/128"], _xff("2001:db8::7"), "::1", "2001:db8::7"),
        # an entry that is no address ends the walk; it is logged cut short
        (["10.0.0.0/8"], _xff("1.1.1.1, " + "x" * 300), "10.0.0.5", "x" * 64),
        (["10.0.0.0/8"], _xff("1.1.1.1, , 10.0.0.9"), "10.0.0.5", "1.1.1.1"),
        ([], [], None, None),
    ],
)
def test_the_client_is_the_first_untrusted_address_from_the_right(
    trusted: list[str], headers: list[tuple[bytes, bytes]], peer: str | None, client: str | None
) -> None:
    assert Forwarding(trusted).client(headers, peer) == client


def test_headers_for_the_upstream() -> None:
    sent = [
        *_xff("6.6.6.6", "1.1.1.1"),
        (b"x-forwarded-proto", b"https"),
        (b"forwarded", b"for=6.6.6.6"),
        (b"x-real-ip", b"6.6.6.6"),
    ]
    untrusted = dict(Forwarding([]).headers(sent, "10.0.0.5", "http"))
    assert untrusted == {XFF: b"6.6.6.6, 1.1.1.1, 10.0.0.5", b"x-forwarded-proto": b"http"}
    trusted = Forwarding(["10.0.0.0/8"]).headers(sent, "10.0.0.5", "http")
    assert trusted == [
        (XFF, b"6.6.6.6, 1.1.1.1, 10.0.0.5"),
        (b"x-forwarded-proto", b"https"),
        (b"forwarded", b"for=6.6.6.6"),
        (b"x-real-ip", b"6.6.6.6"),
    ]
    # a trusted proxy that says nothing about the scheme: the real one
    assert dict(Forwarding(["10.0.0.0/8"]).headers([], "10.0.0.5", "https")) == {
        XFF: b"10.0.0.5",
        b"x-forwarded-proto": b"https",
    }
