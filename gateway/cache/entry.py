"""What a cache entry holds in its stream log, and the trailer a hit ends with.

An entry is one stream log as every log is written (``gateway.streamlog``: the
head, then the body's events as the client got them), and the log's ``End``
carries the trailer the client got (the annotation; empty for a
plain answer) and these fields: ``stored`` ("1": an entry that may be served;
"0": refused, kept only for the requests that followed it live), ``reason``
(the verdict's, or why it was refused), ``at`` (when it was stored, Unix
seconds), ``streamed``, ``input`` / ``output`` (usage, where reported) and
``aborted`` (the leader's response never ended: its followers are cut too).
"""

from __future__ import annotations

from gateway.proxy.headers import RawHeaders

__all__ = [
    "entry_name",
    "followed_name",
    "hit_trailer",
    "refused_name",
    "with_request_id",
]


def with_request_id(headers: RawHeaders, request_id: str) -> RawHeaders:
    """The stored head's headers with this request's id in place of the first one's, and
    none of the gateway's own per-request headers of the first answer (its
    ``X-Gateway-Stream-Id`` names a stream of the first client's, not this one's) but
    ``X-Gateway-Upstream``: the upstream whose answer was stored."""
    out = [
        (k, v)
        for k, v in headers
        if k != b"x-request-id" and (k == b"x-gateway-upstream" or not k.startswith(b"x-gateway-"))
    ]
    out.append((b"x-request-id", request_id.encode()))
    return out


def hit_trailer(reason: str, age: int, request_id: str) -> bytes:
    """The comment line a replayed stream ends with (docs/wire-contract.md, "Cache")."""
    return (
        f": gateway outcome=complete reason={reason} cache=hit age={age} request_id={request_id}\n"
    ).encode()


def entry_name(key: str) -> str:
    """The store name that points at a key's entry (or its leader's log)."""
    return "cache:" + key


def followed_name(stream_id: str) -> str:
    """The store name that says a leader's log has followers (its leader reads on when
    its own client leaves)."""
    return "cache-followed:" + stream_id


def refused_name(key: str) -> str:
    """The store name that holds why a key's last answer was not stored."""
    return "cache-refused:" + key
