"""The closed vocabularies of what went wrong with a request, outside a stream's verdict.

``AttemptError``: why one attempt got no response head (the transport's
classification). ``RequestError``: the access log's and the metrics'
``error`` of a request, an attempt error or a failure of the relayed body.
Both are ``StrEnum``: the log and the labels carry their values unchanged.
"""

from __future__ import annotations

import enum

__all__ = ["AttemptError", "RequestError"]


class AttemptError(enum.StrEnum):
    """No response head: connecting failed or timed out, or the head was not HTTP."""

    CONNECT_ERROR = "connect_error"
    CONNECT_TIMEOUT = "connect_timeout"
    UPSTREAM_BAD_RESPONSE = "upstream_bad_response"


class RequestError(enum.StrEnum):
    """A request's ``error`` (None: nothing went wrong outside a stream's verdict)."""

    CONNECT_ERROR = "connect_error"
    CONNECT_TIMEOUT = "connect_timeout"
    UPSTREAM_BAD_RESPONSE = "upstream_bad_response"
    #: a plain body that broke after its head went out
    UPSTREAM_DISCONNECT = "upstream_disconnect"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    #: the client stopped taking bytes: its connection was aborted
    CLIENT_STALLED = "client_stalled"
    #: a 2xx JSON answer that does not parse (relayed unchanged)
    INVALID_JSON = "invalid_json"
    #: the upstream refused a WebSocket handshake (its status relayed)
    UPSTREAM_STATUS = "upstream_status"

    @classmethod
    def of(cls, error: AttemptError) -> RequestError:
        return cls(error.value)
