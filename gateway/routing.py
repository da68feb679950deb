"""Routes: which client path prefix goes to which upstream, and under which contract.

The upstream is fixed by the route, never taken from the request, and a
path that would leave the route's prefix (``..``, encoded or not, or with
matrix parameters: ``..;x``) is rejected before anything is forwarded: the
gateway is never an open proxy. The checks read the decoded path; what goes
upstream is the path and query as the client sent them, byte for byte.

An upstream base URL may carry a query (Azure's ``?api-version=...``): the
request path joins the base path, and the queries are merged, the base's
first. A client parameter with the name of a base parameter is dropped:
the operator's ``api-version`` (or any other) cannot be overridden by a
client, whatever order the upstream reads duplicates in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote_plus, urlsplit

import httpx
from pydantic import SecretStr

from gateway.protocols import CredentialStyle, ProtocolSpec, detect, spec_for
from gateway.settings import RouteConfig, Timeouts

__all__ = [
    "PathRejected",
    "Route",
    "match_route",
    "merge_query",
    "upstream_target",
]


class PathRejected(ValueError):
    """The request path is not acceptable (traversal, encoded separators)."""


@dataclass(slots=True)
class Route:
    """A configured route with its resolved timeouts, credential and live counters."""

    config: RouteConfig
    timeouts: Timeouts
    credential: SecretStr | None = None
    active: int = 0
    prefix_bytes: bytes = field(init=False)
    origin: str = field(init=False)  # scheme://host[:port] of the upstream
    base_path: str = field(init=False)  # the upstream URL's path, no trailing slash
    base_query: str = field(init=False)  # the upstream URL's query ("" when none)
    base_names: frozenset[str] = field(init=False)  # its parameter names, decoded

    def __post_init__(self) -> None:
        self.prefix_bytes = self.config.prefix.encode()
        # httpx.URL percent-encodes what the operator wrote (non-ASCII, spaces) once.
        parts = urlsplit(str(httpx.URL(self.config.upstream)))
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.base_path = parts.path.rstrip("/")
        self.base_query = parts.query
        self.base_names = frozenset(_names(parts.query))

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def upstream(self) -> str:
        return self.config.upstream

    def spec_for(self, rest: str) -> ProtocolSpec:
        """The protocol of a request path below the prefix: the route's, or by the path."""
        if self.config.protocol != "auto":
            return spec_for(self.config.protocol)
        return detect(rest)

    @property
    def credential_style(self) -> CredentialStyle:
        """How this route's upstream wants its credential."""
        style = self.config.credential_style
        if style != "auto":
            return CredentialStyle(style)
        if self.config.protocol != "auto":
            return spec_for(self.config.protocol).credential
        # A route for any path: guess from the upstream's host (Anthropic's, Google's API).
        if "anthropic" in self.upstream:
            return CredentialStyle.X_API_KEY
        if "googleapis" in self.upstream:
            return CredentialStyle.X_GOOG_API_KEY
        return CredentialStyle.BEARER


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


def merge_query(route: Route, query: str) -> str:
    """The base URL's query, then the client's parameters that do not name a base one."""
    if not route.base_query:
        return query
    if not query:
        return route.base_query
    kept = [part for part in query.split("&") if part and route.base_names.isdisjoint(_names(part))]
    return "&".join([route.base_query, *kept])


def upstream_target(route: Route, path: str, raw_path: bytes, query: bytes) -> str:
    """The upstream URL for a request, or PathRejected.

    ``path`` is the percent-decoded path (for checks), ``raw_path`` the bytes
    the client sent (forwarded as they were, so encodings survive).
    """
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
    rest = raw_path[len(route.prefix_bytes) :].decode("latin-1")
    url = route.origin + (route.base_path + rest or "/")
    merged = merge_query(route, query.decode("latin-1"))
    if merged:
        url += "?" + merged
    return url
