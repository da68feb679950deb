"""StreamGuard: which upstream bytes may reach the client, and the stream's verdict.

It joins the decoder of the contract's framing (SSE, NDJSON) and one
protocol contract and does the byte bookkeeping of the wire contract
(docs/wire-contract.md, "Event-aligned relay" and "Withheld events"):
``feed(chunk)`` returns the bytes that are safe to forward now, which are
always whole blocks and whole comment lines (NDJSON: whole lines),
never a fragment of an event, never an event the contract rejected or
withheld, never an upstream comment line that begins with the annotation's
prefix (``: gateway``; counted in ``forged_comments``, and only in a framing
with comment lines: a binary frame is never filtered): the annotation is the
gateway's word alone. It holds at most one chunk plus one unfinished event.

Sans-IO: the relay owns sockets and clocks and tells the guard when the
upstream ended (``eof``) or when the stream must stop for a reason only the
relay can see (``abort``). ``ContractGuard`` is what it shares with the
WebSocket message guard (``gateway.guard.wsmessage``): the contract's verdict.
"""

from __future__ import annotations

from gateway.guard.annotation import render_annotation
from gateway.guard.contract import Action, Contract
from gateway.guard.decoder import Decoder, Event
from gateway.guard.errors import GuardError
from gateway.guard.sse import DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_LINE_BYTES
from gateway.guard.verdict import Reason, Verdict
from gateway.guard.whole import WholeEvents

__all__ = ["ContractGuard", "StreamGuard"]

#: Every line the annotation writes holds this word; a forwarded read without it
#: needs no closer look.
_MARK = b"gateway"


def _forged(line: bytes) -> bool:
    """A comment line whose text begins with the word ``gateway`` (the annotation's
    prefix, whatever the spacing after the colon): only the gateway may write one."""
    text = line[1:].lstrip(b" \t")
    return text.startswith(b"gateway") and text[7:8] in (b"", b" ", b"\t", b"\r", b"\n")


class ContractGuard:
    """What every guard of one contract tells the relay: the contract's verdict, whether
    it is final, and the events that carried output (``MessageGuard`` is one too)."""

    def __init__(self, contract: Contract) -> None:
        self.contract = contract

    @property
    def verdict(self) -> Verdict | None:
        return self.contract.verdict

    @property
    def done(self) -> bool:
        """True once the verdict is final: the relay stops reading the upstream."""
        return self.contract.verdict is not None

    @property
    def content_events(self) -> int:
        return self.contract.content_events


