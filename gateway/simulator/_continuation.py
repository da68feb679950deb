"""Continuation requests at the simulator: a prefilled assistant message is answered with
the rest of the scripted answer after it, exactly, or refused as a model may refuse it.

Styles, as the gateway's ``continuation`` key names them: ``assistant_prefill``
(a final assistant message), ``continue_final_message`` (vLLM's flags too),
``prefix`` (the message has ``"prefix": true``). Messages prefill natively.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.simulator._knobs import Knobs
from gateway.simulator._protocols import Plan
from gateway.simulator._text import text_deltas

__all__ = ["Refusal", "continuation_of", "continue_completion", "continue_plan"]

STYLES = (
    "any",
    "reject",
    "assistant_prefill",
    "continue_final_message",
    "prefix",
    "restart",
    "empty",
)
#: Misbehaving servers that take any prefill: ``restart`` ignores it and answers from the
#: start (text repeated), ``empty`` answers it with a finish and no content.
_TAKES_ANY = frozenset({"any", "restart", "empty"})


@dataclass(frozen=True, slots=True)
class Refusal:
    """A continuation request this simulator does not take: a 400 with ``message``."""

    message: str


def _style(body: dict[str, Any], last: dict[str, Any]) -> str:
    if last.get("prefix") is True:
        return "prefix"
    if body.get("continue_final_message") is True and body.get("add_generation_prompt") is False:
        return "continue_final_message"
    return "assistant_prefill"


def continuation_of(protocol: str, body: dict[str, Any], accepts: str) -> str | Refusal | None:
    """The prefilled text of a continuation request, a refusal, or None (not one)."""
    if protocol not in ("chat", "messages"):
        return None
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return None
    content = last.get("content")
    if isinstance(content, list):
        content = "".join(
            b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"
        )
    if not isinstance(content, str):
        return Refusal("The assistant prefill is not text.")
    if accepts == "reject":
        return Refusal("This model does not support assistant message prefill.")
    if protocol == "messages" and content != content.rstrip():
        # Anthropic's own rule
        return Refusal("final assistant content cannot end with trailing whitespace")
    if protocol == "chat" and accepts not in _TAKES_ANY and _style(body, last) != accepts:
        return Refusal(f"This server continues a final message only as {accepts}.")
    return content


def continue_completion(plan: Plan, knobs: Knobs, prompt: object) -> None:
    """Legacy Completions continue by the partial text appended to the prompt: a prompt
    that ends with how the scripted answer starts is answered with the rest of it."""
    lane = next((lane for lane in plan.lanes if lane.kind == "text"), None)
    if lane is None or not isinstance(prompt, str):
        return
    full = "".join(
        text_deltas(lane.count, seed=knobs.seed, choice=lane.index, surrogate=knobs.surrogate)
    )
    for size in range(min(len(full), len(prompt)), 0, -1):
        if prompt.endswith(full[:size]):
            continue_plan(plan, knobs, full[:size])
            return


def continue_plan(plan: Plan, knobs: Knobs, prefill: str, accepts: str = "any") -> bool:
    """Make ``plan``'s first text lane the rest of its answer after ``prefill``;
    False when ``prefill`` is not how the scripted answer starts. ``restart``: the
    plan is left whole (the prefill ignored); ``empty``: no text at all."""
    lane = next((lane for lane in plan.lanes if lane.kind == "text"), None)
    if lane is None:
        return False
    if accepts == "restart":
        return True
    if accepts == "empty":
        lane.pieces = iter(())
        lane.count = 0
        return True
    # the lane's own pieces: a structured answer's too (``x-sim-structured``)
    pieces = list(lane.pieces)
    full = "".join(pieces)
    if not full.startswith(prefill):
        return False
    rest: list[str] = []
    at = 0
    for piece in pieces:
        end = at + len(piece)
        if end > len(prefill):
            rest.append(piece[max(len(prefill) - at, 0) :])
        at = end
    lane.pieces = iter(rest)
    lane.count = len(rest)
    return True
