"""Header rules of the proxy: what each way drops, request ids, forwarding headers.

Headers are ASGI-style lists of (lower-case name, value) byte pairs.

Forwarding headers (``Forwarding``): no client is believed by default. The
gateway appends the address of its TCP peer to the ``X-Forwarded-For`` the
client sent (so the last entry is always one the gateway saw) and sets
``X-Forwarded-Proto`` from the real scheme; ``Forwarded`` and ``X-Real-IP``
from a client are dropped. Only a peer inside ``trusted_proxies`` has its
``X-Forwarded-Proto``, ``Forwarded`` and ``X-Real-IP`` passed on, and for
the access log its ``X-Forwarded-For`` is read from the right, past every
trusted address, to the first untrusted one: the client.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable, MutableMapping
from typing import TYPE_CHECKING, Any, Final

from gateway.protocols.credentials import CREDENTIAL_HEADERS

if TYPE_CHECKING:
    from gateway.policy.routing import Endpoint
    from gateway.protocols import ProtocolSpec

__all__ = [
    "CREDENTIAL_HEADERS",
    "FORWARDING_HEADERS",
    "HANDSHAKE_DROP",
    "HOP_BY_HOP",
    "REQUEST_DROP",
    "RESPONSE_DROP",
    "STORED_REQUEST_DROP",
    "STREAM_HEADERS",
    "STREAM_RESPONSE_DROP",
    "Forwarding",
    "RawHeaders",
    "get_header",
    "new_request_id",
    "pick_request_id",
    "request_id_of",
    "strip_hop_by_hop",
    "with_credential",
    "without_key",
]

RawHeaders = list[tuple[bytes, bytes]]

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)

_REQUEST_ID = re.compile(rb"^[A-Za-z0-9._-]{1,128}$")


def get_header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of header ``name`` (lower-case), or None."""
    for key, value in headers:
        if key == name:
            return value
    return None


def strip_hop_by_hop(
    headers: Iterable[tuple[bytes, bytes]], also: frozenset[bytes] = frozenset()
) -> RawHeaders:
    """Drop hop-by-hop headers, those named in ``Connection``, and ``also``.

    One pass over the pairs against a set built once per ``also`` (a caller's
    constant); only a request with a ``Connection`` header pays a second."""
    drop = _DROPS.get(also)
    if drop is None:
        drop = HOP_BY_HOP | also
        if len(_DROPS) < 64:
            _DROPS[also] = drop
    kept: RawHeaders = []
    named: set[bytes] | None = None
    for key, value in headers:
        key = key.lower()
        if key == b"connection":
            if named is None:
                named = set()
            named.update(t.strip().lower() for t in value.split(b",") if t.strip())
        elif key not in drop:
            kept.append((key, value))
    if named:
        kept = [(k, v) for k, v in kept if k not in named]
    return kept


#: strip_hop_by_hop's sets, by ``also``: a handful of constants in a process.
_DROPS: dict[frozenset[bytes], frozenset[bytes]] = {}


def pick_request_id(client_value: bytes | None) -> str:
    """The client's X-Request-ID when it is 1-128 of [A-Za-z0-9._-], else a new one."""
    if client_value is not None and _REQUEST_ID.match(client_value):
        return client_value.decode("ascii")
    return new_request_id()


#: Where a request's scope keeps its request id once one is picked.
REQUEST_ID_KEY: Final = "gateway.request_id"


def request_id_of(scope: MutableMapping[str, Any]) -> str:
    """The request's id: the one already picked for it, else picked now and kept.

    The edge, the relay and the app's own answers each ask; whichever asks first
    picks, so that an answer and the access log always carry the same id (a
    body the edge refuses while the app reads it is answered by the edge and
    logged by the app).
    """
    request_id = scope.get(REQUEST_ID_KEY)
    if request_id is None:
        request_id = scope[REQUEST_ID_KEY] = pick_request_id(
            get_header(scope["headers"], b"x-request-id")
        )
    return str(request_id)


