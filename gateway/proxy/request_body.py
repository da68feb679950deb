"""A request body's JSON: read for what the gateway decides on, never kept whole, never on the
loop when it is large.

The relay needs a few top-level members of a JSON body (``model``,
``stream``, ``stream_options``, scalars such as ``max_tokens``), and
sometimes a rewritten body (usage injection, an upstream's ``models`` map).
Keeping the parsed document for the life of the request cost more memory
than the body itself (a string as large again; many small objects several
times its size), so ``summary`` keeps only the small members: scalars,
short strings, and small objects of those (``Summary``); lists (``messages``,
``input``, ``tools``) never. ``rewrite`` parses the body again and changes
top-level members (an object member is merged into the client's, so a
``stream_options`` the summary left out keeps its other keys).

Parsing a large body holds the event loop for as long as it takes (27 MB of
small objects: 0.6 s idle, 2.5 s under load, and every stream of the worker
waits), and a thread would not help: the parsers hold the interpreter lock
throughout. A body over ``OFF_LOOP_BYTES`` is therefore parsed in a helper
process (one per worker, started at the first such body, with the same
standard of JSON as ``gateway.guard.jsonparse``); the loop only waits for
its answer. A body that a broken helper could not take is parsed on the loop
(correct, only slow), and the next one gets a new helper.

Whatever its content type says, and behind a UTF-8 BOM: an upstream may read
it as JSON all the same.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from gateway.guard.jsonparse import loads
from gateway.policy.limits import estimate_input

__all__ = ["OFF_LOOP_BYTES", "BodyParser", "Summary", "input_estimate", "rewrite", "summary"]

log = logging.getLogger("gateway")

#: Bodies larger than this are parsed in the helper process.
OFF_LOOP_BYTES = 1024 * 1024


class Summary(dict[str, Any]):
    """The top-level members of a JSON object body that the gateway keeps (see
    ``summary``), and, where named clients are configured, the input tokens the
    whole document's text is estimated at (``policy.limits.estimate_input``: its
    messages are not kept, so the estimate is made while they are at hand)."""

    __slots__ = ("input_tokens",)

    def __init__(self, members: dict[str, Any], input_tokens: int | None) -> None:
        super().__init__(members)
        self.input_tokens = input_tokens

    def __reduce__(self) -> tuple[Any, ...]:  # across the helper process
        return (Summary, (dict(self), self.input_tokens))


_BOM = b"\xef\xbb\xbf"
_FIRST = (b"{", b" ", b"\n", b"\r", b"\t")
_MAX_STRING = 4096  # characters of a string member kept
_MAX_MEMBERS = 64  # members of an object member kept
T = TypeVar("T")


def _document(body: bytes) -> dict[str, Any] | None:
    if body[:3] == _BOM:
        body = body[3:]
    if not body or body[:1] not in _FIRST:
        return None
    try:
        obj = loads(body)
    except (ValueError, RecursionError):
        # Anything the gateway cannot parse is "not JSON": forwarded unchanged.
        return None
    return obj if isinstance(obj, dict) else None


def _small(value: object, depth: int = 0) -> bool:
    if value is None or isinstance(value, bool | int | float):
        return True
    if isinstance(value, str):
        return len(value) <= _MAX_STRING
    if isinstance(value, dict) and depth == 0 and len(value) <= _MAX_MEMBERS:
        return all(_small(v, 1) for v in value.values())
    return False


def summary(body: bytes, count_input: bool = False) -> Summary | None:
    """The small top-level members of a JSON object body (with ``count_input``, and its
    input estimate); None when it is not one."""
    doc = _document(body)
    if doc is None:
        return None
    tokens = estimate_input(doc, len(body)) if count_input else None
    return Summary({key: value for key, value in doc.items() if _small(value)}, tokens)


def rewrite(body: bytes, changes: dict[str, Any]) -> bytes | None:
    """The body with its top-level ``changes`` (object members merged); None when the
    body is not a JSON object."""
    doc = _document(body)
    if doc is None:
        return None
    for key, value in changes.items():
        old = doc.get(key)
        doc[key] = {**old, **value} if isinstance(value, dict) and isinstance(old, dict) else value
    try:  # UTF-8 as it came: escaping every non-ASCII character would grow the body
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:  # a lone surrogate, which only an escape can carry
        return json.dumps(doc, separators=(",", ":")).encode()


def input_estimate(request: dict[str, Any] | None, body_size: int) -> int:
    """A request's input tokens: the estimate its summary made of the whole document,
    else (not JSON, or made without) ``estimate_input`` of what there is."""
    if isinstance(request, Summary) and request.input_tokens is not None:
        return request.input_tokens
    return estimate_input(request, body_size)


class BodyParser:
    """``summary`` and ``rewrite`` for the relay: on the loop for small bodies, in the
    helper process for large ones."""

    def __init__(self, off_loop_bytes: int = OFF_LOOP_BYTES, *, count_input: bool = False) -> None:
        self.off_loop_bytes = off_loop_bytes
        #: Estimate each body's input tokens (named clients are charged for them).
        self.count_input = count_input
        self._pool: ProcessPoolExecutor | None = None

    async def summary(self, body: bytes) -> Summary | None:
        return await self._run(summary, body, self.count_input)

    async def rewrite(self, body: bytes, changes: dict[str, Any]) -> bytes | None:
        return await self._run(rewrite, body, changes)

    async def document(self, body: bytes) -> dict[str, Any] | None:
        """The whole JSON object body (a continuation's prefill needs its messages);
        parsed again when asked, never kept by the relay."""
        return await self._run(_document, body)

    async def run(self, work: Callable[..., T], body: bytes, *args: Any) -> T:
        """``work(body, *args)``: on the loop for a small body, in the helper process for a
        large one (``work`` must be a module-level function: it crosses processes)."""
        return await self._run(work, body, *args)

    async def _run(self, work: Callable[..., T], body: bytes, *args: Any) -> T:
        if len(body) <= self.off_loop_bytes:
            return work(body, *args)
        if self._pool is None:
            # spawn: a fresh interpreter, never a fork of a process with a loop and threads
            self._pool = ProcessPoolExecutor(1, multiprocessing.get_context("spawn"))
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, work, body, *args)
        except BrokenProcessPool:
            log.warning("the body parser's helper process died; a new one is started")
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            return work(body, *args)

    def close(self) -> None:
        """Stop the helper process, if one was started."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
