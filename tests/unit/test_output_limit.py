"""Each protocol declares the request fields that limit its answer's length; a strict
client's request gets them lowered to the tokens it has left (never raised), or the first
one added when it names none."""

from __future__ import annotations

import pytest

from gateway.protocols import REGISTRY, spec_for
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
