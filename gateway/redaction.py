"""What of the configuration may be shown: URLs and settings with their secrets masked.

``gateway check-config`` prints ``redacted(settings)``; the app logs it at start
and the status page shows origins through ``redact_url``. Credentials, user-info
and query values never leave this module unmasked.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from gateway.settings import Settings

__all__ = ["redact_url", "redacted"]


def redact_url(url: str | None) -> str | None:
    """A URL with any user-info and query values masked (keys may hide in either)."""
    if not url:
        return url
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "<redacted>@" + netloc.rsplit("@", 1)[1]
    query = "&".join(
        f"{pair.split('=', 1)[0]}=<redacted>" if "=" in pair else pair
        for pair in parts.query.split("&")
        if pair
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redacted(settings: Settings) -> dict[str, Any]:
    data = settings.model_dump(mode="json", exclude={"credentials"})
    data["upstream_url"] = redact_url(data.get("upstream_url"))
    data["client_key_sha256"] = [f"<sha256 {h[:8]}…>" for h in settings.client_key_sha256]
    data["redis_url"] = redact_url(data.get("redis_url"))  # a password is user-info
    for client in data.get("clients", []):
        client["key_sha256"] = [f"<sha256 {h[:8]}…>" for h in client["key_sha256"]]
    for route in data.get("routes", []):
        route["upstream"] = redact_url(route.get("upstream"))
        if route.get("credential_env"):
            route["credential"] = "<redacted>"
        for upstream in route.get("upstreams", []):
            upstream["url"] = redact_url(upstream.get("url"))
            if upstream.get("credential_env"):
                upstream["credential"] = "<redacted>"
        if route.get("client_key_sha256"):
            route["client_key_sha256"] = [f"<sha256 {h[:8]}…>" for h in route["client_key_sha256"]]
    data["effective_routes"] = []
    for r in settings.effective_routes():
        secrets = settings.credentials.get(r.name, {})
        data["effective_routes"].append(
            {
                "name": r.name,
                "prefix": r.prefix,
                "upstream": redact_url(r.upstream),
                "credential": "<redacted>" if secrets and not r.upstreams else None,
                "upstreams": [
                    {
                        "name": u.name,
                        "url": redact_url(u.url),
                        "weight": u.weight,
                        "credential": "<redacted>" if u.name in secrets else None,
                    }
                    for u in r.pool()
                ],
            }
        )
    return data
