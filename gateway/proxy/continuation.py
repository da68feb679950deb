"""Continuation after a cut: the rest of a stream that broke after some text reached the
client, asked of an upstream that can continue, and relayed as the same stream.

A documented resume protocol, never a silent retry. When a relayed stream
ends incomplete for a reason that blames the upstream (``BLAMES_UPSTREAM``)
after content went out, and what was sent is only the text of one answer
(the contract's ``continuable``), the gateway sends the original request
with that text as a prefill (``gateway.protocols.continuation``) to the
upstreams that can continue: first those that did not just break it (the
tier's other members, then the next tiers, then any other), and the same
upstream, after the backoff, only when no other can. Each answer is checked
by its own contract and held until its joint is checked (``JointCheck``:
its first text is not the answer's head again, it is not empty; a
``regenerate`` answer has repeated exactly what the client has); one that
fails before that (a 400 because the model rejects prefill, a 5xx, a
timeout, a joint that is not honoured) hands over to the next upstream.
Once it starts, its events go out through the joint (``gateway.guard.joint``):
the client's text is the text before the cut plus the continuation,
nothing repeated, nothing lost.

The continuation request is built once a round for each style and model
(``BodyParser.continuation``): in the helper process for a large body, so
that the loop never copies or writes a large conversation, and within the
request's total deadline.

At most ``max_continuations`` per request. When none succeeds, the client
gets the original failure's annotation (its reason, never the prefill's 400).
The annotation of a continued stream says ``continued=N``. Whatever fails
inside this path (a bug, a value nothing expected), the stream still ends
with the original verdict: the error event, the annotation, the metrics and
the access-log line.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import httpx

from gateway.guard import Reason, StreamGuard, Usage
from gateway.guard.joint import Check, Joint, JointCheck
from gateway.observe import Attempt, Metrics
from gateway.observe.record import Part
from gateway.policy.failover import (
    BROKE_ANSWER,
    AttemptFailure,
    Result,
    result_of_failure,
    result_of_status,
)
from gateway.policy.pool import Health, Lease
from gateway.policy.retry import backoff
from gateway.policy.routing import Endpoint, Target
from gateway.protocols.continuation import ContinuationStyle
from gateway.proxy.answers import Rescued, drop_stalled_client
from gateway.proxy.attempt import attempt
from gateway.proxy.exchange import Exchange
from gateway.proxy.headers import RawHeaders, with_credential
from gateway.proxy.upstream import ReadChunk, Upstream, chunk_reader, close_quietly

__all__ = ["BLAMES_UPSTREAM", "ContinuationResult", "Rescuer"]

log = logging.getLogger("gateway")

#: Why a stream may be continued: reasons that blame the upstream.
BLAMES_UPSTREAM = BROKE_ANSWER
#: Stops the continuation answers (the watchdog's): any other stop (the client, the drain,
#: the total deadline) ends the request as before.
_ANSWERED_STOPS = frozenset({None, Reason.IDLE_TIMEOUT})


class ContinuationResult(StrEnum):
    """The ``result`` label of ``gateway_continuations_total``."""

    OK = "ok"  # the continuation ended the answer complete
    REJECTED = "rejected"  # the upstream refused the continuation request (a 4xx)
    #: it failed before its first content event, or broke in turn (or this path failed)
    FAILED = "failed"
    NOT_CONTINUABLE = "not_continuable"  # what was sent cannot be continued
    #: it answered, but did not continue: it restarted the answer, or ended with nothing
    NOT_HONOURED = "not_honoured"
    #: not attempted: no continuation request could be built from the admitted body (not
    #: JSON to the gateway, or too complex to parse within the body parser's budget)
    BODY_UNREADABLE = "body_unreadable"


NewGuard = Callable[[httpx.Response], StreamGuard | None]
Done = Callable[[Endpoint, Lease, Health], None]
#: Builds a continuation request's bytes (``BodyParser.continuation`` on the admitted
#: body): style, the text so far, the model the upstream maps the client's to.
Build = Callable[[ContinuationStyle, str, str | None], Awaitable[tuple[bytes, str] | None]]
#: Records the cut attempt (its reason) before a candidate is chosen.
Settle = Callable[[Reason], None]


@dataclass(kw_only=True, eq=False)
class Rescuer:
    """Continues one request's cut stream; ``rescue`` is handed to ``relay_stream``."""

    exchange: Exchange
    upstream: Upstream
    metrics: Metrics
    index: int
    target: Target
    #: The request's headers for any upstream: each continuation adds its upstream's
    #: credential, or its signature over the continuation's own URL and body.
    headers: RawHeaders
    #: The request's small top-level members (``request_body.summary``); None: the
    #: body is not JSON to the gateway, and no continuation can be built from it.
    request_json: dict[str, Any] | None
    #: Builds a continuation request from the admitted body (off the loop when large).
    build: Build
    body_size: int
    new_guard: NewGuard
    done: Done
    settle: Settle | None = None
    #: The admitted request body (what a resumable stream's takeover continues from).
    body: bytes = b""
    #: A continuation request could not be built from the admitted body.
    _unreadable: bool = field(init=False)
    continued: int = field(init=False, default=0)
    #: The cut attempt's reason, once a continuation was relayed.
    original: Reason | None = field(init=False, default=None)
    _responses: list[httpx.Response] = field(init=False, default_factory=list)
    _cut_reason: Reason | None = field(init=False, default=None)
    #: What the cut attempts so far were billed, and the continuation being relayed
    #: (not yet in it): a stream that ends without a whole continuation is charged
    #: with both.
    _cut: Usage = field(init=False, default=Usage(input_tokens=0, output_tokens=0))
    _live: StreamGuard | None = field(init=False, default=None)
    #: The upstream of the continuation being relayed, until its part is recorded.
    _live_upstream: str | None = field(init=False, default=None)
    #: The cut answer had its finish (only its end was missing).
    _finished: bool = field(init=False, default=False)
    #: What the first cut attempt (the original answer) was billed, once a
    #: continuation is attempted: a takeover charges only what its continuation adds.
    first_cut: Usage | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self._unreadable = self.request_json is None

    async def aclose(self) -> None:
        for response in self._responses:
            await close_quietly(response)
        self._responses.clear()

    # -- whether and what ---------------------------------------------------------------

    async def rescue(self, guard: StreamGuard) -> Rescued | None:
        """Continue ``guard``'s cut stream, or None; never raises but to be cancelled."""
        try:
            return await self._rescue(guard)
        except asyncio.CancelledError:
            exchange = self.exchange
            if not exchange.claim_stop():
                raise
            assert exchange.stop_reason is not None
            guard.abort(exchange.stop_reason, force=True)
            if not self.continued:
                return None
            return Rescued(guard, _nothing, self.continued, billed=self._billed_so_far())
        except Exception:
            # A bug or an unexpected value: the original verdict still ends the stream.
            route = self.exchange.route
            log.exception(
                "route %s: the continuation of request %s failed; the stream ends with "
                "its original reason",
                route.name,
                self.exchange.record.request_id,
            )
            cut_at = route.endpoints[self.index].name
            self.metrics.continuation(route.name, cut_at, ContinuationResult.FAILED)
            if not self.continued:
                return None
            try:
                billed: Usage | None = self._billed_so_far()
            except Exception:  # what failed may be the estimate itself
                billed = None
            return Rescued(guard, _nothing, self.continued, billed=billed)

    async def _rescue(self, guard: StreamGuard) -> Rescued | None:
        exchange, route = self.exchange, self.exchange.route
        verdict = guard.verdict
        contract = guard.contract
        if (
            verdict is None
            or verdict.complete
            or verdict.reason not in BLAMES_UPSTREAM
            or exchange.stop_reason not in _ANSWERED_STOPS
            or contract.content_events == 0
            or exchange.record.bytes_out == 0
            or asyncio.get_running_loop().time() >= exchange.total_deadline
        ):
            return None
        cut_at = route.endpoints[self.index].name
        if self._unreadable and exchange.spec.continuable:
            self._not_attempted(cut_at)
            return None
        if not self._continuable(guard):
            self.metrics.continuation(route.name, cut_at, ContinuationResult.NOT_CONTINUABLE)
            exchange.record.not_continued = ContinuationResult.NOT_CONTINUABLE
            return None
        exchange.stop_reason = None  # answered: the exchange can be stopped again
        if self.settle is not None:
            # The cut is recorded before a candidate is chosen: the upstream that broke is
            # asked again only when it is still in the pool.
            self.settle(verdict.reason)
            self.settle = None
        cut = self._cut = _billed(guard, self.body_size, self._cut)
        self._part(guard, cut_at)
        if self.first_cut is None:
            self.first_cut = cut
        text = _text(guard)
        self._finished = bool(contract.finish_reasons)
        joint = contract.joint(cut)
        assert joint is not None  # a continuable contract declares its joint
        return await self._continue(guard, text, joint, cut)

    def _continuable(self, guard: StreamGuard) -> bool:
        exchange = self.exchange
        if not exchange.spec.continuable or self.request_json is None:
            return False
        n = self.request_json.get("n")
        if n is not None and n != 1:
            return False
        return guard.contract.continuable()

    async def _continue(
        self, original: StreamGuard, text: str, joint: Joint, cut: Usage
    ) -> Rescued | None:
        exchange, route = self.exchange, self.exchange.route
        assert original.verdict is not None
        self._cut_reason = original.verdict.reason
        broke = self.index
        while self.continued < route.config.max_continuations:
            got = await self._one(text, joint, broke)
            if got is None:
                break
            guard, read, name, index = got
            verdict = guard.verdict
            assert verdict is not None
            if verdict.complete:
                self.metrics.continuation(route.name, name, ContinuationResult.OK)
                self._part(guard, name)
                usage = verdict.usage or Usage()
                total = Usage(
                    input_tokens=(usage.input_tokens or 0) + (cut.input_tokens or 0),
                    output_tokens=(usage.output_tokens or 0) + (cut.output_tokens or 0),
                )
                return Rescued(guard, read, self.continued, total)
            if verdict.reason is Reason.SCHEMA_MISMATCH:
                # a reader refused the continued answer (judged as one across the splice):
                # it was continued; the stream ends with that refusal, at that event
                self.metrics.continuation(route.name, name, ContinuationResult.OK)
                billed = _billed(guard, self.body_size, cut)
                self._part(guard, name)
                return Rescued(guard, read, self.continued, billed=billed)
            self.metrics.continuation(route.name, name, ContinuationResult.FAILED)
            if (
                verdict.reason not in BLAMES_UPSTREAM
                or exchange.stop_reason not in _ANSWERED_STOPS
                or not self._continuable(guard)
            ):
                break
            exchange.stop_reason = None
            text += _text(guard)
            # Its tokens reached the client and were billed: the next usage counts them.
            cut = self._cut = _billed(guard, self.body_size, cut)
            self._part(guard, name)
            self._live = None
            joint = _next_joint(joint, guard, cut)
            broke = index
        if not self.continued:
            if self._unreadable:  # no candidate got a request: the body could not be read
                self._not_attempted(route.endpoints[self.index].name)
            return None
        # The whole answer is the original's failure: its reason, said once at the end.
        return Rescued(original, _nothing, self.continued, billed=self._billed_so_far())

    def _not_attempted(self, cut_at: str) -> None:
        """No continuation could be built from the body: said in the metrics and the log."""
        result = ContinuationResult.BODY_UNREADABLE
        self.metrics.continuation(self.exchange.route.name, cut_at, result)
        self.exchange.record.not_continued = result
        log.info(
            "route %s: request %s was cut and not continued: its body could not be read "
            "(not JSON, or too complex to parse within the body parser's budget)",
            self.exchange.route.name,
            self.exchange.record.request_id,
        )

    def _billed_so_far(self) -> Usage:
        """What every attempt that reached the client was billed: the cut ones, and the
        continuation that was being relayed when the stream ended without a whole one."""
        live = self._live
        if live is not None and self._live_upstream is not None:
            self._part(live, self._live_upstream)
        return self._cut if live is None else _billed(live, self.body_size, self._cut)

    def _part(self, guard: StreamGuard, upstream: str) -> None:
        """Record an attempt's share of the answer, once (``RequestRecord.parts``)."""
        if guard is self._live:
            self._live_upstream = None
        self.exchange.record.parts.append(_part_of(guard, upstream, self.body_size))

    # -- one continuation ---------------------------------------------------------------

    def _candidates(self, broke: int) -> Iterator[tuple[Lease, float]]:
        """The upstreams that can continue, claimed one at a time: those that did not
        break the stream (its tier's others, the tiers above, any other), then the one
        that broke it, after the backoff, only when no other can."""
        route, model = self.exchange.route, self.exchange.record.model
        pool = route.pool
        unable = {
            i for i, e in enumerate(route.endpoints) if e.continuation is ContinuationStyle.NONE
        }
        used = {broke}
        tier = pool.tier(broke)
        for scope in ({"tier": tier}, {"above": tier}, {}):
            while (
                lease := pool.pick(unable | used, panic=False, model=model, **scope)
            ) is not None:
                used.add(lease.index)
                yield lease, 0.0
        if broke not in unable and (lease := pool.claim(broke)) is not None:
            yield lease, backoff(route.retry.backoff_seconds, 1, _RNG)

    async def _request(
        self, endpoint: Endpoint, text: str, built: dict[tuple[str, str | None], Any]
    ) -> tuple[bytes, str] | None:
        """The continuation request for ``endpoint``: built once a round for each style
        and mapped model, within the total deadline."""
        model = (self.request_json or {}).get("model")
        models = endpoint.models
        mapped = models.get(model, models.get("*")) if isinstance(model, str) else None
        key = (str(endpoint.continuation), mapped)
        if key not in built:
            try:
                async with asyncio.timeout_at(self.exchange.total_deadline):
                    built[key] = await self.build(endpoint.continuation, text, mapped)
                self._unreadable = built[key] is None
            except TimeoutError:
                built[key] = None
        request: tuple[bytes, str] | None = built[key]
        return request

    async def _one(
        self, text: str, joint: Joint, broke: int
    ) -> tuple[StreamGuard, ReadChunk, str, int] | None:
        """Ask the candidates in turn; the first whose answer starts is relayed to its end."""
        exchange = self.exchange
        loop = asyncio.get_running_loop()
        built: dict[tuple[str, str | None], Any] = {}
        for lease, wait in self._candidates(broke):
            endpoint = exchange.route.endpoints[lease.index]
            result, health = Result.INCOMPLETE, Health.NEUTRAL
            started = time.monotonic()
            counted = False
            try:
                request = await self._request(endpoint, text, built)
                if request is None or loop.time() + wait >= exchange.total_deadline:
                    continue
                content, skip = request
                regenerate = endpoint.continuation is ContinuationStyle.REGENERATE
                check = JointCheck(text, regenerate=regenerate, finished=self._finished)
                joint.expect(check, skip)
                started = time.monotonic()
                self.metrics.upstream_started(exchange.route.name, endpoint.name)
                counted = True
                if wait:
                    await asyncio.sleep(wait)
                got = await self._try(endpoint, content, joint)
                if isinstance(got, ContinuationResult):
                    result, health = _REFUSED[got]
                    self.metrics.continuation(exchange.route.name, endpoint.name, got)
                    continue
                if isinstance(got, Result):
                    result, health = got, Health.FAILED
                    self.metrics.continuation(
                        exchange.route.name, endpoint.name, ContinuationResult.FAILED
                    )
                    continue
                guard, read = got
                verdict = guard.verdict
                assert verdict is not None
                result = Result.OK if verdict.complete else Result.INCOMPLETE
                health = Health.OK if verdict.complete else Health.FAILED
                return guard, read, endpoint.name, lease.index
            finally:
                if counted:
                    exchange.record.attempts.append(
                        Attempt(endpoint.name, result, time.monotonic() - started)
                    )
                    self.done(endpoint, lease, health)
                else:
                    self.exchange.route.pool.done(lease, Health.NEUTRAL)
        return None

    async def _try(
        self, endpoint: Endpoint, content: bytes, joint: Joint
    ) -> tuple[StreamGuard, ReadChunk] | ContinuationResult | Result:
        """One continuation request: its guard and reader once relayed to its verdict, or
        why it did not start (a refusal, a joint not honoured, or the attempt's result)."""
        exchange = self.exchange
        timeouts = endpoint.timeouts
        exchange.record.bytes_in += len(content)
        method, url = exchange.scope["method"], endpoint.url_for(self.target)
        headers = with_credential(
            self.headers, endpoint, exchange.spec, method=method, url=url, body=content
        )
        outcome = await attempt(
            self.upstream,
            self.upstream.request(method, url, headers, content, timeouts.connect),
            timeouts.first_byte,
            exchange.total_deadline,
        )
        if isinstance(outcome, AttemptFailure):
            return result_of_failure(outcome)
        self._responses.append(outcome)
        if 400 <= outcome.status_code < 500 and outcome.status_code != 429:
            return ContinuationResult.REJECTED
        if outcome.status_code >= 300:
            return result_of_status(outcome.status_code)
        guard = self.new_guard(outcome)
        if guard is None:
            return Result.EARLY_EOF
        guard.whole = None  # its events reach the readers as the joint renders them (_send)
        read = chunk_reader(outcome)
        first = await self._hold(guard, read, joint, timeouts.first_byte, timeouts.idle)
        verdict = guard.verdict
        check = joint.check
        assert check is not None
        if check.state is Check.PENDING:
            if verdict is None or not verdict.complete:
                late = verdict is not None and verdict.reason in _LATE
                return Result.TIMEOUT if late else Result.EARLY_EOF
            check.end(guard.contract.content_events > 0)
        if check.state is Check.DIVERGED:
            return ContinuationResult.REJECTED
        if check.state is not Check.HONOURED:
            return ContinuationResult.NOT_HONOURED
        self._relaying(guard, endpoint.name)
        await self._send(first)
        while guard.verdict is None:
            data = await self._read(guard, read, timeouts.idle)
            await self._send(joint.rewrite_events(data))
        return guard, read

    def _relaying(self, guard: StreamGuard, upstream: str) -> None:
        """A continuation's first content goes out: the stream is continued from here,
        also when the drain or the client stops it before its end, and its answer is
        ``upstream``'s from here (the access log's ``upstream``)."""
        self._live = guard
        self._live_upstream = upstream
        self.continued += 1
        self.exchange.record.continued = self.continued
        self.exchange.record.upstream = upstream
        self.original = self._cut_reason

    async def _hold(
        self, guard: StreamGuard, read: ReadChunk, joint: Joint, first_byte: float, idle: float
    ) -> list[bytes]:
        """Read into ``guard`` until its joint is checked, its end or a failure; the
        joint's output so far, one whole event each (nothing of it is sent yet)."""
        out: list[bytes] = []
        limit = first_byte
        check = joint.check
        assert check is not None
        while guard.verdict is None and check.state is Check.PENDING:
            out += joint.rewrite_events(await self._read(guard, read, limit))
            limit = idle
        return out

    async def _read(self, guard: StreamGuard, read: ReadChunk, seconds: float) -> bytes:
        """One read fed to ``guard`` (its forwarded bytes); a failure ends its verdict."""
        loop = asyncio.get_running_loop()
        total = self.exchange.total_deadline
        try:
            async with asyncio.timeout_at(min(loop.time() + seconds, total)):
                chunk = await read()
        except TimeoutError:
            late = loop.time() >= total
            guard.abort(Reason.TOTAL_TIMEOUT if late else Reason.IDLE_TIMEOUT)
            return b""
        except httpx.TransportError:
            guard.abort(Reason.UPSTREAM_DISCONNECT)
            return b""
        if not chunk:
            guard.eof()
            final, guard.final = guard.final, b""
            return final
        return guard.feed(chunk)

    async def _send(self, events: list[bytes]) -> None:
        if not events:
            return
        exchange = self.exchange
        if exchange.events:
            # asked of the readers (a schema check judges across the splice) and logged
            # before the client gets them; one refused ends the continued stream there
            taken, refusal = exchange.events.relayed(events)
            if refusal is not None:
                events = events[:taken]
                live = self._live
                if live is not None:
                    live.abort(refusal.reason, refusal.detail, force=True)
                if not events:
                    return
        data = b"".join(events)
        try:
            async with asyncio.timeout(exchange.route.timeouts.client_send):
                await exchange.send({"type": "http.response.body", "body": data, "more_body": True})
        except TimeoutError:
            drop_stalled_client(exchange)
        exchange.record.bytes_out += len(data)


