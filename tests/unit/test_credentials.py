"""Where a credential travels is its style's fact (gateway.protocols.credentials), and only
there: the key a client presents is read, an upstream's credential is put, and a client's
is dropped by the same table, and no other module of the gateway names such a header."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gateway.protocols import REGISTRY, CredentialStyle
from gateway.protocols.credentials import CREDENTIAL_HEADERS, presented_key

ROOT = Path(__file__).resolve().parents[2]
SIGNED = b"AWS4-HMAC-SHA256 Credential=AK/20260101/us-east-1/bedrock/aws4_request"


@pytest.mark.parametrize("style", [s for s in CredentialStyle if s is not CredentialStyle.SIGV4])
def test_a_key_carried_in_a_style_is_the_key_presented(style: CredentialStyle) -> None:
    header = style.carried(b"sk-1")
    assert header[0] in CREDENTIAL_HEADERS
    assert presented_key([(b"content-type", b"application/json"), header]) == b"sk-1"


def test_every_protocols_style_has_its_header() -> None:
    assert {spec.credential.header for spec in REGISTRY} <= CREDENTIAL_HEADERS
    assert {style.header for style in CredentialStyle} <= CREDENTIAL_HEADERS


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ([(b"authorization", b"bearer sk-2 ")], b"sk-2"),  # the scheme in any case
        ([(b"api-key", b"sk-3")], b"sk-3"),  # Azure OpenAI's header
        ([(b"x-api-key", b""), (b"x-goog-api-key", b"sk-4")], b"sk-4"),  # empty: the next
        ([(b"x-api-key", b"sk-5"), (b"authorization", b"Bearer other")], b"sk-5"),
        (
            [(b"authorization", b"AWS4-HMAC-SHA256 Credential=AK/x")],
            b"AWS4-HMAC-SHA256 Credential=AK/x",
        ),
        ([(b"authorization", b"Basic dXNlcg==")], None),
        ([(b"authorization", b"Bearer first"), (b"authorization", b"Bearer second")], b"first"),
        ([], None),
    ],
)
def test_the_key_a_client_presents(headers: list[tuple[bytes, bytes]], key: bytes | None) -> None:
    assert presented_key(headers) == key


def _named_headers(path: Path) -> list[int]:
    names = CREDENTIAL_HEADERS - {b"authorization"} | {CredentialStyle.SIGV4.scheme.strip()}
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, bytes)
        and node.value.strip().lower() in names
    ]


@pytest.mark.parametrize(
    "path",
    sorted(
        p for p in (ROOT / "gateway").rglob("*.py") if not {"protocols", "simulator"} & set(p.parts)
    ),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_no_module_but_the_protocols_names_a_credential_header(path: Path) -> None:
    assert not _named_headers(path), f"{path.name}: lines {_named_headers(path)}"


def test_the_scan_sees_a_credential_header() -> None:
    assert _named_headers(ROOT / "gateway/protocols/credentials.py")
