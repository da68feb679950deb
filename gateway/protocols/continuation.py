"""Continuation requests: the original request, asking an upstream for the rest of a
partial answer, in the style that upstream understands (its ``continuation`` key).

- ``assistant_prefill``: the partial answer as a final assistant message
  (Anthropic Messages natively, llama.cpp, Ollama, many OpenAI-compatible
  servers);
- ``continue_final_message``: the same, plus ``continue_final_message: true``
  and ``add_generation_prompt: false`` (vLLM);
- ``prefix``: the assistant message gets ``"prefix": true`` (DeepSeek, Mistral);
- legacy Completions (any style but ``none``): the partial text appended to
  the prompt;
- ``regenerate``: the original request unchanged, for upstreams that refuse a
  prefill: the whole answer is asked again and the gateway holds it until it
  has repeated exactly what the client has (``gateway.guard.joint.JointCheck``).

The Responses API and Gemini are not continued. A client's own final
assistant message (its own prefill) is extended, not repeated. Anthropic
refuses a prefill that ends in whitespace: that whitespace is taken off the
prefill, and the continuation's first text repeats it (``Continuation.skip``:
the joint drops it once).

Pure functions of JSON values: no I/O.
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass
from typing import Any

from gateway.guard import Protocol

__all__ = ["Continuation", "ContinuationStyle", "continuation_request"]


class ContinuationStyle(enum.StrEnum):
    """How an upstream continues a partial answer (``upstreams[].continuation``)."""

    NONE = "none"
    ASSISTANT_PREFILL = "assistant_prefill"
    CONTINUE_FINAL_MESSAGE = "continue_final_message"
    PREFIX = "prefix"
    REGENERATE = "regenerate"


@dataclass(frozen=True, slots=True)
class Continuation:
    """A continuation request's body, and the text its answer repeats at the start."""

    body: dict[str, Any]
    skip: str = ""


def continuation_request(
    protocol: Protocol,
    style: ContinuationStyle,
    request: dict[str, Any],
    partial: str,
    *,
    fresh: bool = False,
) -> Continuation | None:
    """The request that asks for the rest after ``partial``, or None (not continuable
    here: no style, a protocol that is not continued, a request of an unknown shape).
    ``fresh``: ``request`` is a parse of its own, changed in place (no copy)."""
    if style is ContinuationStyle.NONE or not partial:
        return None
    if protocol not in (Protocol.CHAT, Protocol.MESSAGES, Protocol.COMPLETIONS):
        return None
    body = request if fresh else copy.deepcopy(request)
    if style is ContinuationStyle.REGENERATE:
        return Continuation(body)
    if protocol is Protocol.COMPLETIONS:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return None
        body["prompt"] = prompt + partial
        return Continuation(body)
    if protocol not in (Protocol.CHAT, Protocol.MESSAGES):
        return None
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    last = messages[-1] if messages else None
    own = isinstance(last, dict) and last.get("role") == "assistant"
    if own:
        assert isinstance(last, dict)
        prior = last.get("content")
        if not isinstance(prior, str):
            return None  # a prefill of content blocks: not extended
    else:
        prior = ""
    whole = prior + partial
    skip = ""
    if protocol is Protocol.MESSAGES:
        kept = whole.rstrip()
        whole, skip = kept, whole[len(kept) :]
        if not whole:
            return None
    if own:
        assert isinstance(last, dict)
        message = last
        message["content"] = whole
    else:
        message = {"role": "assistant", "content": whole}
        messages.append(message)
    if protocol is Protocol.CHAT:
        if style is ContinuationStyle.PREFIX:
            message["prefix"] = True
        elif style is ContinuationStyle.CONTINUE_FINAL_MESSAGE:
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
    return Continuation(body, skip)