_LATE = frozenset({Reason.FIRST_BYTE_TIMEOUT, Reason.IDLE_TIMEOUT, Reason.TOTAL_TIMEOUT})
#: A continuation that answered but did not go on: its attempt's result and health (it
#: answered; what it answered is a capability of its model, not a failure of the upstream).
_REFUSED = {
    ContinuationResult.REJECTED: (Result.STATUS_4XX, Health.OK),
    ContinuationResult.NOT_HONOURED: (Result.INCOMPLETE, Health.OK),
}
_RNG = random.Random()


def _text(guard: StreamGuard) -> str:
    return guard.contract.text()


def _billed(guard: StreamGuard, body_size: int, before: Usage) -> Usage:
    """``before`` plus what a cut attempt was billed: its reported usage, else its input
    estimated from the body and one output token per content event relayed."""
    verdict = guard.verdict  # None: a continuation the drain or the client stopped
    usage = verdict.usage if verdict is not None else None
    reported = usage if usage is not None else Usage()
    cut_input = reported.input_tokens
    return Usage(
        input_tokens=(before.input_tokens or 0)
        + (cut_input if cut_input is not None else max(1, body_size // 4)),
        output_tokens=(before.output_tokens or 0)
        + max(reported.output_tokens or 0, guard.contract.content_events),
    )


def _part_of(guard: StreamGuard, upstream: str, body_size: int) -> Part:
    """An attempt's part: its reported usage when it completed and reported it whole,
    else what ``_billed`` bills it."""
    verdict = guard.verdict
    usage = verdict.usage if verdict is not None else None
    outcome = (
        "stopped" if verdict is None else "complete" if verdict.complete else str(verdict.reason)
    )
    whole = usage is not None and usage.input_tokens is not None and usage.output_tokens is not None
    if whole and verdict is not None and verdict.complete:
        assert usage is not None
        return Part(upstream, guard.contract.model, outcome, usage, "reported")
    billed = _billed(guard, body_size, Usage(input_tokens=0, output_tokens=0))
    return Part(upstream, guard.contract.model, outcome, billed, "estimated")


def _next_joint(joint: Joint, guard: StreamGuard, cut: Usage) -> Joint:
    """The joint for a continuation of a continuation: the same ids, the blocks shifted on,
    the usage of every cut attempt so far."""
    return guard.contract.next_joint(joint, cut)


async def _nothing() -> bytes:
    return b""
