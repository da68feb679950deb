"""Whether a leader's answer becomes an entry, and why not: the cache's one rule.

An answer is kept only when the client got all of it (its last send went out),
with a 2xx status, not continued after a cut, within ``cache_max_entry_bytes``,
and whole: a stream by the guard's verdict (complete, with a reason in
``cache_reasons``), a plain JSON answer by the finish it reports
(``ProtocolSpec.answer_finish``; a gzip or deflate body is decoded, within a
bound, only to read it).
"""

from __future__ import annotations

import zlib

from gateway.guard import Reason
from gateway.guard.jsonparse import loads
from gateway.proxy.answers import one_json_text
from gateway.proxy.exchange import Exchange
from gateway.proxy.headers import get_header
from gateway.store import Writer
from gateway.streamlog import Recorder

__all__ = ["decoded", "judge", "plain_finish", "streamed"]


def streamed(exchange: Exchange, recorder: Recorder) -> bool:
    """Whether the answer went out as a guarded stream (its last send: the trailer)."""
    status = recorder.status
    framing = exchange.spec.framing
    content_type = get_header(recorder.headers, b"content-type") or b""
    return (
        200 <= status < 300
        and status not in (204, 205)
        and framing.is_stream(content_type.decode("latin-1"))
        and exchange.scope["method"] != "HEAD"
        and (exchange.record.stream or not framing.announced_only)
    )


def judge(
    exchange: Exchange, recorder: Recorder, writer: Writer, streamed: bool
) -> tuple[str | None, str]:
    """(why the answer is not kept, or None: it is kept; its finish reason). The
    reasons are a closed vocabulary: the verdict's, or ``upstream_status``,
    ``continued``, ``too_large``, ``missing_finish``, a request error, or the gateway's
    own refusal of the answer (``overloaded``: a stream over the cap)."""
    record = exchange.record
    config = exchange.route.config
    verdict = record.verdict
    if not recorder.ended:
        if verdict is not None and not verdict.complete:
            return str(verdict.reason), ""
        return str(exchange.stop_reason or Reason.CLIENT_DISCONNECT), ""
    if record.rejected is not None:  # the gateway's own refusal (a late stream over the cap)
        return record.rejected, ""
    if not 200 <= recorder.status < 300:
        return "upstream_status", ""
    if record.continued or record.billed is not None or b" continued=" in recorder.final:
        return "continued", ""
    if writer.stopped or recorder.size > config.cache_max_entry_bytes:
        return "too_large", ""
    if streamed:
        if verdict is None:
            return str(Reason.INVALID_SHAPE), ""
        reason = str(verdict.reason)
        if not verdict.complete or reason not in config.cache_reasons:
            return reason, reason
        return None, reason
    if record.error is not None:
        return str(record.error), ""
    finish = plain_finish(exchange, recorder)
    if finish is None:
        return "missing_finish", ""
    return (None if finish in config.cache_reasons else finish), finish


def plain_finish(exchange: Exchange, recorder: Recorder) -> str | None:
    """A whole plain answer's finish reason (``ProtocolSpec.answer_finish``), or None."""
    finish = exchange.spec.answer_finish
    content_type = (get_header(recorder.headers, b"content-type") or b"").lower()
    if finish is None or not one_json_text(content_type.decode("latin-1")):
        return None
    if recorder.body is None:
        return None
    body = decoded(
        b"".join(recorder.body),
        get_header(recorder.headers, b"content-encoding"),
        exchange.route.config.cache_max_entry_bytes * _DECODED_RATIO,
    )
    if body is None:
        return None
    try:
        obj = loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    reason = finish(obj)
    return str(reason) if reason is not None else None


#: A plain answer's decoded body may be this many times its stored size, at most.
_DECODED_RATIO = 32


def decoded(body: bytes, coding: bytes | None, limit: int) -> bytes | None:
    """A body in ``Content-Encoding`` ``coding`` decoded (gzip, deflate), at most ``limit``
    bytes; None for a coding this cannot read, a broken body, or one too large."""
    name = (coding or b"identity").strip().lower()
    if name == b"identity":
        return body
    if name in (b"gzip", b"x-gzip"):
        decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif name == b"deflate":
        decoder = zlib.decompressobj(zlib.MAX_WBITS if body[:1] == b"\x78" else -zlib.MAX_WBITS)
    else:
        return None
    try:
        out = decoder.decompress(body, limit)
    except zlib.error:
        return None
    if decoder.unconsumed_tail or not decoder.eof:
        return None
    return out
