"""Routes: which client path prefix goes to which upstreams, and under which contract.

The upstreams are fixed by the route, never taken from the request, and a
path that would leave the route's prefix (``..``, encoded or not, or with
matrix parameters: ``..;x``) is rejected before anything is forwarded: the
gateway is never an open proxy. The checks read the decoded path; what goes
upstream is the path and query as the client sent them, byte for byte.

A route has a pool of one or more upstreams (``Endpoint``: a name, a base
URL, a credential, a weight, a model map, deadlines); which one an attempt
goes to is the pool's choice (``gateway.policy.pool``). An upstream base URL may
carry a query (Azure's ``?api-version=...``): the request path joins the
base path, and the queries are merged, the base's first. A client parameter
with the name of a base parameter is dropped: the operator's
``api-version`` (or any other) cannot be overridden by a client, whatever
order the upstream reads duplicates in.

A gateway sees few distinct request targets, so what routing works out for
one (its ``Target``, its protocol, each upstream's URL) is remembered, in a
memo per route and per upstream, bounded (``MEMO_ENTRIES`` entries, targets
up to ``MEMO_KEY_CHARS``; a full memo starts over): a client varying its
paths or queries costs the work each time, never memory. Rejected paths are
not remembered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar
from urllib.parse import quote, unquote_plus, urlsplit

from pydantic import SecretStr

from gateway.policy.pool import EjectionPolicy, Pool
from gateway.policy.retry import RetryPolicy
from gateway.protocols import REGISTRY, CredentialStyle, ProtocolSpec, detect, spec_for
from gateway.protocols.continuation import ContinuationStyle
from gateway.protocols.sigv4 import AwsKeys, Signer
from gateway.settings import RouteConfig, Timeouts, UpstreamConfig

__all__ = [
    "Endpoint",
    "PathRejected",
    "Route",
    "Target",
    "credential_style",
    "match_route",
    "merge_query",
    "request_target",
]


#: At most this many remembered targets per route (and URLs per upstream).
MEMO_ENTRIES = 1024
#: Targets longer than this (path and query, in characters) are not remembered.
MEMO_KEY_CHARS = 512

_V = TypeVar("_V")


def _remember(memo: dict[Any, _V], key: Any, value: _V) -> _V:
    if len(memo) >= MEMO_ENTRIES:
        memo.clear()
    memo[key] = value
    return value


class PathRejected(ValueError):
    """The request path is not acceptable (traversal, encoded separators)."""


class Target(NamedTuple):
    """What a request asks for below its route's prefix, as the client sent it."""

    rest: str  # the raw path after the prefix ("" or "/...")
    query: str  # the raw query ("" when none)


def credential_style(style: str, protocol: str, url: str) -> CredentialStyle:
    """How an upstream wants its credential: as configured, by the route's fixed
    protocol, or (a route for any path) guessed from the upstream's host. On a
    route for any path a request whose path a protocol claims uses that
    protocol's style instead (``Endpoint.style_for``)."""
    if style != "auto":
        return CredentialStyle(style)
    if protocol != "auto":
        return spec_for(protocol).credential
    for spec in REGISTRY:
        if any(host in url for host in spec.hosts):
            return spec.credential
    return CredentialStyle.BEARER


@dataclass(slots=True)
class Endpoint:
    """One upstream of a route, resolved: URL parts, credential, weight, models, deadlines."""

    name: str
    url: str
    timeouts: Timeouts  # the route's, with this upstream's overrides
    credential: SecretStr | None
    credential_style: CredentialStyle
    weight: int
    models: Mapping[str, str]
    #: ``auto`` style on a ``protocol = "auto"`` route: each request's protocol decides.
    style_by_protocol: bool = False
    priority: int = 0
    continuation: ContinuationStyle = ContinuationStyle.NONE
    #: Signs each request (SigV4) with the upstream's own AWS keys (its ``aws`` table).
    signer: Signer | None = None
    origin: str = field(init=False)  # scheme://host[:port]
    base_path: str = field(init=False)  # the URL's path, no trailing slash
    base_query: str = field(init=False)  # the URL's query ("" when none)
    base_names: frozenset[str] = field(init=False)  # its parameter names, decoded
    urls: dict[Target, str] = field(init=False, repr=False, compare=False)  # url_for's memo

    def __post_init__(self) -> None:
        self.urls = {}
        parts = urlsplit(encoded_url(self.url))
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.base_path = parts.path.rstrip("/")
        self.base_query = parts.query
        self.base_names = frozenset(_names(parts.query))

    def style_for(self, spec: ProtocolSpec) -> CredentialStyle:
        """The credential style of a request in ``spec``: the spec's own when the style
        is the request protocol's and the spec claims its path, else ``credential_style``."""
        if self.style_by_protocol and not spec.any_path:
            return spec.credential
        return self.credential_style

    def url_for(self, target: Target) -> str:
        """This upstream's URL for a request target: base path + rest, merged queries."""
        url = self.urls.get(target)
        if url is not None:
            return url
        url = self._url_for(target)
        if len(target.rest) + len(target.query) <= MEMO_KEY_CHARS:
            _remember(self.urls, target, url)
        return url

    def _url_for(self, target: Target) -> str:
        url = self.origin + (self.base_path + target.rest or "/")
        merged = merge_query(self, target.query)
        if merged:
            url += "?" + merged
        return url


