"""Where a request carries a credential: each style's header and scheme, and a client's key.

A protocol's spec names its credential style (``ProtocolSpec.credential``); the
style says where the credential goes: its header and what comes before it there
(``Authorization: Bearer <key>``, ``x-api-key: <key>``, a SigV4 signature's
``Authorization: AWS4-HMAC-SHA256 ...``). The proxy reads these facts to put an
upstream's own credential on a request, to drop a client's, and to find the key
a client presents; it names no header of its own.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Final

__all__ = ["CREDENTIAL_HEADERS", "CredentialStyle", "presented_key"]


class CredentialStyle(enum.StrEnum):
    """How an upstream expects the route's credential."""

    BEARER = "bearer"  # Authorization: Bearer <key>
    X_API_KEY = "x-api-key"  # Anthropic
    X_GOOG_API_KEY = "x-goog-api-key"  # Google's Gemini API
    #: AWS Signature Version 4 with the upstream's ``aws`` keys (Bedrock): the request is
    #: signed for its host; a client's own signature is never forwarded.
    SIGV4 = "sigv4"

    @property
    def header(self) -> bytes:
        """The request header (lower-case) that carries a credential of this style."""
        return _WHERE[self][0]

    @property
    def scheme(self) -> bytes:
        """What precedes the credential in its header (``b""``: the value is the key)."""
        return _WHERE[self][1]

    def carried(self, secret: bytes) -> tuple[bytes, bytes]:
        """The header that carries ``secret`` in this style (a signature is made, never
        carried: SigV4 has its own signer)."""
        header, scheme = _WHERE[self]
        return header, scheme + secret


_WHERE: dict[CredentialStyle, tuple[bytes, bytes]] = {
    CredentialStyle.BEARER: (b"authorization", b"Bearer "),
    CredentialStyle.X_API_KEY: (b"x-api-key", b""),
    CredentialStyle.X_GOOG_API_KEY: (b"x-goog-api-key", b""),
    CredentialStyle.SIGV4: (b"authorization", b"AWS4-HMAC-SHA256 "),
}
#: Azure OpenAI's key header: a client of an OpenAI-compatible API may present its key
#: there, though no upstream of the gateway is sent one in it.
_ALSO_PRESENTED: Final = (b"api-key",)
#: Headers whose whole value is a key, in the order a client's key is looked for.
_KEY_HEADERS: Final = (
    CredentialStyle.X_API_KEY.header,
    *_ALSO_PRESENTED,
    CredentialStyle.X_GOOG_API_KEY.header,
)
_AUTHORIZATION: Final = CredentialStyle.BEARER.header
_BEARER: Final = CredentialStyle.BEARER.scheme.lower()
_SIGNED: Final = CredentialStyle.SIGV4.scheme

#: Every header a request may carry a credential in: a client's, replaced by an
#: upstream's own.
CREDENTIAL_HEADERS: Final = frozenset(header for header, _ in _WHERE.values()) | frozenset(
    _ALSO_PRESENTED
)


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The client key a request presents: a header whose value is a key (``x-api-key``,
    ``api-key``, ``x-goog-api-key``), else an ``Authorization`` bearer token, else a whole
    SigV4 ``Authorization`` (a signature: never forwarded either); None when none."""
    found: dict[bytes, bytes] = {}
    for name, value in headers:
        if (name in _KEY_HEADERS or name == _AUTHORIZATION) and name not in found:
            found[name] = value
    for name in _KEY_HEADERS:
        if found.get(name):
            return found[name]
    auth = found.get(_AUTHORIZATION)
    if auth is None:
        return None
    if auth[: len(_BEARER)].lower() == _BEARER:
        return auth[len(_BEARER) :].strip()
    if auth.startswith(_SIGNED):
        return auth
    return None
