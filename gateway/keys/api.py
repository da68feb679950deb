"""The admin API of issued keys, under each route's prefix: ``{prefix}/gateway/keys``.

    POST   {prefix}/gateway/keys               create  (201, Location; the secret once)
    GET    {prefix}/gateway/keys               list the caller's keys (never a secret)
    GET    {prefix}/gateway/keys/{id}          read one
    PATCH  {prefix}/gateway/keys/{id}          change its scope, expiry, limits, metadata
    POST   {prefix}/gateway/keys/{id}/rotate   a new secret; the old one for ``overlap_seconds``
    POST   {prefix}/gateway/keys/{id}/revoke   (or DELETE {prefix}/gateway/keys/{id})

Only a named client with ``keys_admin = true`` in the configuration may call
it (its key stays in the file or the environment): no key or an unknown one
is 401, any other client 403, and nothing changes. Errors are JSON in the
ecosystem's admin shape, ``{"error": {"message", "type", "code", "param"}}``:
404 for an unknown id and for another admin's alike, 409 on a name clash,
422 naming the field of a bad value, 413 for a body or metadata too large.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from gateway.keys.record import KeyRequest, KeyUpdate
from gateway.keys.service import Invalid, KeyService, NameClash, NotFound, TooLarge
from gateway.keys.store import Conflict, StoreFull, StoreUnavailable
from gateway.policy.routing import Route
from gateway.proxy.admission import Admission, ClientGone, Refused
from gateway.proxy.headers import request_id_of

__all__ = ["ADMIN_PATH", "KeysApi"]

ADMIN_PATH = "/gateway/keys"
#: The largest body a call may send beyond the metadata's own limit.
_BODY_MARGIN = 16 * 1024


class _Answer(Exception):
    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


class KeysApi:
    """Answers the admin API's calls on every route's prefix."""

    def __init__(self, service: KeyService, admission: Admission, admins: frozenset[str]) -> None:
        self.service = service
        self.admission = admission
        self.admins = admins
        self.max_body = service.config.max_metadata_bytes + _BODY_MARGIN

    @staticmethod
    def owns(route: Route, path: str) -> bool:
        rest = path[len(route.config.prefix) :]
        return rest == ADMIN_PATH or rest.startswith(ADMIN_PATH + "/")

    async def handle(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = request_id_of(scope)
        try:
            status, body, headers = await self._answer(route, scope, receive)
        except _Answer as answer:
            type_ = {401: "authentication_error", 403: "permission_error"}.get(
                answer.status, "invalid_request_error"
            )
            error = {
                "message": answer.message,
                "type": type_,
                "code": answer.code,
                "param": answer.param,
            }
            status, body, headers = answer.status, {"error": error}, []
        except ClientGone:
            return
        payload = json.dumps(body, separators=(",", ":")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(payload)),
                    (b"cache-control", b"no-store"),
                    (b"x-request-id", request_id.encode()),
                    *headers,
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload, "more_body": False})

    async def _answer(
        self, route: Route, scope: Scope, receive: Receive
    ) -> tuple[int, Any, list[tuple[bytes, bytes]]]:
        who = self._admin(route, scope)
        base = route.config.prefix + ADMIN_PATH
        parts = scope["path"][len(base) :].strip("/").split("/") if scope["path"] != base else []
        parts = [p for p in parts if p]
        method = scope["method"]
        service = self.service
        try:
            if not parts and method == "POST":
                request = KeyRequest.model_validate(await self._json(scope, receive))
                view, secret = await service.create(request, who)
                location = f"{base}/{view['id']}".encode()
                return 201, {**view, "key": secret or None}, [(b"location", location)]
            if not parts and method == "GET":
                return 200, {"object": "list", "data": await service.list(who)}, []
            if len(parts) == 1 and method == "GET":
                return 200, await service.show(parts[0], who), []
            if len(parts) == 1 and method == "PATCH":
                update = KeyUpdate.model_validate(await self._json(scope, receive))
                return 200, await service.update(parts[0], update, who), []
            if len(parts) == 1 and method == "DELETE":
                return 200, await service.revoke(parts[0], who), []
            if len(parts) == 2 and parts[1] == "revoke" and method == "POST":
                return 200, await service.revoke(parts[0], who), []
            if len(parts) == 2 and parts[1] == "rotate" and method == "POST":
                body = await self._json(scope, receive, empty_ok=True)
                overlap = body.get("overlap_seconds")
                if overlap is not None and (
                    not isinstance(overlap, int | float) or isinstance(overlap, bool) or overlap < 0
                ):
                    raise _Answer(
                        422, "overlap_seconds must be a number >= 0", "invalid", "overlap_seconds"
                    )
                view, secret = await service.rotate(parts[0], overlap, who)
                return 200, {**view, "key": secret}, []
        except ValidationError as exc:
            error = exc.errors()[0]
            field = ".".join(str(p) for p in error["loc"]) or None
            raise _Answer(422, f"{field}: {error['msg']}", "invalid", field) from None
        except Invalid as exc:
            raise _Answer(422, str(exc), "invalid", exc.field) from None
        except NotFound:
            raise _Answer(404, "No such key.", "key_not_found") from None
        except NameClash as exc:
            raise _Answer(409, str(exc), "name_clash", "client") from None
        except TooLarge as exc:
            raise _Answer(413, str(exc), "too_large", "metadata") from None
        except StoreFull:
            raise _Answer(
                409, "The key store is full (keys.max_keys); revoke keys first.", "store_full"
            ) from None
        except Conflict:
            raise _Answer(409, "The key changed meanwhile; try again.", "conflict") from None
        except StoreUnavailable:
            raise _Answer(503, "The key store is unavailable.", "store_unavailable") from None
        raise _Answer(405 if len(parts) <= 2 else 404, "No such call.", "no_route")

    def _admin(self, route: Route, scope: Scope) -> str:
        """The admin client calling, or _Answer (401 without a usable key, 403 else)."""
        try:
            caller = self.admission.check_key(route, scope["headers"])
        except Refused as refused:
            raise _Answer(refused.status, refused.message, refused.label) from None
        if caller.key_id is not None or caller.name not in self.admins:
            raise _Answer(403, "This client may not manage keys.", "forbidden")
        return caller.name

    async def _json(self, scope: Scope, receive: Receive, empty_ok: bool = False) -> Any:
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise _Answer(413, f"The body exceeds {self.max_body} bytes.", "too_large")
            chunks.append(chunk)
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        if not raw.strip() and empty_ok:
            return {}
        try:
            body = json.loads(raw)
        except ValueError:
            raise _Answer(422, "The body is not JSON.", "invalid") from None
        if not isinstance(body, dict):
            raise _Answer(422, "The body is not a JSON object.", "invalid")
        return body
