"""The status board keeps bounded state; the status page escapes everything it shows.

The board is driven with real ``RequestRecord``s and a fake wall clock (its
minute buckets are the only time it knows). The page is a pure function of a
``StatusView``: it is rendered with hostile text in every string field and
parsed back with the standard library's HTML parser, which must find only the
page's own elements and the hostile text as text.
"""

from __future__ import annotations

from collections import Counter
from html.parser import HTMLParser

from gateway.guard import Outcome, Reason, Verdict
from gateway.observe import RequestRecord
from gateway.observe.status import MODEL_CHARS, IncompleteStream, StatusBoard
from gateway.observe.status_page import LiveStream, StatusView, render
from gateway.proxy.exchange import bare_verdict


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _record(request_id: str, **fields: object) -> RequestRecord:
    record = RequestRecord(
        request_id=request_id, route="chat", method="POST", path="/v1/x", started=0.0
    )
    record.upstream = "chat"
    for key, value in fields.items():
        setattr(record, key, value)
    return record


def _complete() -> Verdict:
    return Verdict(outcome=Outcome.COMPLETE, reason=Reason.STOP)


def test_the_board_counts_kinds_per_route_and_upstream_over_its_window() -> None:
    clock = _Clock(6000.0)  # minute 100
    board = StatusBoard(minutes=3, clock=clock)
    board.observe(_record("a", stream=True, status=200, verdict=_complete()))
    board.observe(_record("b", stream=True, status=200, verdict=bare_verdict(Reason.MISSING_DONE)))
    board.observe(_record("c", status=200))
    board.observe(_record("d", status=502))
    board.observe(_record("e", status=413, rejected="body_too_large", upstream=None))
    assert board.counts() == {
        ("chat", "chat"): Counter(complete=1, incomplete=1, plain_ok=1, plain_error=1),
        ("chat", ""): Counter(refused=1),
    }
    clock.now += 120  # minute 102: minute 100 is still in a 3-minute window
    board.observe(_record("f", stream=True, status=200, verdict=_complete()))
    assert board.counts()[("chat", "chat")]["complete"] == 2
    clock.now += 60  # minute 103: minute 100 has left the window
    assert board.counts() == {("chat", "chat"): Counter(complete=1)}
    clock.now += 600
    assert board.counts() == {}


def test_the_board_keeps_the_last_incomplete_streams_and_nothing_more() -> None:
    board = StatusBoard(keep=50, clock=_Clock(1000.0))
    long_model = "m" * 10_000
    for index in range(120):
        verdict = bare_verdict(Reason.UPSTREAM_DISCONNECT) if index % 2 else _complete()
        board.observe(
            _record(
                f"r{index}",
                stream=True,
                status=200,
                verdict=verdict,
                model=long_model,
                bytes_out=index,
                duration=0.5,
            )
        )
    kept = list(board.incomplete)
    assert len(kept) == 50
    assert [row.request_id for row in kept] == [f"r{i}" for i in range(21, 120, 2)]
    assert all(row.reason == "upstream_disconnect" for row in kept)
    assert kept[-1].bytes_out == 119
    assert all(len(row.model or "") <= MODEL_CHARS + len("...(cut)") for row in kept)
    # the buckets hold one counter per minute, whatever the traffic
    assert len(board._buckets) == 1


HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)>\"'&amp;<b>b</b>"


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str | None]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attributes.extend(attrs)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_the_page_escapes_every_value_it_shows() -> None:
    view = StatusView(
        now=2000.0,
        version=HOSTILE,
        python=HOSTILE,
        pid=1,
        workers=2,
        started=1000.0,
        tracing=True,
        minutes=15,
        active=[(HOSTILE, 3)],
        live=[LiveStream(HOSTILE, HOSTILE, HOSTILE, 1.5, 10, None)],
        counts={(HOSTILE, HOSTILE): Counter(complete=1, incomplete=2)},
        incomplete=[IncompleteStream(1500.0, HOSTILE, HOSTILE, HOSTILE, HOSTILE, HOSTILE, 7, 0.25)],
        config={HOSTILE: [HOSTILE]},
    )
    page = render(view)
    parsed = _Collect()
    parsed.feed(page)
    allowed = {
        "html", "head", "meta", "title", "style", "body", "header", "h1", "h2", "p",
        "section", "table", "thead", "tbody", "tr", "th", "td", "code", "span", "pre",
    }  # fmt: skip
    assert set(parsed.tags) <= allowed
    # no event handler, no link, no external asset: only these attributes exist
    assert {name for name, _ in parsed.attributes} <= {
        "lang", "charset", "http-equiv", "content", "name", "class", "id",
    }  # fmt: skip
    text = "".join(parsed.text)
    # every string field shows as the text it is (the config's JSON escapes the quote)
    assert text.count(HOSTILE) >= 10
    assert '<meta http-equiv="refresh" content="5">' in page
