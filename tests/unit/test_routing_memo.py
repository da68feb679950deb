"""Routing remembers what it worked out for a request target, and forgets in bounds.

The memo must give what the work gives (a target, a protocol, each
upstream's URL), never keep a rejected path, and never hold more than
``MEMO_ENTRIES`` entries however many targets clients send.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.policy import routing
from gateway.policy.routing import (
    MEMO_ENTRIES,
    MEMO_KEY_CHARS,
    PathRejected,
    Route,
    Target,
    request_target,
)
from gateway.settings import RouteConfig, Timeouts


def _route(upstream: str = "http://u.test/base?api-version=1", protocol: str = "auto") -> Route:
    config = RouteConfig(upstream=upstream, prefix="/v1", protocol=protocol)
    return Route(config, Timeouts())


_SEGMENT = st.text(alphabet="abcz09-_.;%2fFeE", max_size=8)
_PATHS = st.lists(_SEGMENT, max_size=5).map(lambda parts: "/v1/" + "/".join(parts))
_QUERIES = st.text(alphabet="ab=&;%2F?api-version", max_size=20)


@given(st.lists(st.tuples(_PATHS, _QUERIES), max_size=20))
def test_remembered_answers_are_the_work_s(targets: list[tuple[str, str]]) -> None:
    route = _route()
    (endpoint,) = route.endpoints
    for _ in range(2):  # the second pass reads the memo
        for path, query in targets:
            raw, q = path.encode(), query.encode()
            try:
                want = routing._request_target(route, path, raw, q)
            except PathRejected:
                with pytest.raises(PathRejected):
                    request_target(route, path, raw, q)
                assert (path, raw, q) not in route.targets
                continue
            got = request_target(route, path, raw, q)
            assert got == want
            assert endpoint.url_for(got) == endpoint._url_for(got)
            assert route.spec_for(got.rest) is routing.detect(got.rest)


def test_the_memos_stay_bounded() -> None:
    route = _route()
    (endpoint,) = route.endpoints
    for n in range(MEMO_ENTRIES * 2 + 7):
        path = f"/v1/chat/completions/{n}"
        target = request_target(route, path, path.encode(), b"")
        endpoint.url_for(target)
        route.spec_for(target.rest)
        assert len(route.targets) <= MEMO_ENTRIES
        assert len(endpoint.urls) <= MEMO_ENTRIES
        assert len(route.specs) <= MEMO_ENTRIES
    assert route.targets  # it did remember


def test_a_long_target_is_not_remembered() -> None:
    route = _route()
    (endpoint,) = route.endpoints
    path = "/v1/" + "a" * MEMO_KEY_CHARS
    target = request_target(route, path, path.encode(), b"q=1")
    assert target == Target(path[3:], "q=1")
    assert endpoint.url_for(target).startswith("http://u.test/base/aaa")
    route.spec_for(target.rest)
    assert not route.targets
    assert not endpoint.urls
    assert not route.specs


def test_the_same_path_with_another_query_or_raw_form_is_its_own_entry() -> None:
    route = _route()
    (endpoint,) = route.endpoints
    one = request_target(route, "/v1/x y", b"/v1/x%20y", b"a=1")
    two = request_target(route, "/v1/x y", b"/v1/x y", b"a=2&api-version=9")
    assert one == Target("/x%20y", "a=1")
    assert two == Target("/x y", "a=2&api-version=9")
    assert endpoint.url_for(one) == "http://u.test/base/x%20y?api-version=1&a=1"
    assert endpoint.url_for(two) == "http://u.test/base/x y?api-version=1&a=2"
