"""The aiohttp path sends the head httpx would have built, without building an httpx.Request.

``httpx_head`` is held to ``httpx.Request(...).headers.raw`` over generated
requests of the shape the relay makes (lowercase names, no Host,
Content-Length or Transfer-Encoding): the same names, values and order.
"""

from __future__ import annotations

import httpx
from hypothesis import given
from hypothesis import strategies as st

from gateway.proxy.upstream import UpstreamRequest, httpx_head

_TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.!#$%&'*+^`|~", min_size=1)
_NAMES = _TOKEN.filter(lambda n: n not in ("host", "content-length", "transfer-encoding"))
_VALUES = st.binary(max_size=40).map(
    lambda b: bytes(c for c in b if c == 9 or 32 <= c < 127 or c >= 128)
)
_HEADERS = st.lists(st.tuples(_NAMES.map(str.encode), _VALUES), max_size=12)
_ORIGINS = st.sampled_from(
    [
        "http://127.0.0.1:8080",
        "https://api.example.com",
        "http://Example.COM:80",
        "https://h.example:443",
        "http://[::1]:9000",
        "http://localhost",
    ]
)
_METHODS = st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])


@given(_METHODS, _ORIGINS, _HEADERS, st.binary(max_size=64))
def test_the_head_is_httpx_own(
    method: str, origin: str, headers: list[tuple[bytes, bytes]], content: bytes
) -> None:
    request = httpx.Request(method, origin, headers=headers, content=content)
    want = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
    assert httpx_head(method, origin, headers, content) == want


@given(_METHODS, _ORIGINS, _HEADERS, st.binary(max_size=64))
def test_to_httpx_is_the_same_request(
    method: str, origin: str, headers: list[tuple[bytes, bytes]], content: bytes
) -> None:
    request = UpstreamRequest(method, origin, b"/v1/x%2Fy?q=1", headers, content, 2.5)
    built = request.to_httpx()
    want = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in built.headers.raw]
    assert httpx_head(method, origin, headers, content) == want
    assert built.extensions == {
        "timeout": {"connect": 2.5, "pool": 2.5},
        "target": b"/v1/x%2Fy?q=1",
    }
    assert built.content == content
