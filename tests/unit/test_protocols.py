"""The protocol registry is the one place protocols are known, and everything agrees with it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.guard import Protocol
from gateway.guard.contract import contract_for
from gateway.protocols import ANY_PATH, REGISTRY, CredentialStyle, detect, spec_for
from gateway.settings import RouteConfig, Settings

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_protocol_has_exactly_one_spec_and_contract() -> None:
    names = [spec.protocol for spec in REGISTRY]
    assert sorted(names) == sorted(Protocol)
    for spec in REGISTRY:
        assert spec_for(spec.name) is spec
        assert contract_for(spec.protocol) is spec.contract
        assert spec.contract.protocol is spec.protocol


def _documented_table() -> dict[str, list[str]]:
    text = (DOCS / "protocols.md").read_text()
    head = text.index("| protocol | request path ends with |")
    rows = {}
    for line in text[head:].splitlines()[2:]:
        if not line.startswith("| `"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells
    return rows


def test_the_documented_protocol_table_is_the_registry() -> None:
    rows = _documented_table()
    assert list(rows) == [spec.name for spec in REGISTRY]
    for spec in REGISTRY:
        assert rows[spec.name][-1] == f"`{spec.credential}`", spec.name


def test_route_settings_take_their_names_from_the_registry() -> None:
    for spec in REGISTRY:
        assert RouteConfig(upstream="http://u.test/v1", protocol=spec.name).protocol == spec.name
    for style in CredentialStyle:
        signs = {"aws": {"region": "us-east-1"}} if style is CredentialStyle.SIGV4 else {}
        config = RouteConfig(upstream="http://u.test/v1", credential_style=style.value, **signs)
        assert config.credential_style == style
    with pytest.raises(ValidationError, match="aws"):
        RouteConfig(upstream="http://u.test/v1", credential_style="sigv4")
    with pytest.raises(ValidationError, match="protocol"):
        RouteConfig(upstream="http://u.test/v1", protocol="grpc")
    reference = (DOCS / "configuration.md").read_text()
    readme_row = re.search(r"\| `routes\[\]\.protocol` \| `auto` \| (.*) \|", reference)
    assert readme_row is not None
    assert re.findall(r"`([a-z]+)`", readme_row.group(1))[: len(REGISTRY)] == [
        spec.name for spec in REGISTRY
    ]


@pytest.mark.parametrize(
    ("path", "name", "stream_by_url"),
    [
        ("/chat/completions", "chat", False),
        ("/completions", "completions", False),
        ("/responses", "responses", False),
        ("/messages", "messages", False),
        ("/models/gemini-2.5-flash:streamGenerateContent", "gemini", True),
        ("/models/gemini-2.5-flash:generateContent", "gemini", False),
        ("/api/chat", "ollama", True),
        ("/api/generate", "ollama", True),
        ("/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse-stream", "bedrock", True),
        ("/model/us.amazon.nova-lite-v1:0/invoke-with-response-stream", "bedrock", True),
        ("/model/m/converse", "bedrock", False),
        ("/model/m/invoke", "bedrock", False),
        ("/api/tags", "sse", False),
        ("/models", "sse", False),
        ("/embeddings/", "sse", False),
    ],
)
def test_paths_find_their_protocol(path: str, name: str, stream_by_url: bool) -> None:
    spec = detect(path)
    assert spec.name == name
    assert spec.wants_stream(path, None) is stream_by_url
    by_url = name in ("gemini", "bedrock")
    assert spec.wants_stream(path, {"stream": True}) is (not by_url or stream_by_url)


def test_the_gemini_recipe_works_while_make_run_serves() -> None:
    """docs/protocols.md's Gemini recipe: its gateway listens on a port of its own (not
    the default one `make run` holds), the SDK example's base_url names that port, and
    the route's upstream is the simulator the recipe starts."""
    text = (DOCS / "protocols.md").read_text()
    section = text.split("\n## Gemini\n", 1)[1].split("\n## ", 1)[0]
    (python,) = re.findall(r"```python\n(.*?)```", section, re.S)
    (shell,) = re.findall(r"```sh\n(.*?)```", section, re.S)
    simulate = re.search(r"gateway simulate --port (\d+)", shell)
    serve = re.search(r"gateway serve --port (\d+)", shell)
    assert simulate, shell
    assert serve, shell
    make_run_port = Settings.model_fields["port"].default
    assert int(serve[1]) != make_run_port
    assert int(serve[1]) != int(simulate[1])
    assert f'base_url="http://127.0.0.1:{serve[1]}"' in python
    given = re.search(r"GATEWAY_ROUTES='([^']*)'", shell)
    assert given, shell
    routes = json.loads(given[1])
    assert routes[0]["upstream"] == f"http://127.0.0.1:{simulate[1]}/v1beta"
    assert routes[0]["protocol"] == "gemini"


def test_every_protocol_cools_down_on_the_common_overloaded_statuses() -> None:
    """429 and 503 with a Retry-After cool any upstream down; a protocol adds its own
    (Anthropic's 529), and a path no protocol claims takes every provider's."""
    for spec in REGISTRY:
        assert {429, 503} <= spec.cool_down_statuses, spec.name
    every = frozenset().union(*(spec.cool_down_statuses for spec in REGISTRY))
    assert ANY_PATH.cool_down_statuses == every


def test_each_request_id_header_is_read() -> None:
    from gateway.protocols import UPSTREAM_REQUEST_ID_HEADERS

    declared = [h for spec in REGISTRY for h in spec.request_id_headers]
    assert set(UPSTREAM_REQUEST_ID_HEADERS) == set(declared)
    assert all(h == h.lower() for h in declared)