class StreamGuard(ContractGuard):
    """Decode, judge and gate one upstream event stream."""

    def __init__(
        self,
        contract: Contract,
        decoder: Decoder | None = None,
        *,
        max_stream_bytes: int | None = None,
    ) -> None:
        super().__init__(contract)
        #: Only a framing with comment lines can carry a forged annotation line; the
        #: bytes of any other (NDJSON lines, binary frames) are never filtered.
        self._comments = contract.framing.comments
        self.decoder = (
            decoder
            if decoder is not None
            else contract.framing.new_decoder(DEFAULT_MAX_LINE_BYTES, DEFAULT_MAX_EVENT_BYTES)
        )
        self.max_stream_bytes = max_stream_bytes
        self._held = b""  # bytes received but not yet forwarded or dropped
        #: Reads after ``_held`` that completed nothing, kept as they came and joined
        #: once when something does: a large event is neither copied on every read
        #: (quadratic) nor held twice (the decoder's pieces are these same objects).
        self._more: list[bytes] = []
        self._more_len = 0
        self._held_start = 0  # stream offset of the first held byte
        self.forwarded_bytes = 0
        #: Bytes that became forwardable only at the end of the upstream body (``eof``).
        self.final = b""
        #: Upstream comment lines dropped because they began with the annotation's prefix.
        self.forged_comments = 0
        #: Set by a route that continues cut streams: the upstream's own error event
        #: is not forwarded when it is judged but kept in ``withheld``, and sent before
        #: the annotation only when no continuation takes the stream over.
        self.withhold_errors = False
        self.withheld = b""
        #: The response's readers of whole events (``gateway.guard.whole``), shared by
        #: every guard of one answer; with none, the guard cuts nothing.
        self.whole: WholeEvents | None = None
        self._quiet = self.decoder.quiet_ends

    @property
    def held_bytes(self) -> int:
        return len(self._held) + self._more_len

    def _all_held(self) -> bytes:
        """``_held`` with the reads kept after it, joined once."""
        if self._more:
            self._more.insert(0, self._held)
            self._held = b"".join(self._more)
            self._more.clear()
            self._more_len = 0
        return self._held

    def _drop_held(self) -> None:
        self._held = b""
        self._more.clear()
        self._more_len = 0

    def feed(self, chunk: bytes) -> bytes:
        """Take one upstream chunk; return the bytes to forward to the client now."""
        if self.done or not chunk:
            return b""
        over = False
        if self.max_stream_bytes is not None:
            room = self.max_stream_bytes - self.decoder.received
            if len(chunk) > room:
                # Judge the part within the budget as if the network had split the
                # chunk there, so the outcome does not depend on the partition.
                chunk = chunk[: max(room, 0)]
                over = True
        data = self._feed(chunk) if chunk else b""
        if over and not self.done:
            self._drop_held()
            self.contract.abort(
                Reason.LIMIT_EXCEEDED, f"the stream exceeded {self.max_stream_bytes} bytes"
            )
        return data

    def _feed(self, chunk: bytes) -> bytes:
        error: GuardError | None = None
        try:
            events = self.decoder.feed(chunk)
        except GuardError as exc:
            # The events completed before the offending line are whole: judge them.
            error = exc
            events = self.decoder.events_before_error
        if (
            not events
            and error is None
            and self._held
            and not self._quiet
            and self.decoder.boundary == self._held_start
        ):
            # Inside an event that is not whole yet: nothing to judge or forward.
            self._more.append(chunk)
            self._more_len += len(chunk)
            return b""
        if self._more:
            self._more.append(chunk)  # joined with the rest, once
            held = self._all_held()
        else:
            held = self._held + chunk if self._held else chunk
        return self._judge(events, held, error)

    def _judge(self, events: list[Event], held: bytes, error: GuardError | None) -> bytes:
        """Run ``events`` through the contract; return the bytes of ``held`` to forward."""
        whole = self.whole
        if whole is not None and whole:
            return self._judge_whole(events, held, error, whole)
        if self._quiet:
            self._quiet.clear()
        base = self._held_start
        out: list[bytes] = []
        cursor = base  # first stream offset not yet emitted or dropped
        stop: int | None = None
        for event in events:
            action = self.contract.on_event(event)
            if action is Action.FORWARD:
                continue
            if action is Action.WITHHOLD:
                out.append(held[cursor - base : event.start - base])
                cursor = event.end
                continue
            stop = event.end if action is Action.FINISH else event.start
            verdict = self.contract.verdict
            if self.withhold_errors and verdict is not None and verdict.error_forwarded:
                # The upstream's own error event waits while a continuation is tried.
                self.withheld = held[event.start - base : event.end - base]
                stop = event.start
            break
        upto = stop if stop is not None else self.decoder.boundary
        out.append(held[cursor - base : upto - base])
        if stop is not None or error is not None:
            self._drop_held()
        else:
            self._held = held[upto - base :]
            self._held_start = upto
        if error is not None:
            self.contract.abort(Reason(error.reason), str(error))  # no-op after a FINISH
        data = out[0] if len(out) == 1 else b"".join(out)
        # Rare: a C search per judged read, the filter only on a hit (and only where a
        # comment line can be).
        if self._comments and _MARK in data:
            data = self._drop_forged(data)
        self.forwarded_bytes += len(data)
        return data

    def _judge_whole(
        self, events: list[Event], held: bytes, error: GuardError | None, whole: WholeEvents
    ) -> bytes:
        """``_judge`` for a stream with readers: the same bytes forwarded, each whole event
        handed to them (``gateway.guard.whole``) as it is judged; one they refuse ends
        the stream before it, as a rejected one does."""
        base = self._held_start
        out: list[bytes] = []
        cursor = base  # first stream offset not yet emitted or dropped
        stop: int | None = None
        quiet = self._quiet
        q = 0
        quiet_count = len(quiet)
        contract = self.contract
        comments = self._comments
        sent = 0  # bytes of the events offered and let through (counted once, at the end)
        for event in events:
            while q < quiet_count and quiet[q] <= event.start:
                whole.quiet(self._emit(held, base, cursor, quiet[q], out))
                cursor = quiet[q]
                q += 1
            action = contract.on_event(event)
            if action is Action.FORWARD:
                kept = False
            elif action is Action.WITHHOLD:
                whole.wait(self._emit(held, base, cursor, event.start, out))
                cursor = event.end
                continue
            else:
                verdict = contract.verdict
                kept = self.withhold_errors and verdict is not None and verdict.error_forwarded
            if action is Action.FORWARD or (action is Action.FINISH and not kept):
                data = held[cursor - base : event.end - base]
                if comments and _MARK in data:
                    data = self._drop_forged(data)
                refusal = whole.offer(data, event, contract)
                if refusal is None:
                    out.append(data)
                    sent += len(data)
                    cursor = event.end
                    if action is Action.FORWARD:
                        continue
                    stop = event.end
                    break
                before = self._clean(held[cursor - base : event.start - base])
                whole.wait(before)
                out.append(before)
                self.forwarded_bytes += len(before)
                self.contract.abort(refusal.reason, refusal.detail, force=True)
                stop = cursor = event.start
                break
            if kept:  # the upstream's own error event waits while a continuation is tried
                self.withheld = held[event.start - base : event.end - base]
            whole.wait(self._emit(held, base, cursor, event.start, out))
            stop = cursor = event.start
            break
        if stop is None:
            upto = self.decoder.boundary
            while q < len(quiet) and quiet[q] <= upto:
                whole.quiet(self._emit(held, base, cursor, quiet[q], out))
                cursor = quiet[q]
                q += 1
            whole.wait(self._emit(held, base, cursor, upto, out))
            self._held = held[upto - base :]
            self._held_start = upto
        else:
            self._drop_held()
        self.forwarded_bytes += sent
        quiet.clear()
        if error is not None:
            self._drop_held()
            self.contract.abort(Reason(error.reason), str(error))  # no-op after a FINISH
        return out[0] if len(out) == 1 else b"".join(out)

    def _emit(self, held: bytes, base: int, start: int, end: int, out: list[bytes]) -> bytes:
        """The forwardable bytes of ``held`` in stream offsets [start, end), put in ``out``."""
        data = self._clean(held[start - base : end - base])
        if data:
            out.append(data)
            self.forwarded_bytes += len(data)
        return data

    def _clean(self, data: bytes) -> bytes:
        if self._comments and _MARK in data:
            return self._drop_forged(data)
        return data

    def _drop_forged(self, data: bytes) -> bytes:
        """``data`` (whole lines) without the upstream's comment lines that look like
        the gateway's own annotation: a client must never read a forged verdict."""
        kept: list[bytes] = []
        for line in data.splitlines(keepends=True):
            if line[:1] == b":" and _forged(line):
                self.forged_comments += 1
            else:
                kept.append(line)
        return b"".join(kept)

    def eof(self) -> Verdict:
        """The upstream body ended cleanly.

        A last event that only the end completes (its blank line ended by a bare CR)
        is judged now, and its bytes wait in ``final`` for the relay to send; any
        other pending bytes are an unfinished event and are never forwarded.
        """
        if not self.done:
            try:
                events = self.decoder.close()
            except GuardError:
                events = []
            if events:
                self.final = self._judge(events, self._all_held(), None)
        clean = self.decoder.clean_end(self._all_held())  # no unfinished event left over
        self._drop_held()
        return self.contract.on_eof(clean=clean)

    def abort(self, reason: Reason, detail: str = "", *, force: bool = False) -> Verdict:
        """Stop for a reason the relay saw (timeout, disconnect, shutdown, ...).

        ``force`` replaces a final verdict too: the bytes it was reached on were
        not delivered (their send was interrupted).
        """
        self._drop_held()
        return self.contract.abort(reason, detail, force=force)

    def annotation(self, request_id: str, continued: int = 0, words: str = "") -> bytes:
        """The trailer the relay appends after the last forwarded byte (``continued``: how
        many continuations the answer took, after a cut; ``words``: the stages' own)."""
        verdict = self.contract.verdict
        if verdict is None:
            raise RuntimeError("annotation before the verdict is final")
        return render_annotation(
            self.contract.protocol,
            verdict,
            request_id,
            last_sequence_number=self.contract.last_sequence_number,
            continued=continued,
            words=words,
        )
