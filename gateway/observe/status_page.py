"""The ``/status`` page: plain server-rendered HTML, refreshed by the browser every few seconds.

``render(view)`` is a pure function of a ``StatusView`` (what the app
gathered: live streams, the status board's counts and incomplete streams,
build and redacted configuration). Every value from outside, and every
other value too, goes through ``html.escape``: a model name is a client's
claim and may be any text, lone surrogates included (they become U+FFFD, so
the page always encodes as UTF-8). No script, no external asset: one inline style
sheet and a meta refresh. The response's Content-Security-Policy forbids
scripts outright, should anything ever slip through.
"""

from __future__ import annotations

import html
import json
import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.observe.status import FEATURE_KINDS, IncompleteStream

__all__ = ["HEADERS", "REFRESH_SECONDS", "ClientUse", "LiveStream", "StatusView", "render"]

REFRESH_SECONDS = 5
#: Live streams listed at most (the count above the table is always the whole number).
MAX_LIVE_ROWS = 50
HEADERS = {
    "cache-control": "no-store",
    "content-security-policy": (
        "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1d2330; }
h1 { font-size: 1.4em; margin: 0 0 .2em; } h2 { font-size: 1.1em; margin: 1.6em 0 .4em; }
.meta { color: #5a6272; margin: 0; }
table { border-collapse: collapse; margin: .3em 0; }
th, td { border-bottom: 1px solid #dde1e8; padding: .25em .7em; text-align: left; }
th { background: #f1f3f7; font-weight: 600; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.bad { color: #b3261e; font-weight: 600; } .none { color: #5a6272; font-style: italic; }
code, pre { font: 12px/1.35 ui-monospace, monospace; }
pre { background: #f6f7f9; padding: .8em; max-width: 70em; overflow-x: auto; }
"""


@dataclass(frozen=True, slots=True)
class ClientUse:
    """One limit of a named client against its counter (None: the backend did not answer)."""

    client: str
    scope: str  # "all", "route=<name>" or "model=<name>"
    limit: str
    used: int | None
    value: int


@dataclass(frozen=True, slots=True)
class LiveStream:
    request_id: str
    route: str
    model: str | None
    age: float  # seconds since the request began
    bytes_out: int
    time_to_first_token: float | None


@dataclass(frozen=True, slots=True)
class StatusView:
    now: float  # wall-clock seconds
    version: str
    python: str
    pid: int
    workers: int
    started: float  # wall-clock seconds
    tracing: bool
    minutes: int
    active: Sequence[tuple[str, int]]  # (route, active streams)
    live: Sequence[LiveStream]
    counts: dict[tuple[str, str], Counter[str]]
    incomplete: Sequence[IncompleteStream]  # newest first
    config: dict[str, Any] = field(default_factory=dict)
    clients: Sequence[ClientUse] = ()
    #: With several workers: how many workers' shares the page merged (None: one process's).
    merged_workers: int | None = None
    #: (route, upstream, priority tier, state: in, ejected, half_open, cooling), pools only
    pools: Sequence[tuple[str, str, int, str]] = ()
    #: (what, its state): the cache, resume, the stream store, the limits backend, Redis
    services: Sequence[tuple[str, str]] = ()
    #: (client, team, USD today, USD this month), from the spend report (``gateway.spend``)
    spend: Sequence[tuple[str, str, str, str]] = ()
    #: Issued keys (never a secret): (id, client, team, state, last used: unix time or None)
    keys: Sequence[tuple[str, str, str, str, float | None]] = ()


#: A lone surrogate (a client's ``"\\ud800"``) has no UTF-8 form: shown as U+FFFD.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _e(value: object) -> str:
    return html.escape(_SURROGATE.sub("\ufffd", str(value)), quote=True)


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 120:
        return f"{minutes} min {rest} s"
    return f"{minutes // 60} h {minutes % 60} min"


def _table(head: Iterable[str], rows: Iterable[Iterable[str]], numeric: set[int]) -> str:
    """A table (no head row when ``head`` is empty); every cell is already escaped HTML."""
    parts = ["<table>"]
    titles = [f"<th>{_e(title)}</th>" for title in head]
    if titles:
        parts.extend(["<thead><tr>", *titles, "</tr></thead>"])
    parts.append("<tbody>")
    for row in rows:
        parts.append("<tr>")
        for index, cell in enumerate(row):
            parts.append(f'<td class="n">{cell}</td>' if index in numeric else f"<td>{cell}</td>")
        parts.append("</tr>")
    parts.append("</tbody></table>")
    return "".join(parts)


def _none(text: str) -> str:
    return f'<p class="none">{_e(text)}</p>'


def _live(view: StatusView) -> str:
    total = sum(count for _, count in view.active)
    parts = [f'<section id="live"><h2>Active streams: {total}</h2>']
    parts.append(
        _table(
            ["route", "active streams"],
            ([_e(route), _e(count)] for route, count in view.active),
            {1},
        )
    )
    if view.live:
        rows = (
            [
                f"<code>{_e(s.request_id)}</code>",
                _e(s.route),
                _e(s.model or "-"),
                _e(_duration(s.age)),
                _e(s.bytes_out),
                _e("-" if s.time_to_first_token is None else _duration(s.time_to_first_token)),
            ]
            for s in view.live[:MAX_LIVE_ROWS]
        )
        parts.append(
            _table(
                ["request id", "route", "model", "running for", "bytes sent", "first token"],
                rows,
                {3, 4, 5},
            )
        )
    parts.append("</section>")
    return "".join(parts)


def _counts(view: StatusView) -> str:
    parts = [f'<section id="counts"><h2>Requests in the last {view.minutes} minutes</h2>']
    if not view.counts:
        parts.append(_none("No request has finished in this window."))
    else:
        rows = []
        for (route, upstream), kinds in sorted(view.counts.items()):
            streams = kinds["complete"] + kinds["incomplete"]
            ratio = f"{100 * kinds['incomplete'] / streams:.1f} %" if streams else "-"
            bad = ' class="bad"' if kinds["incomplete"] else ""
            rows.append(
                [
                    _e(route),
                    _e(upstream or "-"),
                    _e(kinds["complete"]),
                    f"<span{bad}>{_e(kinds['incomplete'])}</span>",
                    _e(ratio),
                    _e(kinds["plain_ok"]),
                    _e(kinds["plain_error"]),
                    _e(kinds["refused"]),
                ]
            )
        parts.append(
            _table(
                [
                    "route",
                    "upstream",
                    "streams complete",
                    "streams incomplete",
                    "incomplete",
                    "other answers < 400",
                    "other answers ≥ 400",
                    "refused",
                ],
                rows,
                {2, 3, 4, 5, 6, 7},
            )
        )
    parts.append("</section>")
    return "".join(parts)


def _pools(view: StatusView) -> str:
    """Each pooled upstream's tier and state in this worker: which one serves now."""
    if not view.pools:
        return ""
    rows = [
        [
            _e(route),
            _e(upstream),
            _e(tier),
            f'<span class="bad">{_e(state)}</span>' if state != "in" else _e(state),
        ]
        for route, upstream, tier, state in view.pools
    ]
    return (
        '<section id="pools"><h2>Upstream pools</h2>'
        + _table(["route", "upstream", "priority", "state"], rows, {2})
        + "</section>"
    )


def _services(view: StatusView) -> str:
    """The cache, resume, the stream store, the limits backend and Redis, and what the
    features did in the window (the board's ``FEATURE_KINDS``)."""
    done: Counter[str] = Counter()
    for kinds in view.counts.values():
        done.update({kind: kinds[kind] for kind in FEATURE_KINDS if kinds[kind]})
    rows = [[_e(name), _e(state)] for name, state in view.services]
    rows.append(
        [
            _e(f"in the last {view.minutes} minutes"),
            _e(", ".join(f"{kind} {done[kind]}" for kind in FEATURE_KINDS) or "-"),
        ]
    )
    return (
        '<section id="services"><h2>Cache, resume, stores and Redis</h2>'
        + _table([], rows, set())
        + "</section>"
    )


def _incomplete(view: StatusView) -> str:
    parts = ['<section id="incomplete"><h2>Incomplete streams, newest first</h2>']
    if not view.incomplete:
        parts.append(_none("No incomplete stream since the gateway started."))
    else:
        rows = (
            [
                _e(_utc(s.at)),
                f"<code>{_e(s.request_id)}</code>",
                _e(s.route),
                _e(s.upstream or "-"),
                _e(s.model or "-"),
                f'<span class="bad">{_e(s.reason)}</span>',
                _e(s.bytes_out),
                _e(_duration(s.duration)),
            ]
            for s in view.incomplete
        )
        parts.append(
            _table(
                [
                    "ended (UTC)",
                    "request id",
                    "route",
                    "upstream",
                    "model",
                    "reason",
                    "bytes sent",
                    "duration",
                ],
                rows,
                {6, 7},
            )
        )
    parts.append("</section>")
    return "".join(parts)


def _money(limit: str, value: int) -> str:
    """A money limit's nano-dollars in dollars; any other count as it is."""
    return f"${value / 1e9:.6f}" if limit.startswith("usd_") else str(value)


def _spend(view: StatusView) -> str:
    if not view.spend:
        return ""
    rows = ([_e(c), _e(t), _e(f"${d}"), _e(f"${m}")] for c, t, d, m in view.spend)
    return (
        '<section id="spend"><h2>Spend</h2>'
        + _table(["client", "team", "today (UTC)", "this month"], rows, {2, 3})
        + "</section>"
    )


def _clients(view: StatusView) -> str:
    if not view.clients:
        return ""
    rows = (
        [
            _e(u.client),
            _e(u.scope),
            _e(u.limit),
            _e("unavailable" if u.used is None else _money(u.limit, u.used)),
            _e(_money(u.limit, u.value)),
            _e("-" if u.used is None else f"{100 * u.used / u.value:.0f} %"),
        ]
        for u in view.clients
    )
    return (
        '<section id="clients"><h2>Clients and their limits</h2>'
        + _table(["client", "scope", "limit", "used", "of", "share"], rows, {3, 4, 5})
        + "</section>"
    )


def _keys(view: StatusView) -> str:
    if not view.keys:
        return ""
    rows = (
        [
            _e(key_id),
            _e(client),
            _e(team or "-"),
            _e(state),
            _e("never" if used is None else _utc(used)),
        ]
        for key_id, client, team, state, used in view.keys
    )
    return (
        '<section id="keys"><h2>Issued keys</h2>'
        + _table(["id", "client", "team", "state", "last used (UTC)"], rows, set())
        + "</section>"
    )


def _build(view: StatusView) -> str:
    rows = [
        ["version", _e(view.version)],
        ["Python", _e(view.python)],
        ["started (UTC)", _e(_utc(view.started))],
        ["worker", _e(f"process {view.pid}, one of {view.workers}")],
        ["tracing", _e("on" if view.tracing else "off")],
    ]
    config = json.dumps(view.config, indent=2, sort_keys=True, ensure_ascii=False)
    return (
        '<section id="build"><h2>Build and configuration</h2>'
        + _table([], rows, set())
        + "<p>Effective configuration, secrets redacted (as <code>gateway check-config</code>"
        " prints it):</p>" + f"<pre>{_e(config)}</pre></section>"
    )


def render(view: StatusView) -> str:
    """The whole page."""
    uptime = _duration(max(0.0, view.now - view.started))
    meta = (
        f"Version {view.version}, up {uptime}; as of {_utc(view.now)} UTC, refreshed every "
        f"{REFRESH_SECONDS} s. "
        + (
            f"Counts and streams are those of all {view.merged_workers} worker processes."
            if view.merged_workers is not None
            else "Counts are this worker process's"
            + (f" (one of {view.workers})." if view.workers > 1 else ".")
        )
    )
    return "".join(
        [
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            "<title>Gateway status</title>",
            f"<style>{_STYLE}</style></head><body>",
            '<header><h1>llm-stream-gateway status</h1><p class="meta">',
            _e(meta),
            "</p></header>",
            _live(view),
            _counts(view),
            _pools(view),
            _services(view),
            _incomplete(view),
            _clients(view),
            _spend(view),
            _keys(view),
            _build(view),
            "</body></html>",
        ]
    )
