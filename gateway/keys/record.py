"""An issued key as it is kept: its identity, scope, limits and digests, never a secret.

``KeyRequest`` is what a create or update call may say (pydantic, unknown
fields refused, so that a bad value is a 422 naming its field). ``IssuedKey``
is the stored document: the same fields, plus the id, the digests (the same
SHA-256 hex digest as the configuration's ``key_sha256``, each with the time
after which it is refused: a rotated secret's overlap), who created it and
when, its revision (a write that read an older one is retried), and its
revocation. The secret exists once, in the answer that issues it.

A key is either its own client (``client`` is a new name: the key's limits
are that client's) or a key of a client configured in the file
(``existing_client``: that client's routes and limits apply, and the key may
narrow its routes and models).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.settings import _CLIENT_NAME, ANONYMOUS, ClientConfig, ClientLimits

__all__ = [
    "SECRET_PREFIX",
    "IssuedKey",
    "KeyRequest",
    "KeyUpdate",
    "digest_of",
    "new_id",
    "new_secret",
]

#: Every issued secret starts so (a leaked one is recognisable by scanners).
SECRET_PREFIX = "gwk_"
#: The characters of a secret a listing shows.
SHOWN_PREFIX = 8

_HEX = re.compile(r"^[0-9a-fA-F]{64}$")
State = Literal["active", "expired", "revoked"]
Metadata = dict[str, str | int | float | bool | None]


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def new_id() -> str:
    return "key_" + secrets.token_hex(12)


def digest_of(secret: str | bytes) -> str:
    raw = secret.encode() if isinstance(secret, str) else secret
    return hashlib.sha256(raw).hexdigest()


def _name(value: str | None) -> str | None:
    if value is not None and (not _CLIENT_NAME.match(value) or value == ANONYMOUS):
        raise ValueError(f"must be 1-40 of [a-z0-9_-], and not {ANONYMOUS!r}")
    return value


class KeyUpdate(BaseModel):
    """What an update may change: scope, expiry, limits, metadata."""

    model_config = ConfigDict(extra="forbid")

    routes: list[str] | None = Field(None, description="Routes it may use (None: every one).")
    models: list[str] | None = Field(None, description="Models it may ask for (None: any).")
    expires_at: float | None = Field(None, gt=0, description="Unix time it stops working.")
    limits: ClientLimits = ClientLimits()
    route_limits: dict[str, ClientLimits] = Field(default_factory=dict)
    model_limits: dict[str, ClientLimits] = Field(default_factory=dict)
    budget_enforcement: Literal["estimate", "strict"] = "estimate"
    unpriced: Literal["refuse", "allow"] = "refuse"
    metadata: Metadata = Field(default_factory=dict)

    @field_validator("models")
    @classmethod
    def _models(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not m or len(m) > 200 for m in value):
            raise ValueError("each model is 1-200 characters")
        return value


class KeyRequest(KeyUpdate):
    """A create call: whose key, and optionally a digest to take over instead of a new
    secret (a key moving from the file to the store)."""

    client: str = Field(
        description="The client it authenticates as: a new name, or a configured "
        "client's with existing_client."
    )
    existing_client: bool = False
    team: str | None = None
    expires_in_seconds: float | None = Field(None, gt=0)
    key_sha256: list[str] | None = Field(
        None,
        min_length=1,
        max_length=8,
        description="Digests to take over (a client's keys moving from the file to the "
        "store) instead of a new secret.",
    )

    @field_validator("client", "team")
    @classmethod
    def _names(cls, value: str | None) -> str | None:
        return _name(value)

    @field_validator("key_sha256", mode="before")
    @classmethod
    def _digests(cls, value: Any) -> Any:
        value = [value] if isinstance(value, str) else value
        if isinstance(value, list) and not all(isinstance(d, str) and _HEX.match(d) for d in value):
            raise ValueError("each is a SHA-256 digest: 64 hex digits")
        return [d.lower() for d in value] if isinstance(value, list) else value


class IssuedKey(KeyUpdate):
    """The stored document of one key (JSON in the store; never a secret)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    client: str
    existing_client: bool = False
    team: str | None = None
    #: [hex digest, refused after (unix time) or None]: the current one last
    digests: list[tuple[str, float | None]]
    shown_prefix: str = ""
    created_at: float
    created_by: str
    revoked_at: float | None = None
    rev: int = 0

    def state(self, now: float) -> State:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "active"

    def limited(self) -> bool:
        return (
            self.limits.any()
            or any(v.any() for v in self.route_limits.values())
            or any(v.any() for v in self.model_limits.values())
        )

    def as_client(self) -> ClientConfig:
        """The named client the limiter knows it as (its own limits, its client's name)."""
        return ClientConfig(
            name=self.client,
            key_sha256=[self.digests[-1][0]],
            routes=self.routes,
            limits=self.limits,
            route_limits=self.route_limits,
            model_limits=self.model_limits,
            budget_enforcement=self.budget_enforcement,
            team=self.team,
            unpriced=self.unpriced,
        )

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> IssuedKey:
        return cls.model_validate_json(text)

    def public(self, now: float | None = None, last_used: float | None = None) -> dict[str, Any]:
        """What a listing shows: never a secret, a digest's start only."""
        now = time.time() if now is None else now
        view = self.model_dump(exclude={"digests", "rev", "shown_prefix"})
        view["prefix"] = self.shown_prefix
        view["digest_start"] = self.digests[-1][0][:8]
        view["state"] = self.state(now)
        view["last_used"] = last_used
        return view


def metadata_size(metadata: Metadata) -> int:
    return len(json.dumps(metadata, separators=(",", ":")).encode())
