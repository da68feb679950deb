"""Each protocol declares the request fields that limit its answer's length: a named
client's reservation reads the output a request allows by them; a strict
client's request gets them lowered to the tokens it has left (never raised), or the first
one added when it names none."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.protocols import REGISTRY, ProtocolSpec, spec_for
from gateway.proxy.request_body import rewrite


@pytest.mark.parametrize(
    ("protocol", "request_", "changes"),
    [
        ("chat", {}, {"max_tokens": 100}),
        ("chat", {"max_tokens": 5000}, {"max_tokens": 100}),
        ("chat", {"max_completion_tokens": 5000}, {"max_completion_tokens": 100}),
        ("chat", {"max_tokens": 50}, {}),  # already below: left as the client set it
        ("completions", {"max_tokens": 5000}, {"max_tokens": 100}),
        ("responses", {}, {"max_output_tokens": 100}),
        ("messages", {"max_tokens": 4096}, {"max_tokens": 100}),
        ("gemini", {}, {"generationConfig": {"maxOutputTokens": 100}}),
        (
            "gemini",
            {"generationConfig": {"maxOutputTokens": 900, "temperature": 0}},
            {"generationConfig": {"maxOutputTokens": 100}},
        ),
        ("ollama", {"options": {"num_predict": -1}}, {"options": {"num_predict": 100}}),
    ],
)
def test_the_output_limit_is_lowered_to_what_is_left(
    protocol: str, request_: dict[str, object], changes: dict[str, object]
) -> None:
    assert spec_for(protocol).capped_output(request_, 100) == changes


def test_the_rewritten_body_keeps_the_clients_other_members() -> None:
    body = b'{"generationConfig": {"maxOutputTokens": 900, "temperature": 0}, "contents": []}'
    changes = spec_for("gemini").capped_output(
        {"generationConfig": {"maxOutputTokens": 900, "temperature": 0}}, 100
    )
    assert rewrite(body, changes) == (
        b'{"generationConfig":{"maxOutputTokens":100,"temperature":0},"contents":[]}'
    )


def test_every_protocol_with_an_answer_to_limit_declares_its_field() -> None:
    for spec in REGISTRY:
        if spec.requests is not None:
            assert spec.output_limit, spec.name


LIMITED = [spec for spec in REGISTRY if spec.output_limit and spec.requests is not None]


@pytest.mark.parametrize("spec", LIMITED, ids=lambda spec: spec.name)
def test_a_request_allows_the_output_its_own_fields_say(spec: ProtocolSpec) -> None:
    """What a client of each protocol asks, built by the protocol's own client requests
    (``gateway probe``'s), is read back by its spec: the reservation's output."""
    assert spec.requests is not None
    for stream in (True, False):
        body = spec.requests.text("model", "hi", 50, stream)
        assert spec.requested_output(body, 4096) == 50, body
    assert spec.requested_output({}, 4096) == 4096
    assert spec.requested_output(None, 7) == 7


@pytest.mark.parametrize(
    ("protocol", "request_", "output"),
    [
        ("bedrock", {"inferenceConfig": {"maxTokens": 50}}, 50),  # Converse: was 4096
        ("bedrock", {"max_tokens": 60, "anthropic_version": "bedrock-2023-05-31"}, 60),
        ("chat", {"max_completion_tokens": 60, "max_tokens": 50}, 60),  # the most allowed
        ("gemini", {"generation_config": {"max_output_tokens": 80}}, 80),
        ("ollama", {"options": {"num_predict": 90}}, 90),
        ("ollama", {"options": {"num_predict": -1}}, 4096),  # no limit: the default
        ("chat", {"max_tokens": True}, 4096),
        ("chat", {"max_output_tokens": 70}, 4096),  # another protocol's field
        ("sse", {"max_tokens": 70}, 4096),  # a path no protocol claims declares none
    ],
)
def test_the_output_is_read_by_the_requests_own_protocol(
    protocol: str, request_: dict[str, object], output: int
) -> None:
    assert spec_for(protocol).requested_output(request_, 4096) == output


@given(
    st.sampled_from(LIMITED),
    st.dictionaries(
        st.sampled_from(["max_tokens", "max_completion_tokens", "max_output_tokens", "x"]),
        st.none() | st.booleans() | st.integers(min_value=-3, max_value=10_000),
    ),
    st.integers(min_value=1, max_value=5000),
)
def test_a_capped_request_allows_at_most_the_cap(
    spec: ProtocolSpec, request_: dict[str, object], cap: int
) -> None:
    """The two halves of a strict budget agree: a request capped at ``cap`` is read back
    as allowing at most ``cap``."""
    capped = {**request_, **spec.capped_output(request_, cap)}
    assert spec.requested_output(capped, 10**9) <= cap
