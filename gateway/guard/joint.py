"""The joint of a continued stream: a continuation's events rewritten to go on the original.

When a stream is cut after some text reached the client and another request
continues it from that text, the continuation's events are relayed as the
same stream, so that the client's accumulated text is exactly what it had
before the cut plus the rest, nothing repeated, nothing lost:

- Chat Completions (and legacy Completions): ``id``, ``created``, ``model``
  and ``system_fingerprint`` of each chunk become the original stream's; the
  continuation's ``role`` delta is dropped (a chunk left empty goes
  entirely); its usage chunk counts what the cut attempt was billed too.
- Messages: the continuation's ``message_start`` and the ``content_block_start``
  of its first block (the open text block goes on) are swallowed, and its
  block indexes are shifted onto the original's; its ``message_delta`` usage
  counts the cut attempt's output too.

A text the continuation repeats at its start (``skip``: the prefill lost its
trailing whitespace, which Anthropic refuses in a prefill) is taken off once.

Sans-IO: whole events in (a guard's forwarded bytes), bytes out; no state but
the joint's own. Each event is parsed and written again, so this runs only on
a continued stream, never on the happy path.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.guard.sse import SSEDecoder
from gateway.guard.verdict import Usage

__all__ = ["ChatJoint", "Joint", "MessagesJoint"]

_BIG = 1 << 30


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _render(event: str, data: str) -> bytes:
    head = "" if event == "message" else f"event: {event}\n"
    return f"{head}data: {data}\n\n".encode()


class Joint:
    """Rewrites a continuation's whole events; ``rewrite`` bytes in, bytes out."""

    def __init__(self, cut_usage: Usage, skip: str = "") -> None:
        self._decoder = SSEDecoder(_BIG, _BIG)
        self.cut_usage = cut_usage
        self._skip = skip

    def following(self, shift: int, cut_usage: Usage) -> Joint:
        """The joint for a continuation of a continuation: the same ids, ``shift`` more
        blocks (the open block of the continuation that broke), every cut so far."""
        self.cut_usage = cut_usage
        return self

    def skip_text(self, skip: str) -> None:
        """The text the next continuation repeats at its start (taken off once)."""
        self._skip = skip

    def rewrite(self, data: bytes) -> bytes:
        out: list[bytes] = []
        for event in self._decoder.feed(data):
            rewritten = self._event(event.event, event.data)
            if rewritten is not None:
                out.append(rewritten)
        return b"".join(out)

    def _event(self, event: str, data: str) -> bytes | None:
        raise NotImplementedError

    def _take_skip(self, text: str) -> str:
        """``text`` without what the continuation repeats of the cut text's end."""
        skip = self._skip
        if not skip or not text:
            return text
        common = 0
        while common < len(skip) and common < len(text) and skip[common] == text[common]:
            common += 1
        self._skip = skip[common:] if common == len(text) else ""
        return text[common:]


def _add(value: object, more: int | None) -> object:
    if isinstance(value, int) and not isinstance(value, bool) and more:
        return value + more
    return value


class ChatJoint(Joint):
    """A Chat (or Completions) continuation onto the original stream's ids."""

    def __init__(self, ids: dict[str, Any], cut_usage: Usage, skip: str = "") -> None:
        super().__init__(cut_usage, skip)
        self.ids = ids

    def _event(self, event: str, data: str) -> bytes | None:
        if data.strip() == "[DONE]":
            return _render(event, data)
        try:
            obj = json.loads(data)
        except ValueError:
            return _render(event, data)  # the contract judged it: not ours to drop
        if not isinstance(obj, dict):
            return _render(event, data)
        for key, value in self.ids.items():
            if key in obj:
                obj[key] = value
        choices = obj.get("choices")
        if isinstance(choices, list):
            kept = [c for c in (self._choice(c) for c in choices) if c is not None]
            if choices and not kept and obj.get("usage") is None:
                return None
            obj["choices"] = kept
        usage = obj.get("usage")
        if isinstance(usage, dict):
            cut = self.cut_usage
            usage["prompt_tokens"] = _add(usage.get("prompt_tokens"), cut.input_tokens)
            usage["completion_tokens"] = _add(usage.get("completion_tokens"), cut.output_tokens)
            both = (cut.input_tokens or 0) + (cut.output_tokens or 0)
            usage["total_tokens"] = _add(usage.get("total_tokens"), both)
        return _render(event, _dumps(obj))

    def _choice(self, choice: object) -> object | None:
        if not isinstance(choice, dict):
            return choice
        delta = choice.get("delta")
        if isinstance(delta, dict):
            delta.pop("role", None)
            for key in [k for k, v in delta.items() if v is None]:
                del delta[key]  # a null refusal (of the role chunk) carries nothing
            content = delta.get("content")
            if isinstance(content, str):
                delta["content"] = self._take_skip(content)
                if not delta["content"]:
                    del delta["content"]
            if not delta and choice.get("finish_reason") is None and not choice.get("logprobs"):
                return None
        text = choice.get("text")
        if isinstance(text, str):  # legacy Completions
            choice["text"] = self._take_skip(text)
            if not choice["text"] and choice.get("finish_reason") is None:
                return None
        return choice


class MessagesJoint(Joint):
    """A Messages continuation onto the original's open text block."""

    def __init__(self, open_block: int, cut_usage: Usage, skip: str = "") -> None:
        super().__init__(cut_usage, skip)
        self.shift = open_block
        self._first_block: int | None = None

    def following(self, shift: int, cut_usage: Usage) -> Joint:
        return MessagesJoint(self.shift + shift, cut_usage)

    def _event(self, event: str, data: str) -> bytes | None:
        try:
            obj = json.loads(data)
        except ValueError:
            return _render(event, data)
        if not isinstance(obj, dict):
            return _render(event, data)
        kind = obj.get("type")
        if kind == "message_start":
            return None
        index = obj.get("index")
        before = b""
        if isinstance(index, int) and not isinstance(index, bool):
            if kind == "content_block_start" and self._first_block is None:
                self._first_block = index
                block = obj.get("content_block")
                if (
                    isinstance(block, dict)
                    and block.get("type") == "text"
                    and not block.get("text")
                ):
                    return None  # the open text block goes on: no second start
                # Something else comes first (a tool call): the open text block ends here.
                stop = {"type": "content_block_stop", "index": self.shift}
                before = _render("content_block_stop", _dumps(stop))
                self.shift += 1
            obj["index"] = index + self.shift
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("text"), str):
                delta["text"] = self._take_skip(delta["text"])
                if not delta["text"]:
                    return None
        elif kind == "message_delta":
            usage = obj.get("usage")
            if isinstance(usage, dict):
                cut = self.cut_usage
                usage["output_tokens"] = _add(usage.get("output_tokens"), cut.output_tokens)
                if "input_tokens" in usage:
                    usage["input_tokens"] = _add(usage.get("input_tokens"), cut.input_tokens)
        return before + _render(event, _dumps(obj))
