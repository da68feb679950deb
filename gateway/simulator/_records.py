"""What the simulator saw of each request, for tests to inspect (``GET /_sim/requests``).

A pure ASGI middleware wraps every request outside ``/_sim/``: it records the
request line, headers (credentials only as presence and SHA-256), the body,
the bytes of response body sent, and how the response ended. It learns of a
client disconnect from the ``http.disconnect`` message the response's
watcher receives, so ``ended`` is set within one event-loop turn of the
server noticing. Records live in a bounded ring keyed by ``x-request-id``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.simulator._wire import SimulatedAbort

__all__ = ["RECORD_SCOPE_KEY", "RecordStore", "RecorderMiddleware", "RequestRecord"]

#: Headers recorded only as ``{"present": true, "sha256": ...}``.
SECRET_HEADERS: Final = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "api-key", "x-goog-api-key"}
)
#: Bodies above this size are counted but not kept.
MAX_RECORDED_BODY: Final = 8 * 1024 * 1024
RECORD_SCOPE_KEY: Final = "gateway.simulator.record"


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    method: str
    path: str
    query: str
    headers: dict[str, Any]
    started: float
    ended: float | None = None
    disconnected: bool = False
    bytes_sent: int = 0
    completed: bool = False
    aborted: bool = False
    status: int | None = None
    fault: str | None = None
    body_size: int = 0
    _body: list[bytes] = field(default_factory=list)
    _finishing: bool = False

    def add_body(self, chunk: bytes) -> None:
        self.body_size += len(chunk)
        if self.body_size <= MAX_RECORDED_BODY:
            self._body.append(chunk)
        else:
            self._body.clear()

    def parsed_body(self) -> Any:
        if not self._body or self.body_size > MAX_RECORDED_BODY:
            return None
        try:
            return json.loads(b"".join(self._body))
        except ValueError:
            return None

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "started": self.started,
            "ended": self.ended,
            "disconnected": self.disconnected,
            "bytes_sent": self.bytes_sent,
            "completed": self.completed,
            "aborted": self.aborted,
            "status": self.status,
            "fault": self.fault,
            "headers": self.headers,
            "body": self.parsed_body(),
            "body_size": self.body_size,
        }


class RecordStore:
    """The latest ``capacity`` request records; a repeated request id replaces the older one."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._records: OrderedDict[str, RequestRecord] = OrderedDict()
        self._anonymous = itertools.count(1)

    def anonymous_id(self) -> str:
        return f"sim-anon-{next(self._anonymous)}"

    def add(self, record: RequestRecord) -> None:
        self._records.pop(record.request_id, None)
        self._records[record.request_id] = record
        while len(self._records) > self.capacity:
            self._records.popitem(last=False)

    def get(self, request_id: str) -> RequestRecord | None:
        return self._records.get(request_id)

    def latest(self, limit: int) -> list[RequestRecord]:
        if limit <= 0:
            return []
        return list(self._records.values())[-limit:]

    def clear(self) -> None:
        self._records.clear()

    def __len__(self) -> int:
        return len(self._records)


def _headers(scope: Scope) -> tuple[dict[str, Any], str | None]:
    recorded: dict[str, Any] = {}
    request_id = None
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        if name == "x-request-id" and request_id is None:
            request_id = value
        if name in SECRET_HEADERS:
            recorded[name] = {
                "present": True,
                "sha256": hashlib.sha256(raw_value).hexdigest(),
            }
        elif name in recorded:
            recorded[name] = f"{recorded[name]}, {value}"
        else:
            recorded[name] = value
    return recorded, request_id


class RecorderMiddleware:
    """Records every request outside ``/_sim/`` into a :class:`RecordStore`."""

    def __init__(self, app: ASGIApp, store: RecordStore) -> None:
        self.app = app
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/_sim/"):
            await self.app(scope, receive, send)
            return
        headers, request_id = _headers(scope)
        record = RequestRecord(
            request_id=request_id or self.store.anonymous_id(),
            method=scope["method"],
            path=scope["path"],
            query=scope.get("query_string", b"").decode("latin-1"),
            headers=headers,
            started=time.monotonic(),
        )
        self.store.add(record)
        scope[RECORD_SCOPE_KEY] = record

        async def recording_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                record.add_body(message.get("body", b""))
            elif (
                message["type"] == "http.disconnect"
                and not record._finishing
                and record.ended is None
            ):
                record.disconnected = True
                record.ended = time.monotonic()
            return message

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
            elif message["type"] == "http.response.body":
                last = not message.get("more_body", False)
                if last:
                    record._finishing = True
                await send(message)
                if not record.disconnected:
                    record.bytes_sent += len(message.get("body", b""))
                    if last:
                        record.completed = True
                        record.ended = time.monotonic()
                return
            await send(message)

        try:
            await self.app(scope, recording_receive, recording_send)
        except SimulatedAbort:
            record.aborted = True
            raise
        finally:
            if record.ended is None:
                record.ended = time.monotonic()