# What stays as written in a URL's path and query: RFC 3986's reserved and unreserved
# characters, and "%" so that what the operator already encoded is not encoded twice.
_PATH_SAFE = "/:@!$&'()*+,;=~%"
_QUERY_SAFE = _PATH_SAFE + "?"


def encoded_url(url: str) -> str:
    """``url`` with what the operator wrote outside URL syntax (non-ASCII, spaces)
    percent-encoded once, and a non-ASCII host in its IDNA form, as httpx.URL does."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if not netloc.isascii():
        userinfo, at, hostport = netloc.rpartition("@")
        host, colon, port = hostport.partition(":")
        netloc = f"{userinfo}{at}{host.encode('idna').decode()}{colon}{port}"
    path = quote(parts.path, safe=_PATH_SAFE)
    query = quote(parts.query, safe=_QUERY_SAFE)
    return f"{parts.scheme}://{netloc}{path}" + (f"?{query}" if query else "")


def _endpoint(
    config: UpstreamConfig, route: RouteConfig, timeouts: Timeouts, secret: SecretStr | None
) -> Endpoint:
    overrides = {k: v for k, v in config.timeouts.model_dump().items() if v is not None}
    idle = overrides.get("idle", timeouts.idle)
    if route.continue_after_cut and idle >= timeouts.total:
        # A stall would only end at the total deadline, with no time left to continue
        # it: on a route that continues, an idle deadline not below the total is half it.
        overrides["idle"] = timeouts.total / 2
    return Endpoint(
        name=config.name,
        url=config.url,
        timeouts=timeouts.model_copy(update=overrides) if overrides else timeouts,
        credential=secret,
        credential_style=credential_style(config.credential_style, route.protocol, config.url),
        weight=config.weight,
        models=dict(config.models),
        style_by_protocol=config.credential_style == "auto" and route.protocol == "auto",
        priority=config.priority,
        continuation=ContinuationStyle(config.continuation),
        signer=_signer(config, route, secret),
    )


def _signer(config: UpstreamConfig, route: RouteConfig, secret: SecretStr | None) -> Signer | None:
    """The upstream's SigV4 signer, for the service its route's protocol names (a route for
    any path: the first protocol that signs)."""
    if config.aws is None or secret is None:
        return None
    specs = [spec_for(route.protocol)] if route.protocol != "auto" else list(REGISTRY)
    service = next((s.signing_service for s in specs if s.signing_service), None)
    if service is None:
        return None
    return Signer(AwsKeys.unpack(secret.get_secret_value()), config.aws.region, service)


def signing_scope(route: RouteConfig) -> tuple[frozenset[str], frozenset[str]]:
    """The regions and services a client's SigV4 signature may be scoped to on ``route``:
    its upstreams' ``aws`` regions, and the services its protocols sign for (an empty set:
    the route names none, and that part is not checked)."""
    specs = [spec_for(route.protocol)] if route.protocol != "auto" else list(REGISTRY)
    services = frozenset(s.signing_service for s in specs if s.signing_service)
    regions = frozenset(u.aws.region for u in route.pool() if u.aws is not None)
    return regions, services


@dataclass(slots=True)
class Route:
    """A configured route: its resolved upstreams and their pool, deadlines, live counters."""

    config: RouteConfig
    timeouts: Timeouts
    #: Resolved credentials by upstream name (``Settings.credentials[route name]``).
    credentials: Mapping[str, SecretStr] = field(default_factory=dict)
    active: int = 0
    prefix_bytes: bytes = field(init=False)
    endpoints: tuple[Endpoint, ...] = field(init=False)
    pool: Pool = field(init=False)
    retry_on: frozenset[str] = field(init=False)
    retry: RetryPolicy = field(init=False)
    #: request_target's memo: (path, raw path, query) -> Target.
    targets: dict[tuple[str, bytes, bytes], Target] = field(init=False, repr=False, compare=False)
    specs: dict[str, ProtocolSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.targets = {}
        self.specs = {}
        config = self.config
        self.prefix_bytes = config.prefix.encode()
        self.endpoints = tuple(
            _endpoint(u, config, self.timeouts, self.credentials.get(u.name)) for u in config.pool()
        )
        self.pool = Pool(
            [e.weight for e in self.endpoints],
            EjectionPolicy(
                eject_after=config.eject_after,
                base_seconds=config.eject_base_seconds,
                max_seconds=config.eject_max_seconds,
                max_ejected_percent=config.max_ejected_percent,
            ),
            tiers=[e.priority for e in self.endpoints],
        )
        # A route that holds structured answers retries one that broke its schema.
        held = {"schema_mismatch"} if config.schema_check == "hold" else set()
        self.retry_on = frozenset(config.retry_on) | held
        self.retry = RetryPolicy(
            max_attempts=config.max_attempts,
            retry_on=self.retry_on,
            backoff_seconds=config.retry_backoff_seconds,
            max_retry_after_seconds=config.max_retry_after_seconds,
        )

    @property
    def name(self) -> str:
        return self.config.name

    def spec_for(self, rest: str) -> ProtocolSpec:
        """The protocol of a request path below the prefix: the route's, or by the path."""
        if self.config.protocol != "auto":
            return spec_for(self.config.protocol)
        spec = self.specs.get(rest)
        if spec is None:
            spec = detect(rest)
            if len(rest) <= MEMO_KEY_CHARS:
                _remember(self.specs, rest, spec)
        return spec


