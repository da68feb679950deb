"""The structured-output check (gateway.schema): each fault found at the delta that
carries it, what only the end shows at the end, hostile schemas unchecked, the same
verdict however the text is split."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.schema import (
    ANY_JSON,
    Bounds,
    Kind,
    Part,
    PartKind,
    Result,
    Schemas,
    StreamCheck,
    admit,
    safe_pattern,
)

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0},
        "role": {"enum": ["admin", "user"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def text(delta: str) -> list[Part]:
    return [Part(PartKind.TEXT, "", delta)]


def run(schema: Any, deltas: list[str]) -> tuple[int | None, StreamCheck]:
    """Feed each delta as one event, then the end; the index of the first fault."""
    check = StreamCheck(Schemas(answer=schema))
    for index, delta in enumerate(deltas):
        if check.feed(text(delta), index) is not None:
            return index, check
    if check.feed([Part(PartKind.END)], len(deltas)) is not None:
        return len(deltas), check
    return None, check


@pytest.mark.parametrize(
    ("deltas", "at", "pointer", "words"),
    [
        (['{"name": "a", "age": ', '"3"', "}"], 1, "/age", "string where"),
        (['{"name": "a", "ag', 'e": 1.5', "}"], 2, "/age", "number where"),
        (['{"name": "a", "age": 3, "x', 'y": 1}'], 1, "/xy", "not allowed"),
        (['{"role": "ad', 'mon"}'], 1, "/role", "enum"),
        (['{"age": -', "1,"], 1, "/age", "below 0"),
        (['{"tags": ["a", "b", ', '"c"]}'], 1, "/tags/2", "more than 2 items"),
        (['{"tags": [1]}'], 0, "/tags/0", "integer where"),
        (['{"name": "' + "x" * 30 + '"}'], 0, "/name", "longer than 20"),
        (["Sure! Here is the JSON: ", '{"name": "a"}'], 0, "", "not one JSON document"),
        (['{"name": "a", "age": 1}', " Hope this helps!"], 1, "", "not one JSON document"),
        (['{"name": "a"}'], 1, "", "must contain"),  # required: the end's
        (['{"name": "a", "age": 1'], 1, "/age", "not one whole"),  # cut mid-object
    ],
)
def test_a_fault_is_found_at_the_delta_that_carries_it(
    deltas: list[str], at: int, pointer: str, words: str
) -> None:
    index, check = run(PERSON, deltas)
    verdict = check.verdict()
    assert verdict is not None
    assert (index, verdict.result, verdict.pointer, verdict.event) == (
        at,
        Result.INVALID,
        pointer,
        at,
    )
    assert words in verdict.detail


def test_a_valid_answer_is_valid_and_integral_numbers_are_integers() -> None:
    index, check = run(PERSON, ['{"name": "a", ', '"age": 3.0, "role": "user", "tags": ["x"]}'])
    assert index is None
    verdict = check.verdict()
    assert verdict is not None
    assert verdict.result is Result.VALID


def test_json_mode_takes_any_one_document_and_nothing_around_it() -> None:
    assert run(ANY_JSON, ['[1, {"a"', ": null}]"])[0] is None
    assert run(ANY_JSON, ["Sure: ", "{}"])[0] == 0
    assert run(ANY_JSON, [""])[1].verdict() is not None  # nothing came: not an answer


def test_a_keyword_the_incremental_check_does_not_know_is_judged_at_the_end() -> None:
    schema = {"anyOf": [{"type": "string"}, {"type": "integer"}]}
    assert run(schema, ['"a"'])[0] is None
    index, check = run(schema, ["[1]"])
    verdict = check.verdict()
    assert index == 1
    assert verdict is not None
    assert verdict.result is Result.INVALID


def test_refs_are_followed_and_a_recursive_schema_is_checked() -> None:
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    }
    assert run(tree, ['{"kids": [{"kids": []}]}'])[0] is None
    index, check = run(tree, ['{"kids": [{"kids": [{"x"', ": 1}]}]}"])
    verdict = check.verdict()
    assert index == 0
    assert verdict is not None
    assert verdict.pointer == "/kids/0/kids/0/x"


def test_tool_calls_are_judged_against_their_tool_and_an_undeclared_tool_fails() -> None:
    check = StreamCheck(Schemas(tools={"weather": PERSON}))
    assert check.feed([Part(PartKind.TOOL_NAME, "0", "weather")], 0) is None
    assert check.feed([Part(PartKind.TOOL_ARGS, "0", '{"name": "a", "age": 1}')], 1) is None
    assert check.feed([Part(PartKind.TOOL_NAME, "1", "launch")], 2) is not None
    verdicts = check.finish()
    assert [(v.kind, v.result, v.tool) for v in verdicts] == [
        (Kind.TOOL, Result.VALID, "weather"),
        (Kind.TOOL, Result.INVALID, "launch"),
    ]


def test_tool_arguments_cut_mid_string_fail_at_the_close() -> None:
    check = StreamCheck(Schemas(tools={"weather": PERSON}))
    check.feed([Part(PartKind.TOOL_NAME, "a", "weather")], 0)
    check.feed([Part(PartKind.TOOL_ARGS, "a", '{"name": "Par')], 1)
    fault = check.feed([Part(PartKind.TOOL_DONE, "a")], 2)
    assert fault is not None
    assert fault.event == 2
    assert fault.kind is Kind.TOOL


def test_a_refusal_is_refused_not_a_fault() -> None:
    check = StreamCheck(Schemas(answer=PERSON))
    check.feed([Part(PartKind.REFUSAL, "", "I can't help with that.")], 0)
    verdict = check.verdict()
    assert verdict is not None
    assert verdict.result is Result.REFUSED


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        (nested(10_000), "nested"),
        ({"enum": [str(i) for i in range(100_000)]}, "enum"),
        ({"type": "string", "pattern": "^(a+)+$"}, "backtrack"),
        ({"type": "string", "pattern": "(a|aa)*c"}, "backtrack"),
        (
            {
                "$ref": "#/$defs/a",
                "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
            },
            "cycle",
        ),
        ({"$ref": "https://example.invalid/s.json"}, "leaves"),
        ({"type": "string", "pattern": "("}, "compile"),
    ],
)
def test_a_schema_out_of_bounds_is_unchecked_with_its_reason_never_valid(
    schema: dict[str, Any], why: str
) -> None:
    _, check = run(schema, ['"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!"'])
    verdict = check.verdict()
    assert verdict is not None
    assert verdict.result is Result.UNCHECKED
    assert why in verdict.detail


def test_safe_patterns_pass() -> None:
    for pattern in ("^[a-z]+@[a-z]+\\.com$", "^\\d{3}-\\d{4}$", "^(a|b)$"):
        assert safe_pattern(pattern, Bounds()) is None
    assert admit(PERSON, Bounds()) is None


def test_an_answer_over_the_bound_is_unchecked_and_its_text_not_kept() -> None:
    bounds = Bounds(max_answer_bytes=1_000)
    check = StreamCheck(Schemas(answer={"type": "array"}), bounds)
    check.feed(text("["), 0)
    for index in range(1, 200):
        assert check.feed(text('"abcdefgh", '), index) is None
    check.feed(text("1]"), 200)
    check.feed([Part(PartKind.END)], 201)
    verdict = check.verdict()
    assert verdict is not None
    assert verdict.result is Result.UNCHECKED


def test_an_answer_nested_past_the_bound_is_unchecked() -> None:
    _, check = run({"type": "array"}, ["[" * 100, "]" * 100])
    verdict = check.verdict()
    assert verdict is not None
    assert verdict.result is Result.UNCHECKED


DOCS = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text('ab"\\é', max_size=4),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from("xyz"), kids, max_size=3)
    ),
    max_leaves=8,
)


@given(DOCS, st.lists(st.integers(1, 12), min_size=1, max_size=30))
def test_same_text_any_split_same_verdict(doc: Any, cuts: list[int]) -> None:
    schema = {
        "type": "object",
        "properties": {"x": {"type": "array"}, "y": {"type": "string"}},
        "additionalProperties": {"type": ["null", "boolean", "integer"]},
    }
    whole = json.dumps({"x": [doc], "y": "é", "z": doc}, ensure_ascii=False)
    deltas, at = [], 0
    for cut in cuts:
        deltas.append(whole[at : at + cut])
        at += cut
    deltas.append(whole[at:])
    one = run(schema, [whole])[1].verdict()
    split = run(schema, [d for d in deltas if d])[1].verdict()
    assert one is not None
    assert split is not None
    assert (one.result, one.pointer, one.detail) == (split.result, split.pointer, split.detail)


def test_the_stage_reader_judges_the_contracts_parse_not_the_data_again() -> None:
    """A reader handed the contract's parse (``WholeEvents.parsed``) judges that object:
    it never parses the event's data a second time (the check's cost per event)."""
    from gateway.guard import Event, WholeEvents
    from gateway.protocols import spec_for
    from gateway.schema import Bounds, StreamCheck
    from gateway.schema.reader import Reader

    structured = spec_for("chat").structured
    assert structured is not None
    body = {"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}}
    check = StreamCheck(structured.schemas(body), Bounds())
    check.prepare()
    whole = WholeEvents()
    reader = Reader(check, structured.parts, ends=True, whole=whole)
    unread = Event(data="not JSON: only the shared parse can be judged")
    for piece in ('{"name": ', '"a", "age": 3}'):
        whole.parsed = {"choices": [{"index": 0, "delta": {"content": piece}}]}
        assert reader.check(b"", unread) is None
    whole.parsed = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    assert reader.check(b"", unread) is None
    assert [str(v.result) for v in reader.verdicts()] == ["valid"]
