"""AWS Signature Version 4: a request signed for the upstream with the route's own AWS
credentials, and a client's signature checked against a key pair the gateway issued.

A SigV4 signature covers the host the request is sent to, so a client's own
signature can never be forwarded: the gateway accepts the client (by its
gateway key, or by a signature made with a key pair the gateway issued to it,
``verify``) and signs the upstream request anew (``Signer.sign``). Both are
botocore's signer (the ``bedrock`` extra), never a hand-made HMAC.

The upstream signature covers ``host``, ``x-amz-date``, ``content-type`` and
the session token when there is one, and the body's hash: the other headers
go along unsigned, as SigV4 allows, so no hop of the relay can break it.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["AwsKeys", "Signer", "botocore_available", "parse_authorization", "verify"]

Headers = list[tuple[bytes, bytes]]

#: Headers a new signature replaces (the client's own, if it sent any).
_SIGNATURE_HEADERS = frozenset(
    {b"authorization", b"x-amz-date", b"x-amz-security-token", b"x-amz-content-sha256"}
)


def botocore_available() -> bool:
    try:
        import botocore.auth  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class AwsKeys:
    """An access key pair (and a session token, for temporary credentials)."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def packed(self) -> str:
        """One string (for the settings' resolved credentials): the parts on lines."""
        return "\n".join((self.access_key_id, self.secret_access_key, self.session_token or ""))

    @classmethod
    def unpack(cls, value: str) -> AwsKeys:
        key_id, secret, token = ([*value.split("\n"), "", ""])[:3]
        return cls(key_id, secret, token or None)


@dataclass(frozen=True, slots=True)
class Signer:
    """Signs requests for one AWS service in one region with one key pair."""

    keys: AwsKeys
    region: str
    service: str

    def sign(self, method: str, url: str, headers: Headers, body: bytes) -> Headers:
        """``headers`` with a fresh SigV4 signature for ``method url`` and ``body``."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        content_type = next((v for k, v in headers if k == b"content-type"), None)
        signed: dict[str, str] = {}
        if content_type is not None:
            signed["Content-Type"] = content_type.decode("latin-1")
        request = AWSRequest(method=method, url=url, data=body, headers=signed)
        keys = self.keys
        credentials = Credentials(keys.access_key_id, keys.secret_access_key, keys.session_token)
        SigV4Auth(credentials, self.service, self.region).add_auth(request)
        out = [(k, v) for k, v in headers if k not in _SIGNATURE_HEADERS]
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
            value = request.headers.get(name)
            if value is not None:
                out.append((name.lower().encode(), str(value).encode("latin-1")))
        return out


def parse_authorization(value: str) -> dict[str, str] | None:
    """The parts of a SigV4 ``Authorization`` header: ``access_key_id``, ``date``,
    ``region``, ``service``, ``signed_headers``, ``signature``; None if it is none."""
    scheme, _, rest = value.partition(" ")
    if scheme != "AWS4-HMAC-SHA256":
        return None
    parts: dict[str, str] = {}
    for item in rest.split(","):
        name, eq, field = item.strip().partition("=")
        if eq:
            parts[name] = field
    scope = parts.get("Credential", "").split("/")
    if len(scope) != 5 or scope[4] != "aws4_request" or not parts.get("Signature"):
        return None
    return {
        "access_key_id": scope[0],
        "date": scope[1],
        "region": scope[2],
        "service": scope[3],
        "signed_headers": parts.get("SignedHeaders", ""),
        "signature": parts["Signature"],
    }


def verify(
    secret_access_key: str,
    method: str,
    url: str,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes,
    *,
    now: datetime.datetime,
    max_skew: float = 300.0,
) -> bool:
    """Whether a client's SigV4 signature was made with ``secret_access_key`` for this
    request (the headers it signed, its body), within ``max_skew`` seconds of ``now``."""
    import hmac

    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    values: dict[bytes, bytes] = {}
    for k, v in headers:
        values.setdefault(k.lower(), v)
    authorization = values.get(b"authorization", b"").decode("latin-1")
    parts = parse_authorization(authorization)
    stamp = values.get(b"x-amz-date", b"").decode("latin-1")
    if parts is None or not stamp.startswith(parts["date"]):
        return False
    try:
        when = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        return False
    if abs((now - when).total_seconds()) > max_skew:
        return False
    names = [n for n in parts["signed_headers"].split(";") if n]
    if "host" not in names:
        return False
    declared = values.get(b"x-amz-content-sha256")
    if declared is not None and declared.decode("latin-1") != hashlib.sha256(body).hexdigest():
        return False  # a signature over a declared hash (or none): not over this body
    signed: dict[str, Any] = {}
    for name in names:
        value = values.get(name.encode())
        if value is None:
            return False
        signed[name] = value.decode("latin-1")
    request = AWSRequest(method=method, url=url, data=body, headers=signed)
    request.context["timestamp"] = stamp
    auth = SigV4Auth(
        Credentials(parts["access_key_id"], secret_access_key),
        parts["service"],
        parts["region"],
    )
    canonical = auth.canonical_request(request)
    expected = auth.signature(auth.string_to_sign(request, canonical), request)
    return hmac.compare_digest(expected, parts["signature"])
