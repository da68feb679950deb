"""The client edge of a WebSocket connection: frame limits, pings, a client that stops reading.

``EdgeWebSocketProtocol`` is uvicorn's sans-IO websockets protocol with the
checks only the connection can make, configured at run time from the
lifespan state (``ws_edge_state``), as ``gateway.server.edge`` is for HTTP:

- a message (its frames joined) of at most ``max_ws_message_bytes``, else
  the close code 1009 (the websockets library's own check, before anything
  of the message reaches the app);
- keepalive pings to the client every ``ws_ping_interval_seconds``; one not
  answered within as many seconds again closes the connection (1011);
- the client's pings are answered, but more than
  ``ws_max_client_messages_per_second`` pings in one second close the
  connection (1008): a flood of pings whose pongs it never reads would
  otherwise grow the gateway's write buffer. The pings of what one read
  brought are counted before any of them is answered, so a flood in one
  write gets its 1008 and none of its pongs;
- a text message that is not UTF-8 closes the connection (1007) with one
  warning line, not a traceback (the client's mistake, not the gateway's);
- a client that stops reading: when the write buffer is full (asyncio's
  ``pause_writing``) for ``timeouts.client_send`` seconds, the connection is
  aborted and the app's pending send fails; ``stalled`` in the scope's
  ``gateway.ws`` extension then says why (``client_stalled``).

Per-message deflate is off: it costs CPU on every message, and the relay
forwards text the way it came.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState
from websockets.frames import Frame, Opcode

from gateway.proxy.connection import WS_EXTENSION

__all__ = ["WS_STATE_KEY", "EdgeWebSocketProtocol", "WsEdge", "ws_edge_state"]

WS_STATE_KEY = "gateway.ws_edge"


@dataclass(frozen=True, slots=True)
class WsEdge:
    max_message_bytes: int = 16 * 1024 * 1024
    ping_interval: float = 20.0
    max_pings_per_second: int = 50
    client_send: float = 60.0


_DEFAULT = WsEdge()
#: Seconds a failed connection waits for the client's close reply before it is closed.
_LINGER = 1.0

log = logging.getLogger("gateway")


def ws_edge_state(edge: WsEdge) -> dict[str, Any]:
    """The lifespan state that configures the edge of every WebSocket connection."""
    return {WS_STATE_KEY: edge}


class EdgeWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets (sans-IO) protocol with the gateway's limits."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        edge = app_state.get(WS_STATE_KEY)
        self._ws_edge = edge if isinstance(edge, WsEdge) else _DEFAULT
        self.conn.max_message_size = self._ws_edge.max_message_bytes
        self.ping_interval = self._ws_edge.ping_interval
        self.ping_timeout = self._ws_edge.ping_interval
        self._pings = 0
        self._ping_window = 0.0
        self._stall_timer: asyncio.TimerHandle | None = None
        self._facts: dict[str, object] = {"stalled": False}

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope["extensions"][WS_EXTENSION] = self._facts

    def handle_events(self) -> None:
        """Count the pings of this read before any is answered: the websockets parser
        queued a pong for each as it read them, and the first ``handle_ping`` would
        write them all. Over the limit, those pongs are dropped unsent."""
        events = self.conn.events_received()
        pings = sum(1 for e in events if isinstance(e, Frame) and e.opcode is Opcode.PING)
        if pings and not self.close_sent:
            now = self.loop.time()
            if now - self._ping_window >= 1.0:
                self._ping_window = now
                self._pings = 0
            self._pings += pings
            if self._pings > self._ws_edge.max_pings_per_second:
                self.conn.data_to_send()  # the queued pongs (and nothing the app sent)
                self._facts["ping_flood"] = True
                self.conn.fail(1008, "too many pings")
                self.handle_parser_exception()
                return
        # uvicorn's dispatch reads the events again: hand them back.
        self.conn.events[:0] = events
        super().handle_events()

    def handle_ping(self) -> None:
        if self.close_sent:
            self.conn.data_to_send()  # the pong of a ping read after the close: unsent
            return
        super().handle_ping()

    def send_receive_event_to_app(self) -> None:
        """uvicorn's, but a text message that is not UTF-8 closes the connection with
        1007 and one warning line (uvicorn logs a traceback per message)."""
        data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
        self.frames = []
        if self.close_sent:
            return  # past the close: dropped, reading goes on until the client's reply
        if self.curr_msg_data_type == "text":
            try:
                text = data.decode()
            except UnicodeDecodeError:
                log.warning(
                    "%s - WebSocket text message is not UTF-8: closed (1007)",
                    "%s:%d" % self.client if self.client else "-",  # noqa: UP031
                )
                self.conn.send_close(1007)
                self.handle_parser_exception()
                return
            self.queue.put_nowait({"type": "websocket.receive", "text": text})
        else:
            self.queue.put_nowait({"type": "websocket.receive", "bytes": data})
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def handle_parser_exception(self) -> None:
        """The connection failed (an oversized message, a protocol error, a ping flood):
        tell the app once, send the close frame, and linger before closing.

        uvicorn closes the transport at once; with the client's bytes still arriving
        that resets the connection, and the reset can destroy the close frame before
        the client reads it. Reading goes on (and is dropped) until the client's close
        reply, or ``_LINGER`` seconds.
        """
        if self.close_sent:
            return
        sent = self.conn.close_sent
        code, reason = (sent.code, sent.reason) if sent is not None else (1011, "")
        self.queue.put_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
        self.close_timer = self.loop.call_later(_LINGER, self.transport.close)

    def keepalive_timeout(self) -> None:
        self._facts["ping_timeout"] = True
        super().keepalive_timeout()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall_timer is None:
            self._stall_timer = self.loop.call_later(self._ws_edge.client_send, self._stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _stalled(self) -> None:
        self._stall_timer = None
        self._facts["stalled"] = True
        self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        super().connection_lost(exc)