def new_request_id() -> str:
    """A random version-4 UUID as 32 hex digits (``uuid4().hex``), at a third of its cost."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # the RFC 4122 variant
    return raw.hex()


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Request headers that claim who the client is; the gateway writes its own.
FORWARDING_HEADERS = frozenset(
    {b"x-forwarded-for", b"x-forwarded-proto", b"forwarded", b"x-real-ip"}
)
_MAX_CLIENT_CHARS = 64  # an unparseable X-Forwarded-For entry is logged cut to this


class Forwarding:
    """The forwarding headers for the upstream, and the client address for the log."""

    def __init__(self, trusted_proxies: Iterable[str]) -> None:
        self._trusted: tuple[IPNetwork, ...] = tuple(
            ipaddress.ip_network(cidr) for cidr in trusted_proxies
        )

    def trusts(self, address: str | IPAddress | None) -> bool:
        if not self._trusted or address is None:
            return False
        if isinstance(address, str):
            parsed = _parse_address(address)
            if parsed is None:
                return False
            address = parsed
        return any(address in network for network in self._trusted)

    def headers(
        self, headers: Iterable[tuple[bytes, bytes]], peer: str | None, scheme: str
    ) -> RawHeaders:
        """The forwarding headers to send upstream (the client's own are not to be sent)."""
        trusted = self.trusts(peer)
        prior = [v for k, v in headers if k == b"x-forwarded-for"]
        if peer:
            prior.append(peer.encode())
        out: RawHeaders = [(b"x-forwarded-for", b", ".join(prior))] if prior else []
        proto = get_header(headers, b"x-forwarded-proto") if trusted else None
        out.append((b"x-forwarded-proto", proto or scheme.encode()))
        if trusted:
            out.extend((k, v) for k, v in headers if k in (b"forwarded", b"x-real-ip"))
        return out

    def client(self, headers: Iterable[tuple[bytes, bytes]], peer: str | None) -> str | None:
        """The client's address: the peer, or behind trusted proxies the first untrusted
        address of X-Forwarded-For read from the right."""
        if not self.trusts(peer):
            return peer
        client = peer
        entries = [
            entry.strip()
            for k, v in headers
            if k == b"x-forwarded-for"
            for entry in v.decode("latin-1").split(",")
        ]
        for entry in reversed(entries):
            if not entry:
                continue
            address = _parse_address(entry)
            if address is None:
                return entry[:_MAX_CLIENT_CHARS]
            client = str(address)
            if not self.trusts(address):
                break
        return client


def _parse_address(value: str) -> IPAddress | None:
    """An IP address from an X-Forwarded-For entry: bare, ``[v6]:port`` or ``v4:port``."""
    if value.startswith("["):
        value = value[1 : value.find("]")] if "]" in value else value
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


# What each way drops (besides ``HOP_BY_HOP``, through ``strip_hop_by_hop``): every
# header-dropping set of the proxy is here, so what leaves the gateway is read in one place.

#: A client's request on its way upstream: what the gateway sets itself (the upstream's
#: host and length, its own request id) or answers itself (``Expect``, a resume).
REQUEST_DROP: Final = (
    frozenset({b"host", b"content-length", b"x-request-id", b"expect", b"x-gateway-resume"})
    | FORWARDING_HEADERS
)
#: A client's WebSocket handshake on its way upstream: the handshake's own headers are
#: the upstream connection's to make.
HANDSHAKE_DROP: Final = (
    frozenset(
        {
            b"host",
            b"upgrade",
            b"connection",
            b"content-length",
            b"x-request-id",
            b"sec-websocket-key",
            b"sec-websocket-version",
            b"sec-websocket-extensions",
            b"sec-websocket-accept",
        }
    )
    | FORWARDING_HEADERS
)
#: An upstream's answer on its way to the client: the gateway's own request id, and what
#: would tell the client about the upstream rather than the gateway.
RESPONSE_DROP: Final = frozenset({b"x-request-id", b"x-gateway-upstream", b"server", b"date"})
#: A streamed answer's: streamed bodies are forwarded decoded (the guard must read them),
#: so no length or ``Content-Encoding``; the gateway sets the caching ones itself.
STREAM_RESPONSE_DROP: Final = RESPONSE_DROP | {
    b"content-length",
    b"content-encoding",
    b"cache-control",
    b"x-accel-buffering",
}
#: What the gateway sets on every stream it sends (a relayed one, a resumed one).
STREAM_HEADERS: Final = ((b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no"))
#: A request's headers kept in the stream store (to continue an orphan): no secret.
STORED_REQUEST_DROP: Final = CREDENTIAL_HEADERS | {b"cookie"}


def without_key(headers: RawHeaders, key: bytes | None) -> RawHeaders:
    """``headers`` without the gateway key that authenticated the request."""
    if not key:
        return headers
    return [
        (k, v)
        for k, v in headers
        if k not in CREDENTIAL_HEADERS
        or not (v == key or (k == b"authorization" and v[7:].strip() == key))
    ]


def with_credential(
    headers: RawHeaders,
    endpoint: Endpoint,
    spec: ProtocolSpec,
    *,
    method: str = "POST",
    url: str = "",
    body: bytes = b"",
) -> RawHeaders:
    """``headers`` for ``endpoint``: its own credential instead of the client's, if it has
    one, in the style of the request's protocol ``spec`` (``Endpoint.style_for``); an
    upstream with AWS keys gets the request (``method url`` with ``body``) signed."""
    if endpoint.credential is None:
        return headers
    headers = [(k, v) for k, v in headers if k not in CREDENTIAL_HEADERS]
    if endpoint.signer is not None:
        # AWS keys sign, never travel; a request with no URL to sign (none today) gets none.
        return endpoint.signer.sign(method, url, headers, body) if url else headers
    secret = endpoint.credential.get_secret_value().encode()
    headers.append(endpoint.style_for(spec).carried(secret))
    return headers
