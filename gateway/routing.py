"""Routes: which client path prefix goes to which upstream, and under which contract.

The upstream is fixed by the route, never taken from the request, and a
path that would leave the route's prefix (``..``, encoded or not) is
rejected before anything is forwarded: the gateway is never an open proxy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import SecretStr

from gateway.protocols import CredentialStyle, ProtocolSpec, detect, spec_for
from gateway.settings import RouteConfig, Timeouts

__all__ = ["PathRejected", "Route", "match_route", "upstream_target"]


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

    def __post_init__(self) -> None:
        self.prefix_bytes = self.config.prefix.encode()

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
        # A route for any path: guess from the upstream's host (Anthropic's API).
        return CredentialStyle.X_API_KEY if "anthropic" in self.upstream else CredentialStyle.BEARER


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


def upstream_target(route: Route, path: str, raw_path: bytes, query: bytes) -> str:
    """The upstream URL for a request, or PathRejected.

    ``path`` is the percent-decoded path (for checks), ``raw_path`` the bytes
    the client sent (forwarded as they were, so encodings survive).
    """
    segments = path.split("/")
    if any(seg in (".", "..") for seg in segments):
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
    url = route.upstream + rest
    if query:
        url += "?" + query.decode("latin-1")
    return url