def match_route(routes: list[Route], path: str) -> Route | None:
    """The route with the longest prefix that ``path`` is under, if any."""
    best: Route | None = None
    for route in routes:
        prefix = route.config.prefix
        if (path == prefix or path.startswith(prefix + "/")) and (
            best is None or len(prefix) > len(best.config.prefix)
        ):
            best = route
    return best


_FORBIDDEN_DECODED = ("%2e", "%2f", "%5c", "\\", "\x00")
_DOT_SEGMENTS = (".", "..")


def _names(query: str) -> list[str]:
    """The decoded, lower-cased parameter names of a query (``&`` and ``;`` both
    separate): some servers split on ``;`` too, or match names case-insensitively."""
    return [
        unquote_plus(pair.split("=", 1)[0]).lower()
        for part in query.split("&")
        for pair in part.split(";")
        if pair
    ]


def merge_query(endpoint: Endpoint, query: str) -> str:
    """The base URL's query, then the client's parameters that do not name a base one."""
    if not endpoint.base_query:
        return query
    if not query:
        return endpoint.base_query
    kept = [
        part for part in query.split("&") if part and endpoint.base_names.isdisjoint(_names(part))
    ]
    return "&".join([endpoint.base_query, *kept])


def request_target(route: Route, path: str, raw_path: bytes, query: bytes) -> Target:
    """What a request asks for below the route's prefix, or PathRejected.

    ``path`` is the percent-decoded path (for checks), ``raw_path`` the bytes
    the client sent (forwarded as they were, so encodings survive). Each
    upstream's URL is ``Endpoint.url_for(target)``.
    """
    key = (path, raw_path, query)
    target = route.targets.get(key)
    if target is not None:
        return target
    target = _request_target(route, path, raw_path, query)
    if len(raw_path) + len(query) <= MEMO_KEY_CHARS:
        _remember(route.targets, key, target)
    return target


def _request_target(route: Route, path: str, raw_path: bytes, query: bytes) -> Target:
    segments = path.split("/")
    # "..;x" is ".." to servers that strip matrix parameters (Tomcat, Jetty, Spring).
    if any(seg.split(";", 1)[0] in _DOT_SEGMENTS for seg in segments):
        raise PathRejected("path contains a dot segment")
    lowered = path.lower()
    if any(token in lowered for token in _FORBIDDEN_DECODED):
        raise PathRejected("path contains an encoded separator or dot")
    raw_lower = raw_path.lower()
    if b"%2f" in raw_lower or b"%5c" in raw_lower or b"%2e" in raw_lower:
        raise PathRejected("path contains an encoded separator or dot")
    if not (raw_path == route.prefix_bytes or raw_path.startswith(route.prefix_bytes + b"/")):
        raise PathRejected("path does not start with the route prefix as sent")
    return Target(raw_path[len(route.prefix_bytes) :].decode("latin-1"), query.decode("latin-1"))
