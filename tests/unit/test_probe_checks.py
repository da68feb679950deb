"""The probe's checks come from the protocol registry, and its requests say what they mean.

Each request is checked with the registry's own readers: the path is
detected as the protocol it is for, and it asks for a stream exactly when the
check streams.
"""

from __future__ import annotations

import json

import pytest

from gateway.probe.checks import (
    CHECKS,
    INVALID_MODEL,
    TOOL,
    Target,
    build_request,
    checks_for,
    usage_position,
)
from gateway.protocols import REGISTRY, ProtocolSpec, detect


@pytest.mark.parametrize("spec", REGISTRY, ids=[spec.name for spec in REGISTRY])
def test_a_protocol_gets_the_checks_the_registry_says_it_has(spec: ProtocolSpec) -> None:
    checks = checks_for(spec)
    if spec.requests is None:
        assert checks == []
        return
    assert ("usage" in checks) == (spec.ask_for_usage is not None)
    assert ("tool_call" in checks) == (spec.requests.tool is not None)
    assert ("choices" in checks) == (spec.requests.choices is not None)
    assert {"stream", "plain", "interrupted", "refused"} <= set(checks)
    assert checks == [check for check in CHECKS if check in checks]


def test_every_protocol_a_client_speaks_is_probed() -> None:
    assert [s.name for s in REGISTRY if s.requests is not None] == [
        "chat",
        "completions",
        "responses",
        "messages",
        "gemini",
        "ollama",
        "bedrock",
    ]


@pytest.mark.parametrize(
    ("spec", "check"),
    [(spec, check) for spec in REGISTRY for check in checks_for(spec)],
    ids=lambda value: getattr(value, "name", value),
)
def test_each_request_is_what_its_check_says(spec: ProtocolSpec, check: str) -> None:
    target = Target("r", "/prefix", spec, "model-a")
    request = build_request(check, target, {"x-sim-fault": "none"})
    assert request.path.startswith("/prefix/")
    rest = request.path[len("/prefix") :]
    if spec.name == "ollama":  # probed below its documented route: prefix /api, fixed protocol
        assert detect("/api" + rest) is spec
    elif spec.name == "bedrock":  # below a prefix that ends in /model, as the runtime's paths
        assert detect("/model" + rest) is spec
    else:
        assert detect(rest) is spec
    assert spec.wants_stream(rest.split("?")[0], request.body) == (check != "plain")
    assert request.stream == (check != "plain")
    assert request.headers["content-type"] == "application/json"
    assert request.headers["x-sim-fault"] == "none"
    wire = request.content().decode()
    model = INVALID_MODEL if check == "refused" else "model-a"
    assert model in request.path + wire
    if check == "tool_call":
        assert TOOL.name in wire
    if check == "choices":
        assert request.body["n"] == 2
    if check == "usage":
        assert request.body["stream_options"] == {"include_usage": True}
    json.loads(wire)


def test_a_check_a_protocol_lacks_is_refused() -> None:
    messages = next(spec for spec in REGISTRY if spec.name == "messages")
    with pytest.raises(ValueError, match="no check 'choices'"):
        build_request("choices", Target("r", "/v1", messages, "m"))


def _chunk(usage: bool, finish: str | None = None, choices: bool = True) -> bytes:
    obj = {
        "choices": [{"index": 0, "delta": {}, "finish_reason": finish}] if choices else [],
        "usage": {"prompt_tokens": 1} if usage else None,
    }
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@pytest.mark.parametrize(
    ("chunks", "position"),
    [
        ([_chunk(False), _chunk(False, "stop"), _chunk(True, choices=False)], "after_finish"),
        ([_chunk(False), _chunk(True, "stop")], "with_finish"),
        ([_chunk(True), _chunk(False, "stop")], "before_finish"),
        ([_chunk(True), _chunk(True, "stop")], "several_chunks"),
        ([_chunk(False), _chunk(False, "stop")], "absent"),
    ],
)
def test_where_the_usage_chunk_came(chunks: list[bytes], position: str) -> None:
    tail = b"data: [DONE]\n\n: gateway outcome=complete reason=stop request_id=x\n"
    assert usage_position(b"".join(chunks) + tail) == position
