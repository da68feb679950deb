"""A cache key, and what a request says about the cache: pure, no I/O.

The key is SHA-256 over everything that can change an answer (issue 36): the
protocol, the route, the route's upstream pool with the model each upstream
would be asked for (after its ``models`` map), the request's method and target,
the client's body as canonical JSON (keys sorted, no whitespace: two bodies
that differ only in spelling share a key; the gateway's own additions, such
as an injected ``stream_options``, are made after the key and never in it),
the stream flag, the scope (a client's identity, or ``route``), the route's
``cache_namespace`` and the headers the protocol names as answer-changing
(``ProtocolSpec.answer_headers``). Each part is length-prefixed, so that no two
different part lists hash the same bytes.

The canonical form keeps every JSON number exactly (issue 45): integers of any
size as integers, a fraction or exponent as itself (``1e400`` and ``1e500``
differ, as do ``0.1`` and ``0.10000000000000000001``, and ``15`` and
``15.0``); only spellings of one value share a key (``0.5``, ``5E-1``).

A body that is not a JSON object has no key, nor one with a duplicate member
name in any object (the key could read one value, the upstream another): it
is never cached.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = ["Controls", "body_digest", "controls_of", "key_of"]

_BOM = b"\xef\xbb\xbf"
_MAX_AGE = re.compile(r"max-age\s*=\s*\"?(\d{1,10})\"?")


class _Inexact(Exception):
    """A number a float would not carry exactly: the document takes the exact way."""


class _Duplicate(Exception):
    """An object names a member twice: the body has no key."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise _Duplicate
    return doc


def _float(text: str) -> float:
    """A fraction or exponent as a float when the float's shortest form is the same
    number; ``_Inexact`` otherwise (``1e400``, ``0.10000000000000000001``)."""
    value = float(text)
    if not math.isfinite(value) or Decimal(repr(value)) != Decimal(text):
        raise _Inexact
    return value


def _exact(value: Any, out: list[str]) -> None:
    """``value`` (parsed with ``Decimal`` fractions) as canonical JSON text: keys sorted,
    a fraction as its normalized decimal with an ``E`` exponent, which neither an
    integer nor a float's ``repr`` is ever written with; text ASCII-escaped."""
    if isinstance(value, dict):
        out.append("{")
        for index, key in enumerate(sorted(value)):
            out.append("," if index else "")
            out.append(json.dumps(key))
            out.append(":")
            _exact(value[key], out)
        out.append("}")
    elif isinstance(value, list):
        out.append("[")
        for index, item in enumerate(value):
            out.append("," if index else "")
            _exact(item, out)
        out.append("]")
    elif isinstance(value, Decimal):
        out.append(f"{value.normalize():E}")
    else:
        out.append(json.dumps(value))


def body_digest(body: bytes) -> str | None:
    """SHA-256 of a JSON object body as canonical JSON; None when it is not one, or when
    an object in it names a member twice.

    Run off the loop for a large body (``BodyParser.run``): parsing holds the
    interpreter for as long as it takes."""
    if body[:3] == _BOM:
        body = body[3:]
    try:
        try:
            doc = json.loads(body, object_pairs_hook=_unique, parse_float=_float)
        except _Inexact:
            doc = json.loads(body, object_pairs_hook=_unique, parse_float=Decimal)
            if not isinstance(doc, dict):
                return None
            out: list[str] = []
            _exact(doc, out)
            return hashlib.sha256("".join(out).encode()).hexdigest()
    except (ValueError, RecursionError, _Duplicate):
        return None
    if not isinstance(doc, dict):
        return None
    try:
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        data = text.encode()
    except UnicodeEncodeError:  # a lone surrogate: only an escape carries it
        data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest()


def key_of(parts: Iterable[str]) -> str:
    """The key (64 hex digits) of a list of parts, each length-prefixed."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        digest.update(b"%d:" % len(data))
        digest.update(data)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class Controls:
    """What a request asks of the cache (``Cache-Control``, ``X-Gateway-Cache``)."""

    #: ``X-Gateway-Cache: off``: neither read nor stored.
    off: bool = False
    #: ``no-store``: the answer is not stored (an entry may still be read).
    no_store: bool = False
    #: ``no-cache``: no entry is read (the answer may be stored).
    no_cache: bool = False
    #: ``max-age=N``: only an entry younger than N seconds.
    max_age: int | None = None

    @property
    def reads(self) -> bool:
        return not (self.off or self.no_cache)

    @property
    def stores(self) -> bool:
        return not (self.off or self.no_store)


NONE = Controls()


def controls_of(cache_control: bytes | None, gateway_cache: bytes | None) -> Controls:
    """The controls of a request's ``Cache-Control`` and ``X-Gateway-Cache`` headers."""
    if cache_control is None and gateway_cache is None:
        return NONE
    off = gateway_cache is not None and gateway_cache.strip().lower() == b"off"
    text = (cache_control or b"").decode("latin-1").lower()
    directives = {d.strip().split("=", 1)[0].strip() for d in text.split(",")}
    max_age = None
    found = _MAX_AGE.search(text)
    if found is not None:
        max_age = int(found.group(1))
    return Controls(
        off=off,
        no_store="no-store" in directives,
        no_cache="no-cache" in directives,
        max_age=max_age,
    )
