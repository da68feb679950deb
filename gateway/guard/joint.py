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

The joint is checked (``JointCheck``): a continuation whose text starts again
from the answer's beginning (it repeats the head of what the client has), or
that ends with no new content at all, is not honoured; a regenerated answer
(``regenerate``: the whole answer asked again) must repeat exactly what the
client has before anything of it goes on, and diverges otherwise. What cannot
be checked: that text after the joint is the right continuation of it (a
continuation that starts somewhere else than the answer's head, or repeats a
middle part, passes), nor anything of a regenerated answer after the part the
client already has.

Sans-IO: whole events in (a guard's forwarded bytes), bytes out; no state but
the joint's own. Each event is parsed and written again, so this runs only on
a continued stream, never on the happy path.
"""

from __future__ import annotations

import enum
import json
import re
from typing import Any

from gateway.guard.sse import SSEDecoder
from gateway.guard.verdict import Usage

__all__ = ["ChatJoint", "Check", "Joint", "JointCheck", "MessagesJoint", "dumps_utf8"]

_BIG = 1 << 30
#: A lone UTF-16 surrogate (valid JSON as ``"\\ud83d"``, no UTF-8 form).
_SURROGATE = re.compile(r"[\ud800-\udfff]")  # re's escapes: mypyc takes no surrogate literal


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def dumps_utf8(obj: object) -> bytes:
    """Compact JSON as UTF-8, non-ASCII characters as they are; a lone surrogate, which
    has no UTF-8 form, as its ``\\u`` escape (where JSON text carried it in)."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub(_escape, text).encode()


def _dumps(obj: object) -> str:
    return dumps_utf8(obj).decode()


class Check(enum.Enum):
    """Where a continuation's joint check stands."""

    PENDING = "pending"  # not enough of its text seen yet
    HONOURED = "honoured"  # it goes on from the cut
    RESTARTED = "restarted"  # it repeats the head of the answer: not honoured
    EMPTY = "empty"  # it ended with no new content: not honoured
    OVERRUN = "overrun"  # text after an answer that had finished: not honoured
    DIVERGED = "diverged"  # a regenerated answer that is not what the client has


class JointCheck:
    """Whether a continuation continues the answer ``before`` (what the client has).

    ``text`` is fed each piece of the continuation's text (after the joint's
    ``skip``) and returns what of it is new to the client: all of it for a
    prefilled continuation; for a regenerated answer (``regenerate``), only
    what comes after the part that repeats ``before`` exactly. A prefilled
    continuation is honoured at its first character that is not the answer's
    own at that place, and restarted once its first ``HEAD`` characters (or
    all of ``before``, if shorter) are the answer's first ones: it is held
    only while it looks like a restart. ``end`` decides what is still pending
    when the continuation ends.
    """

    HEAD = 32

    def __init__(self, before: str, *, regenerate: bool = False, finished: bool = False) -> None:
        self.before = before
        self.regenerate = regenerate
        #: The cut answer had its finish (only its end was missing): the continuation
        #: must add nothing.
        self.finished = finished
        self.state = Check.PENDING
        self._head = min(self.HEAD, len(before))
        self._seen = ""  # the continuation's first characters (prefilled)
        self._covered = 0  # characters of ``before`` repeated so far (regenerated)

    def text(self, piece: str) -> str:
        if self.state is not Check.PENDING or not piece:
            return piece if self.state is not Check.DIVERGED else ""
        if self.finished and not self.regenerate:
            self.state = Check.OVERRUN
            return piece
        if self.regenerate:
            want = self.before[self._covered :]
            n = min(len(want), len(piece))
            if piece[:n] != want[:n]:
                self.state = Check.DIVERGED
                return ""
            self._covered += n
            if self._covered < len(self.before):
                return ""
            self.state = Check.HONOURED
            return piece[n:]
        seen = self._seen = self._seen + piece[: self._head - len(self._seen)]
        if not self.before.startswith(seen):
            self.state = Check.HONOURED  # it goes on elsewhere than the answer's head
        elif len(seen) >= self._head:
            self.state = Check.RESTARTED
        return piece

    def end(self, had_content: bool) -> Check:
        """The continuation reached its verdict (``had_content``: any content event)."""
        if self.state is Check.PENDING:
            if self.regenerate:
                self.state = Check.DIVERGED  # it ended short of what the client has
            elif self.finished or (not self._seen and had_content):
                self.state = Check.HONOURED
            elif not self._seen:
                self.state = Check.EMPTY
            elif self.before.startswith(self._seen):
                self.state = Check.RESTARTED
            else:
                self.state = Check.HONOURED
        return self.state


def _render(event: str, data: str) -> bytes:
    head = "" if event == "message" else f"event: {event}\n"
    return f"{head}data: {data}\n\n".encode()


class Joint:
    """Rewrites a continuation's whole events; ``rewrite`` bytes in, bytes out."""

    def __init__(self, cut_usage: Usage, skip: str = "") -> None:
        self._decoder = SSEDecoder(_BIG, _BIG)
        self.cut_usage = cut_usage
        self._skip = skip
        #: The check of the continuation being read (``expect``), if any.
        self.check: JointCheck | None = None

    def following(self, shift: int, cut_usage: Usage) -> Joint:
        """The joint for a continuation of a continuation: the same ids, ``shift`` more
        blocks (the open block of the continuation that broke), every cut so far."""
        self.cut_usage = cut_usage
        return self

    def skip_text(self, skip: str) -> None:
        """The text the next continuation repeats at its start (taken off once)."""
        self._skip = skip

    def expect(self, check: JointCheck, skip: str = "") -> None:
        """The next continuation starts: a fresh decoder, its skip and its check."""
        self._decoder = SSEDecoder(_BIG, _BIG)
        self._skip = skip
        self.check = check

    def rewrite(self, data: bytes) -> bytes:
        return b"".join(self.rewrite_events(data))

    def rewrite_events(self, data: bytes) -> list[bytes]:
        """``rewrite``, one whole event each."""
        out: list[bytes] = []
        for event in self._decoder.feed(data):
            rewritten = self._event(event.event, event.data)
            if rewritten is not None:
                out.append(rewritten)
        return out

    def _event(self, event: str, data: str) -> bytes | None:
        raise NotImplementedError

    def _take_skip(self, text: str) -> str:
        """``text`` without what the continuation repeats of the cut text's end."""
        skip = self._skip
        if skip and text:
            common = 0
            while common < len(skip) and common < len(text) and skip[common] == text[common]:
                common += 1
            self._skip = skip[common:] if common == len(text) else ""
            text = text[common:]
        check = self.check
        return check.text(text) if check is not None else text


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
        #: The continuation's own input tokens (its swallowed ``message_start``'s).
        self._input: int | None = None

    def expect(self, check: JointCheck, skip: str = "") -> None:
        super().expect(check, skip)
        self._first_block = None
        self._input = None

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
            message = obj.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            tokens = usage.get("input_tokens") if isinstance(usage, dict) else None
            if isinstance(tokens, int) and not isinstance(tokens, bool):
                self._input = tokens
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
                # The client saw the first attempt's message_start only: the billed input
                # of every attempt goes here (the SDKs take message_delta's input_tokens).
                own = usage.get("input_tokens")
                if not isinstance(own, int) or isinstance(own, bool) or own == 0:
                    own = self._input
                if isinstance(own, int) and cut.input_tokens is not None:
                    usage["input_tokens"] = own + cut.input_tokens
        return before + _render(event, _dumps(obj))
