"""The changes to issued keys, as the admin API and the CLI make them.

Each change is checked against the configuration (a client configured in
the file is issued a key only when the call says ``existing_client``, and a
new client's name must not be a configured one's: ``NameClash``; routes must
exist), written to the store, applied to this process's registry at once,
logged as one audit line (who, what, which key id; never a secret) and
counted in ``gateway_key_changes_total{action}``. A secret is returned once,
by ``create`` and ``rotate``; only its digest is kept.

``who`` owns what it creates: a listing, a read and a change see only the
keys their caller created (another's id is ``NotFound``, as an unknown one
is). The CLI (``who = None``) sees every key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.keys.record import (
    SHOWN_PREFIX,
    IssuedKey,
    KeyRequest,
    KeyUpdate,
    digest_of,
    metadata_size,
    new_id,
    new_secret,
)
from gateway.keys.registry import Registry
from gateway.keys.store import Conflict, DigestTaken, KeyStore, NameTaken
from gateway.settings import IssuedKeys, Settings

__all__ = ["Invalid", "KeyService", "NameClash", "NotFound", "TooLarge"]

audit = logging.getLogger("gateway.keys")

#: Times a change is read and written again when another writer came between.
_ATTEMPTS = 8


class NotFound(Exception):
    """No such key (or not one of the caller's)."""


class NameClash(Exception):
    """The client's name is taken (a configured client, or another issued key)."""


class Invalid(ValueError):
    """A value the configuration does not allow; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class TooLarge(Exception):
    """Metadata larger than ``keys.max_metadata_bytes``."""


class KeyService:
    """Create, read, change and revoke issued keys."""

    def __init__(
        self,
        settings: Settings,
        store: KeyStore,
        registry: Registry | None = None,
        on_change: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config: IssuedKeys = settings.keys
        self.store = store
        self.registry = registry
        self._on_change = on_change
        self._clock = clock
        self._clients = {c.name: c for c in settings.clients}
        self._teams = {t.name for t in settings.teams}
        self._routes = {r.name for r in settings.effective_routes()}
        self._configured_digests = set(settings.client_key_sha256).union(
            *(c.key_sha256 for c in settings.clients),
            *(r.client_key_sha256 or () for r in settings.effective_routes()),
        )

    # -- reads -----------------------------------------------------------------------------

    async def list(self, who: str | None) -> list[dict[str, Any]]:
        _, keys = await self.store.load()
        used = await self.store.last_used()
        now = self._clock()
        mine = [k for k in keys.values() if who is None or k.created_by == who]
        mine.sort(key=lambda k: (k.created_at, k.id))
        return [k.public(now, self._last_used(k.id, used)) for k in mine]

    async def show(self, key_id: str, who: str | None) -> dict[str, Any]:
        key = await self._get(key_id, who)
        used = await self.store.last_used()
        return key.public(self._clock(), self._last_used(key_id, used))

    def _last_used(self, key_id: str, stored: dict[str, float]) -> float | None:
        local = self.registry.last_used(key_id) if self.registry is not None else None
        found = [t for t in (local, stored.get(key_id)) if t is not None]
        return max(found) if found else None

    async def _get(self, key_id: str, who: str | None) -> IssuedKey:
        key = (await self.store.get([key_id])).get(key_id) if key_id.isprintable() else None
        if key is None or (who is not None and key.created_by != who):
            raise NotFound
        return key

    # -- changes ---------------------------------------------------------------------------

    async def create(self, request: KeyRequest, who: str | None) -> tuple[dict[str, Any], str]:
        """The new key's view and its secret ("" when a digest was handed in)."""
        self._check_scope(request, request.client, request.existing_client)
        configured = self._clients.get(request.client)
        if request.team is not None and request.team not in self._teams:
            raise Invalid("team", f"no team {request.team} is configured")
        if configured is not None and request.team not in (None, configured.team):
            raise Invalid("team", f"client {request.client}'s team is in the configuration")
        if configured is not None:
            request = request.model_copy(update={"team": configured.team})
        now = self._clock()
        secret = "" if request.key_sha256 else new_secret()
        digests = request.key_sha256 or [digest_of(secret)]
        if self._configured_digests.intersection(digests):
            raise Invalid("key_sha256", "this digest is a configured key's: remove it there first")
        expires_at = request.expires_at
        if request.expires_in_seconds is not None:
            expires_at = now + request.expires_in_seconds
        fields = request.model_dump(exclude={"expires_in_seconds", "key_sha256", "expires_at"})
        key = IssuedKey(
            **fields,
            expires_at=expires_at,
            id=new_id(),
            digests=[(d, None) for d in dict.fromkeys(digests)],
            shown_prefix=secret[:SHOWN_PREFIX],
            created_at=now,
            created_by=who or "cli",
        )
        try:
            version = await self.store.create(
                key, not request.existing_client, self.config.max_keys
            )
        except NameTaken:
            raise NameClash(f"an issued key is client {request.client} already") from None
        except DigestTaken:
            raise Invalid("key_sha256", "another issued key has this digest") from None
        self._changed("create", key, version, who)
        return key.public(now), secret

    async def update(self, key_id: str, update: KeyUpdate, who: str | None) -> dict[str, Any]:
        def change(key: IssuedKey) -> IssuedKey:
            merged = IssuedKey.model_validate(
                {**key.model_dump(), **update.model_dump(exclude_unset=True)}
            )
            self._check_scope(merged, key.client, key.existing_client)
            return merged

        key, _ = await self._change(key_id, who, "update", change)
        return key.public(self._clock())

    async def rotate(
        self, key_id: str, overlap_seconds: float | None, who: str | None
    ) -> tuple[dict[str, Any], str]:
        secret = new_secret()
        now = self._clock()
        overlap = (
            self.config.rotation_overlap_seconds if overlap_seconds is None else overlap_seconds
        )

        def change(key: IssuedKey) -> IssuedKey:
            if key.revoked_at is not None:
                raise Invalid("id", "a revoked key is not rotated")
            kept = [(d, u if u is not None else now + overlap) for d, u in key.digests]
            kept = [(d, u) for d, u in kept if u > now]  # past their overlap: gone
            digests = [*kept, (digest_of(secret), None)]
            return key.model_copy(
                update={"digests": digests, "shown_prefix": secret[:SHOWN_PREFIX]}
            )

        key, _ = await self._change(key_id, who, "rotate", change, digest_of(secret))
        return key.public(now), secret

    async def revoke(self, key_id: str, who: str | None) -> dict[str, Any]:
        now = self._clock()

        def change(key: IssuedKey) -> IssuedKey:
            if key.revoked_at is not None:
                return key
            return key.model_copy(update={"revoked_at": now})

        key, _ = await self._change(key_id, who, "revoke", change)
        return key.public(now)

    async def _change(
        self,
        key_id: str,
        who: str | None,
        action: str,
        change: Callable[[IssuedKey], IssuedKey],
        new_digest: str | None = None,
    ) -> tuple[IssuedKey, int]:
        for _ in range(_ATTEMPTS):
            current = await self._get(key_id, who)
            changed = change(current)
            if changed is current:
                return current, 0  # nothing to do (a second revoke)
            changed = changed.model_copy(update={"rev": current.rev + 1})
            try:
                version = await self.store.replace(changed, new_digest)
            except Conflict:
                continue
            self._changed(action, changed, version, who)
            return changed, version
        raise Conflict

    def _check_scope(self, request: KeyUpdate, client: str, existing: bool) -> None:
        configured = self._clients.get(client)
        if existing and configured is None:
            raise Invalid("client", f"no client {client} is configured")
        if not existing and configured is not None:
            raise NameClash(
                f"client {client} is configured in the file: say existing_client: true "
                "to issue it a key"
            )
        if existing and _has_limits(request):
            raise Invalid(
                "limits", f"client {client}'s limits are in the configuration; set them there"
            )
        unknown = sorted(
            set(request.routes or ()).union(request.route_limits).difference(self._routes)
        )
        if unknown:
            raise Invalid("routes", f"no such route: {', '.join(unknown)}")
        if configured is not None and configured.routes is not None and request.routes:
            beyond = sorted(set(request.routes).difference(configured.routes))
            if beyond:
                raise Invalid("routes", f"client {client} may not use {', '.join(beyond)}")
        if metadata_size(request.metadata) > self.config.max_metadata_bytes:
            raise TooLarge(f"metadata is larger than {self.config.max_metadata_bytes} bytes")

    def _changed(self, action: str, key: IssuedKey, version: int, who: str | None) -> None:
        if self.registry is not None:
            self.registry.apply(key, version)
        if self._on_change is not None:
            self._on_change(action)
        audit.info("key %s: id=%s client=%s by=%s", action, key.id, key.client, who or "cli")


def _has_limits(request: KeyUpdate) -> bool:
    return (
        request.limits.any()
        or any(v.any() for v in request.route_limits.values())
        or any(v.any() for v in request.model_limits.values())
        or request.budget_enforcement != "estimate"
        or request.unpriced != "refuse"
    )
