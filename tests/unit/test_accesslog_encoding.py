"""The access log's orjson fast path writes the standard library's bytes, record for record.

``encode_line`` takes orjson only where its output is the same; these
generate records with every kind of string (controls, DEL, non-ASCII, lone
surrogates), times from zero to absurd (and non-finite), and token counts
beyond 64 bits, and compare the line with ``json.dumps``'s.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from gateway.guard import Reason
from gateway.guard.verdict import Outcome, Usage, Verdict
from gateway.observe.accesslog import FLOAT_FIELDS, encode_line, log_fields
from gateway.observe.record import Attempt, RequestRecord
from gateway.policy.failover import Result

_ANY_CHAR = st.characters(codec=None, exclude_categories=())
#: ASCII (controls and DEL among it): the lines orjson writes, mostly.
_ASCII = st.one_of(
    st.text(st.characters(max_codepoint=127), max_size=12),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=300),
)
_ANY = st.one_of(
    st.text(_ANY_CHAR, max_size=20),
    st.text(st.sampled_from('ab\x00\x1f\x7f\x80\u00e9\u2028\U0001f600\ud800"\\/'), max_size=12),
)
_SECONDS = st.one_of(
    st.none(),
    st.floats(min_value=0.0, max_value=1e5),
    st.floats(min_value=0.0, max_value=1e-6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1e-7, 4.9999e-7, 5e-7, 1e13, 1e14, 9.99e12]),
)
_COUNT = st.none() | st.integers(min_value=-(2**70), max_value=2**70) | st.integers(0, 10**6)


@st.composite
def records(draw: st.DrawFn, text: st.SearchStrategy[str]) -> RequestRecord:
    _TEXT = text
    _MAYBE_TEXT = st.none() | text
    record = RequestRecord(
        request_id=draw(_TEXT),
        route=draw(_TEXT),
        method=draw(st.sampled_from(["POST", "GET", ""])),
        path=draw(_TEXT),
        started=0.0,
        client=draw(_MAYBE_TEXT),
        status=draw(st.integers(0, 599)),
        model=draw(_MAYBE_TEXT),
        upstream_model=draw(_MAYBE_TEXT),
        user_agent=draw(_MAYBE_TEXT),
        stream=draw(st.booleans()),
        upstream_request_id=draw(_MAYBE_TEXT),
        upstream=draw(_MAYBE_TEXT),
        time_to_first_byte=draw(_SECONDS),
        time_to_first_token=draw(_SECONDS),
        duration=draw(_SECONDS.filter(lambda v: v is not None)),
        bytes_in=draw(st.integers(0, 2**40)),
        bytes_out=draw(st.integers(0, 2**40)),
        rejected=draw(_MAYBE_TEXT),
        error=draw(_MAYBE_TEXT),
    )
    if draw(st.booleans()):
        record.usage = Usage(draw(_COUNT), draw(_COUNT), draw(_COUNT), draw(_COUNT))
    if draw(st.booleans()):
        record.verdict = Verdict(
            outcome=draw(st.sampled_from(list(Outcome))),
            reason=draw(st.sampled_from(list(Reason))),
            raw_finish_reasons=draw(st.dictionaries(st.integers(0, 3), _TEXT, max_size=3)),
        )
    record.attempts = draw(
        st.lists(
            st.builds(
                Attempt,
                _TEXT,
                st.sampled_from(list(Result)),
                _SECONDS.filter(lambda v: v is not None),
            ),
            max_size=3,
        )
    )
    return record


def _stdlib(fields: dict[str, object]) -> str:
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=True)


@given(records(_ASCII))
def test_an_ascii_record_s_line_is_the_standard_library_s(record: RequestRecord) -> None:
    fields = log_fields(record)
    assert encode_line(fields) == _stdlib(fields)


@given(records(_ANY))
def test_any_record_s_line_is_the_standard_library_s(record: RequestRecord) -> None:
    fields = log_fields(record)
    assert encode_line(fields) == _stdlib(fields)


def test_the_fast_path_is_taken_for_a_usual_record() -> None:
    """The test above cannot tell a fallback from the fast path: this pins that an
    ordinary line goes through orjson (its bytes, decoded)."""
    import orjson

    record = RequestRecord("rid", "default", "POST", "/v1/chat/completions", 0.0)
    record.duration, record.time_to_first_byte, record.status = 0.0123, 0.004, 200
    record.attempts = [Attempt("a", Result.OK, 0.01)]
    fields = log_fields(record)
    assert encode_line(fields) == orjson.dumps(fields).decode() == _stdlib(fields)


def _floats(value: object, where: str) -> list[str]:
    if isinstance(value, float):
        return [where]
    if isinstance(value, dict):
        return [f for k, v in value.items() for f in _floats(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [f for v in value for f in _floats(v, f"{where}[]")]
    return []


@given(records(_ASCII))
def test_every_float_of_a_line_is_where_encode_line_checks(record: RequestRecord) -> None:
    """encode_line checks the floats it knows of: a field added with a float elsewhere
    must be added to FLOAT_FIELDS (or the check would let an exponent form through)."""
    known = {f".{key}" for key in FLOAT_FIELDS} | {".attempts[].duration_ms"}
    assert set(_floats(log_fields(record), "")) <= known
