"""Admission: everything checked before a request may reach an upstream.

In order: the gateway is not draining, the path stays under the route's
prefix, the client key (when the route takes keys) is one it accepts, the
body fits the size limit and the global budget of buffered request bytes
(every body is held in memory until its request ends: the budget bounds them
all together, so slow uploads cannot pin unbounded memory; a body a route may
rewrite counts twice, for its rewritten copy); then, for
streams, the global and per-route concurrency caps.

Client keys: a route accepts the digests of its own ``client_key_sha256``
when it has that list, else the global one (the shorthand for "every route
takes these"); an empty list takes no key. A missing or unknown key is 401
(``unauthorized``); a key the gateway knows but this route does not accept
is 403 (``forbidden``). Digests are compared in constant time, all of them.

Named clients (``[[clients]]``): each one's keys are accepted on the routes
it lists (default: every route that does not set ``client_key_sha256 = []``),
and a request that presents one is that client's (``Caller.name``); every
other request is ``anonymous``. ``Caller.keyed`` says a gateway key
authenticated it: that credential is never forwarded upstream. A named
client may also hold AWS key pairs the gateway issued (``aws_keys``): a
request signed with one (SigV4, as Bedrock's clients sign) is that client's
once its signature verifies over the whole body (``gateway.protocols.sigv4``),
on the same routes as its keys; an unknown key id is 401 before the body is
read, a signature that does not verify 401 after.
Issued keys (``gateway.keys``, with ``keys.store`` on): a key the
configuration does not know is looked up in this process's copy of the issued
keys (``issued``, no I/O), and is its client's (``Caller.key_id`` says which
key, ``Caller.team`` its team) on the routes it may use; a revoked or expired
key, or a rotated secret past its overlap, is 401 as an unknown one is. With
issued keys on, every route takes keys but one that sets
``client_key_sha256 = []``.
A refusal is an ``Refused`` with the status, the metric label and the
message the client gets; nothing has been sent upstream at that point.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from pydantic import SecretStr
from starlette.types import Receive, Scope

from gateway.policy.routing import PathRejected, Route, Target, request_target, signing_scope
from gateway.protocols.credentials import CredentialStyle, presented_key
from gateway.protocols.sigv4 import parse_authorization, verify
from gateway.proxy.headers import RawHeaders, get_header
from gateway.settings import ANONYMOUS, ClientConfig, GatewayLimits, RouteConfig, Settings


class IssuedKey(Protocol):
    """An issued key as admission reads it (``gateway.keys.record.IssuedKey``)."""

    @property
    def id(self) -> str: ...
    @property
    def client(self) -> str: ...
    @property
    def existing_client(self) -> bool: ...
    @property
    def team(self) -> str | None: ...
    @property
    def routes(self) -> list[str] | None: ...


class IssuedKeys(Protocol):
    """The keys issued at run time (``gateway.keys.registry.Registry``), handed in by the
    app: the key whose digest a request presents, if any."""

    def find(self, digest: bytes) -> IssuedKey | None: ...


log = logging.getLogger("gateway")

__all__ = [
    "ANONYMOUS_CALLER",
    "Admission",
    "Caller",
    "ClientGone",
    "Refused",
    "body_weight",
    "presented_key",
    "warn_uncredentialed",
]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request is: a named client or ``anonymous``, and whether a gateway key
    authenticated it (then that key is the gateway's, never the upstream's)."""

    name: str = ANONYMOUS
    keyed: bool = False
    #: the issued key that authenticated it (None: a key of the configuration, or none)
    key_id: str | None = None
    #: the team the issued key was created for
    team: str | None = None


ANONYMOUS_CALLER = Caller()
_KEYED_ANONYMOUS = Caller(ANONYMOUS, True)
#: (digest, caller): what an accepted key makes of the request.
_Accepted = tuple[tuple[bytes, Caller], ...]


