"""The simulator's Responses WebSocket mode (``GET /v1/responses`` with an upgrade).

Each ``response.create`` message is answered with the events the SSE stream
of the same body would carry, one text message per event, and the
connection stays open for the next one. The knobs are the HTTP ones: the
handshake's ``x-sim-*`` headers for every response of the connection, or a
``"sim"`` object in one ``response.create`` for that response only. The
faults act the same way, in this framing's terms:

- a cut (``drop_after_text``, ``drop_mid_event``, ``drop_mid_utf8``,
  ``drop_before_done``, ``abort_mid_body``) drops the connection without a
  close frame (the client sees 1006), or closes it with the code in
  ``ws_close_code`` (knob ``x-sim-ws-close-code``) when one is given;
- ``stall_mid_stream`` and ``heartbeats_forever`` go silent (WebSocket has no
  comments); ``invalid_json``, ``invalid_shape``, ``error_event`` and the
  other content faults send their event as a message.

A ``response.create`` with a ``stream_id`` (a lane) gets it in each of its
events; responses are answered one after the other. A ``response.create``
with ``"generate": false`` (a client warming the connection up) gets a
response with no output; one whose input ends with a tool's output is
answered in text (the tool ran), so an agent's turn ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any, Final

from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.simulator._knobs import KnobError, Knobs, read_knobs
from gateway.simulator._protocols import make_plan
from gateway.simulator._renderers import make_renderer
from gateway.simulator._script import Abort, Sleep, Write, stream_steps

__all__ = ["serve_responses_websocket"]

_CUTS: Final = frozenset(
    {"drop_after_text", "drop_mid_event", "drop_mid_utf8", "drop_before_done", "abort_mid_body"}
)


_YIELD_EVERY_BYTES: Final = 256 * 1024


class _Cut(Exception):
    """The scripted response ends the connection here."""


def _messages(data: bytes) -> tuple[list[str], bool]:
    """The events' data in ``data`` (SSE), and whether it ended inside an event."""
    text = data.decode("utf-8", "replace").replace("\r\n", "\n")
    blocks = text.split("\n\n")
    partial = blocks[-1] != ""
    out: list[str] = []
    for block in blocks[:-1]:  # the last one is empty, or an unfinished event
        lines = [line[5:].lstrip(" ") for line in block.split("\n") if line.startswith("data:")]
        if lines:
            out.append("\n".join(lines))
    return out, partial


def _error(status: int, code: str, message: str) -> str:
    return json.dumps(
        {
            "type": "error",
            "status": status,
            "error": {"type": "invalid_request_error", "code": code, "message": message},
        }
    )


async def serve_responses_websocket(
    websocket: WebSocket, *, default_tps: float, default_tokens: int, default_fault: str
) -> None:
    """Answer ``response.create`` messages until the client closes."""
    await websocket.accept()
    headers = {k.lower(): v for k, v in websocket.headers.items()}
    try:
        while True:
            text = await websocket.receive_text()
            try:
                body = json.loads(text)
            except ValueError:
                body = None
            if not isinstance(body, dict) or body.get("type") != "response.create":
                await websocket.send_text(_error(400, "invalid_event", "Expected response.create."))
                continue
            body = {k: v for k, v in body.items() if k != "type"}
            try:
                knobs = read_knobs(
                    headers,
                    body,
                    default_tps=default_tps,
                    default_tokens=default_tokens,
                    default_fault=default_fault,
                )
            except KnobError as exc:
                await websocket.send_text(_error(400, "invalid_sim_knob", str(exc)))
                continue
            if body.get("generate") is False:
                knobs = dataclasses.replace(knobs, tokens=0)
            if _answers_a_tool(body):
                body.pop("tools", None)  # the tool ran: the model answers in text now
            lane = body.get("stream_id")
            await _respond(
                websocket,
                body,
                knobs,
                len(text),
                _close_code(headers, body),
                f',"stream_id":{json.dumps(lane)}}}' if isinstance(lane, str) else None,
            )
    except WebSocketDisconnect:
        return
    except _Cut:
        return  # returning without a close frame: the server drops the connection


def _answers_a_tool(body: dict[str, Any]) -> bool:
    """The input ends with a tool's output (an agent's next turn after running it)."""
    items = body.get("input")
    if not isinstance(items, list) or not items or not isinstance(items[-1], dict):
        return False
    return items[-1].get("type") in ("function_call_output", "custom_tool_call_output")


def _close_code(headers: dict[str, str], body: dict[str, Any]) -> int | None:
    raw = headers.get("x-sim-ws-close-code")
    if raw is None:
        sim = body.get("sim")
        raw = sim.get("ws_close_code") if isinstance(sim, dict) else None
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


async def _respond(
    websocket: WebSocket,
    body: dict[str, Any],
    knobs: Knobs,
    size: int,
    close_code: int | None,
    lane_tail: str | None,
) -> None:
    """One response; ``lane_tail`` ends each event's object with its ``stream_id``."""
    plan = make_plan("responses", body, knobs, size)
    renderer = make_renderer(plan, crlf=False)
    pace = 1.0 / knobs.tps if knobs.tps > 0 else 0.0
    unyielded = 0
    for step in stream_steps(renderer, knobs):
        if isinstance(step, Write):
            messages, partial = _messages(step.data)
            for message in messages:
                if lane_tail is not None and message.endswith("}"):
                    message = message[:-1] + lane_tail
                await websocket.send_text(message)
            unyielded += len(step.data)
            if unyielded >= _YIELD_EVERY_BYTES:
                # A send that need not wait does not yield: let the server's other
                # connections run during a long unpaced answer.
                unyielded = 0
                await asyncio.sleep(0)
            if partial:
                await _cut(websocket, close_code)
            if step.paced and pace:
                await asyncio.sleep(pace)
        elif isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
        elif isinstance(step, Abort):
            await _cut(websocket, close_code)
    if knobs.fault in _CUTS:
        await _cut(websocket, close_code)


async def _cut(websocket: WebSocket, close_code: int | None) -> None:
    if close_code is not None:
        await websocket.close(close_code, "simulated close")
    raise _Cut
