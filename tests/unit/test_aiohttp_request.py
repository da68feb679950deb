"""Pins what the upstream transport's ``_Request`` relies on in aiohttp's ClientRequest.

``_Request.update_auto_headers`` sets a prebuilt skip set and adds nothing:
right only while every header aiohttp would add there is skipped, and while
aiohttp keeps that set in ``_skip_auto_headers`` built as below.
"""

from __future__ import annotations

from types import SimpleNamespace

import aiohttp
from aiohttp import hdrs
from multidict import CIMultiDict, istr

from gateway.proxy.upstream import _SKIPPED, SKIPPED_AUTO_HEADERS, _Request


def test_every_header_aiohttp_adds_by_itself_is_skipped() -> None:
    skipped = {h.lower() for h in SKIPPED_AUTO_HEADERS}
    assert {h.lower() for h in aiohttp.ClientRequest.DEFAULT_HEADERS} <= skipped
    assert hdrs.USER_AGENT.lower() in skipped


def test_aiohttp_own_update_gives_the_prebuilt_set_and_adds_nothing() -> None:
    headers = CIMultiDict([("Host", "h"), ("content-type", "application/json"), ("x-a", "1")])
    theirs = SimpleNamespace(
        headers=headers.copy(), DEFAULT_HEADERS=aiohttp.ClientRequest.DEFAULT_HEADERS
    )
    session_skip = frozenset(istr(h) for h in SKIPPED_AUTO_HEADERS)  # as ClientSession keeps it
    aiohttp.ClientRequest.update_auto_headers(theirs, session_skip)  # type: ignore[arg-type]
    assert list(theirs.headers.items()) == list(headers.items())
    assert list(theirs._skip_auto_headers.items()) == list(_SKIPPED.items())

    ours = SimpleNamespace(headers=headers.copy())
    _Request.update_auto_headers(ours, session_skip)  # type: ignore[arg-type]
    assert list(ours.headers.items()) == list(headers.items())
    assert ours._skip_auto_headers is _SKIPPED


def test_the_private_field_is_still_there() -> None:
    assert "_skip_auto_headers" in aiohttp.ClientRequest.__annotations__
    assert aiohttp.ClientRequest.skip_auto_headers.fget is not None  # type: ignore[attr-defined]