class Refused(Exception):
    """A request refused by the gateway before anything was sent upstream."""

    def __init__(
        self,
        status: int,
        label: str,
        message: str,
        type_: str,
        headers: RawHeaders | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.label = label
        self.message = message
        self.type_ = type_
        self.headers = headers


class ClientGone(Exception):
    """The client disconnected before its request was complete."""


class Admission:
    """The gate in front of the upstreams, with the live stream counts it caps."""

    def __init__(
        self,
        limits: GatewayLimits,
        client_key_sha256: list[str],
        routes: Iterable[RouteConfig] = (),
        clients: Iterable[ClientConfig] = (),
        issued_aws_keys: Mapping[str, SecretStr] | None = None,
    ) -> None:
        self.limits = limits
        routes = list(routes)
        clients = list(clients)
        #: access key id -> (secret, the client, the routes it may use; None: every one)
        self._aws_keys: dict[str, tuple[SecretStr, Caller, frozenset[str]]] = {}
        for client in clients:
            allowed = frozenset(
                r.name
                for r in routes
                if r.client_key_sha256 != [] and (client.routes is None or r.name in client.routes)
            )
            for issued in client.aws_keys:
                secret = (issued_aws_keys or {}).get(issued.access_key_id)
                if secret is not None:
                    caller = Caller(client.name, True)
                    self._aws_keys[issued.access_key_id] = (secret, caller, allowed)
        self._global_keys = _digests(client_key_sha256)
        global_accepted = tuple((d, _KEYED_ANONYMOUS) for d in self._global_keys)
        self._route_keys: dict[str, _Accepted] = {
            r.name: tuple((d, _KEYED_ANONYMOUS) for d in _digests(r.client_key_sha256))
            for r in routes
            if r.client_key_sha256 is not None
        }
        self._default_keys: _Accepted = global_accepted
        for client in clients:
            caller = Caller(client.name, True)
            named = tuple((d, caller) for d in _digests(client.key_sha256))
            for route in routes:
                if route.client_key_sha256 == [] or (
                    client.routes is not None and route.name not in client.routes
                ):
                    continue
                self._route_keys[route.name] = (
                    self._route_keys.get(route.name, global_accepted) + named
                )
        self._known_keys = tuple(
            set(self._global_keys).union(
                *((d for d, _ in accepted) for accepted in self._route_keys.values()),
                *(_digests(c.key_sha256) for c in clients),
            )
        )
        #: The routes that set ``client_key_sha256 = []``: no key, issued or not.
        self._keyless = frozenset(r.name for r in routes if r.client_key_sha256 == [])
        #: The routes each configured client may use (None: every one that takes keys).
        self._client_routes = {c.name: c.routes for c in clients}
        #: The issued keys (set by the app when ``keys.store`` is on).
        self.issued: IssuedKeys | None = None
        self.active_streams = 0
        #: Request body bytes held now (being read, or read and not yet released).
        self.buffered_bytes = 0

    def takes_keys(self, route: str) -> bool:
        """Whether a route takes client keys (and drops them before the upstream)."""
        return bool(self._route_keys.get(route, self._default_keys)) or (
            self.issued is not None and route not in self._keyless
        )

    async def admit(
        self, route: Route, scope: Scope, receive: Receive, draining: bool
    ) -> tuple[Target, bytes, Caller]:
        """The request target below the prefix, the whole request body and who sent it,
        or Refused / ClientGone."""
        if draining:
            raise _unavailable(
                "shutting_down", "The gateway is shutting down; retry on another instance."
            )
        target = self.target_of(route, scope)
        headers = scope["headers"]
        signed = self._signed_by(route, headers)
        if signed is None:
            caller = self.check_key(route, headers)
            return target, await self._read_body(headers, receive, body_weight(route)), caller
        secret, caller = signed
        body = await self._read_body(headers, receive, body_weight(route))
        if not _signature_holds(scope, secret, body):
            self.release(body_weight(route) * len(body))
            raise Refused(
                401,
                "unauthorized",
                "The request signature does not match.",
                "authentication_error",
            )
        return target, body, caller

    def _signed_by(
        self, route: Route, headers: list[tuple[bytes, bytes]]
    ) -> tuple[SecretStr, Caller] | None:
        """The secret and client of the AWS key a SigV4-signed request names, on a route
        that takes keys; None for a request that is not signed so (Refused: a key id the
        gateway did not issue, or one not allowed here)."""
        auth = get_header(headers, b"authorization")
        if auth is None or not auth.startswith(CredentialStyle.SIGV4.scheme) or not self._aws_keys:
            return None
        if not self.takes_keys(route.name):
            return None  # a route that takes no keys: the signature is dropped, unread
        parts = parse_authorization(auth.decode("latin-1"))
        issued = self._aws_keys.get(parts["access_key_id"]) if parts else None
        if issued is None:
            raise Refused(
                401, "unauthorized", "Missing or invalid API key.", "authentication_error"
            )
        secret, caller, allowed = issued
        if route.name not in allowed:
            raise Refused(
                403, "forbidden", "This API key is not allowed on this route.", "permission_error"
            )
        _check_signing_scope(route, parts)
        return secret, caller

    @staticmethod
    def target_of(route: Route, scope: Scope) -> Target:
        """The request's target below the route's prefix, or Refused (400 bad_path) for a
        path that leaves it."""
        try:
            return request_target(
                route,
                scope["path"],
                scope.get("raw_path") or scope["path"].encode(),
                scope.get("query_string", b""),
            )
        except PathRejected:
            raise Refused(
                400, "bad_path", "The request path is not allowed.", "invalid_request_error"
            ) from None

    def check_key(self, route: Route, headers: list[tuple[bytes, bytes]]) -> Caller:
        """Who the request is (a named client, or anonymous); Refused (401/403) unless it
        presents a key the route accepts."""
        accepted = self._route_keys.get(route.name, self._default_keys)
        if accepted or self.takes_keys(route.name):
            return self._check_key(accepted, headers, route.name)
        return ANONYMOUS_CALLER

    async def _read_body(
        self, headers: list[tuple[bytes, bytes]], receive: Receive, weight: int = 1
    ) -> bytes:
        """The whole body, counted ``weight`` times in ``buffered_bytes`` until
        ``release(weight * len(body))``."""
        limit = self.limits.max_request_bytes
        length = get_header(headers, b"content-length")
        if length is not None and length.isdigit():
            if int(length) > limit:
                raise _too_large(limit)
            if self.buffered_bytes + weight * int(length) > self.limits.max_buffered_request_bytes:
                raise _over_budget()
        parts: list[bytes] = []
        size = 0
        more = True
        try:
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientGone
                chunk = message.get("body", b"")
                if size + len(chunk) > limit:
                    raise _too_large(limit)
                if chunk:
                    self.buffered_bytes += weight * len(chunk)
                    size += len(chunk)
                    if self.buffered_bytes > self.limits.max_buffered_request_bytes:
                        raise _over_budget()
                    parts.append(chunk)
                more = message.get("more_body", False)
        except BaseException:
            self.release(weight * size)
            raise
        return b"".join(parts)

    def charge(self, size: int) -> None:
        """A copy of ``size`` bytes of an admitted body is held too (a rewritten body):
        counted in the budget, never refused (``release`` it with the body)."""
        self.buffered_bytes += size

    def release(self, size: int) -> None:
        """A body of ``size`` bytes is no longer held."""
        self.buffered_bytes -= size

    def has_global_key(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether the request presents one of the global client keys (the status page)."""
        key = presented_key(headers)
        return bool(key) and _listed(hashlib.sha256(key or b"").digest(), self._global_keys)

    def _check_key(
        self, accepted: _Accepted, headers: list[tuple[bytes, bytes]], route: str
    ) -> Caller:
        key = presented_key(headers)
        if key:
            digest = hashlib.sha256(key).digest()
            caller = _match(digest, accepted)
            if caller is not None:
                return caller
            issued = self.issued.find(digest) if self.issued is not None else None
            if issued is not None:
                if self._issued_may_use(
                    issued.client, issued.existing_client, issued.routes, route
                ):
                    return Caller(issued.client, True, issued.id, issued.team)
                raise Refused(
                    403,
                    "forbidden",
                    "This API key is not allowed on this route.",
                    "permission_error",
                )
            if _listed(digest, self._known_keys):
                raise Refused(
                    403,
                    "forbidden",
                    "This API key is not allowed on this route.",
                    "permission_error",
                )
        raise Refused(401, "unauthorized", "Missing or invalid API key.", "authentication_error")

    def _issued_may_use(
        self, client: str, existing: bool, routes: list[str] | None, route: str
    ) -> bool:
        """An issued key on ``route``: one of its routes, and its configured client's."""
        if routes is not None and route not in routes:
            return False
        configured = self._client_routes.get(client) if existing else None
        return configured is None or route in configured

    def start_stream(self, route: Route) -> None:
        """Count a stream in, or Refused (503 + Retry-After) when a cap is reached."""
        cap = self.limits.max_concurrent_streams
        route_cap = route.config.max_concurrent_streams
        if (cap is not None and self.active_streams >= cap) or (
            route_cap is not None and route.active >= route_cap
        ):
            raise Refused(
                503,
                "overloaded",
                "Too many concurrent streams; retry shortly.",
                "service_unavailable",
                [(b"retry-after", b"1")],
            )
        self.active_streams += 1
        route.active += 1

    def end_stream(self, route: Route) -> None:
        self.active_streams -= 1
        route.active -= 1


def body_weight(route: Route) -> int:
    """How many times a body of ``route`` counts in the buffered-body budget: twice on a
    route that may rewrite it (usage injection, an upstream's ``models`` map), whose
    rewritten copy is held beside it or in its place."""
    rewrites = route.config.inject_include_usage or any(e.models for e in route.endpoints)
    return 2 if rewrites else 1


def _check_signing_scope(route: Route, parts: Mapping[str, str] | None) -> None:
    """Refused (401) unless a signature's scope names the route's region and service."""
    if parts is None:
        return
    regions, services = signing_scope(route.config)
    if (regions and parts["region"] not in regions) or (
        services and parts["service"] not in services
    ):
        wanted = " or ".join(
            f"{r}/{s}" for r in sorted(regions or {"*"}) for s in sorted(services or {"*"})
        )
        raise Refused(
            401,
            "unauthorized",
            f"The request signature is scoped to {parts['region']}/{parts['service']}; "
            f"this route takes {wanted}.",
            "authentication_error",
        )


def _signature_holds(scope: Scope, secret: SecretStr, body: bytes) -> bool:
    """Whether the request's SigV4 signature was made with ``secret`` over this request."""
    headers = scope["headers"]
    host = (get_header(headers, b"host") or b"").decode("latin-1")
    path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
    query = scope.get("query_string", b"").decode("latin-1")
    url = f"http://{host}{path}" + (f"?{query}" if query else "")
    return verify(
        secret.get_secret_value(),
        scope["method"],
        url,
        headers,
        body,
        now=datetime.datetime.now(datetime.UTC),
    )


def _over_budget() -> Refused:
    return _unavailable(
        "memory_budget", "The gateway is holding too many request bodies; retry shortly."
    )


def _unavailable(label: str, message: str) -> Refused:
    """A 503 of the gateway's own: retry in a second, on a new connection."""
    return Refused(
        503,
        label,
        message,
        "service_unavailable",
        [(b"retry-after", b"1"), (b"connection", b"close")],
    )


def _digests(hex_digests: list[str]) -> tuple[bytes, ...]:
    return tuple(bytes.fromhex(h) for h in hex_digests)


def _listed(digest: bytes, digests: tuple[bytes, ...]) -> bool:
    found = False
    for expected in digests:  # constant time, and no early exit
        found |= hmac.compare_digest(digest, expected)
    return found


def _match(digest: bytes, accepted: _Accepted) -> Caller | None:
    found: Caller | None = None
    for expected, caller in accepted:  # constant time, and no early exit
        if hmac.compare_digest(digest, expected):
            found = caller
    return found


def _too_large(limit: int) -> Refused:
    return Refused(
        413,
        "body_too_large",
        f"Request body exceeds the gateway limit of {limit} bytes.",
        "invalid_request_error",
    )


def warn_uncredentialed(settings: Settings, admission: Admission) -> None:
    """Say at start which routes take client keys but send the upstream no credential."""
    for route in settings.effective_routes():
        bare = [u.name for u in route.pool() if not u.credential_env and u.aws is None]
        if bare and admission.takes_keys(route.name):
            log.warning(
                "route %s: clients authenticate with gateway keys, which are not forwarded, "
                "and upstream(s) %s have no credential_env: they get no credential",
                route.name,
                ", ".join(bare),
            )
