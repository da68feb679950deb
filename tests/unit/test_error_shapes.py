"""The gateway's own error bodies: one shape per protocol family, the OpenAI one pinned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.guard import Protocol, Reason
from gateway.proxy.buffered import failure_body
from gateway.proxy.errors import error_body


def test_openai_family_and_routeless_errors_keep_the_openai_bytes() -> None:
    pinned = (
        b'{"error":{"message":"Missing or invalid API key. (request_id=rid)",'
        b'"type":"authentication_error","code":"unauthorized","param":null}}'
    )
    for protocol in (None, Protocol.CHAT, Protocol.COMPLETIONS, Protocol.RESPONSES, "sse"):
        body = error_body(
            protocol,
            401,
            "Missing or invalid API key.",
            "authentication_error",
            "unauthorized",
            "rid",
        )
        assert body == pinned


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
        (418, "invalid_request_error"),
        (507, "api_error"),
    ],
)
def test_anthropic_shape_names_the_type_from_the_status(status: int, kind: str) -> None:
    body = json.loads(error_body("messages", status, "No.", "x", "some_code", "rid"))
    assert body == {
        "type": "error",
        "error": {
            "type": kind,
            "message": "No. (request_id=rid)",
            "details": {"error_code": "some_code"},
        },
        "request_id": "rid",
    }


@pytest.mark.parametrize(
    ("status", "name"),
    [
        (400, "INVALID_ARGUMENT"),
        (401, "UNAUTHENTICATED"),
        (403, "PERMISSION_DENIED"),
        (404, "NOT_FOUND"),
        (413, "INVALID_ARGUMENT"),
        (429, "RESOURCE_EXHAUSTED"),
        (500, "INTERNAL"),
        (502, "UNAVAILABLE"),
        (503, "UNAVAILABLE"),
        (504, "DEADLINE_EXCEEDED"),
    ],
)
def test_gemini_shape_names_the_google_status(status: int, name: str) -> None:
    body = json.loads(error_body(Protocol.GEMINI, status, "No.", "x", "body_too_large", "rid"))
    assert body == {
        "error": {
            "code": status,
            "message": "No. (request_id=rid)",
            "status": name,
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "BODY_TOO_LARGE",
                    "domain": "gateway",
                    "metadata": {"reason": "body_too_large"},
                },
                {"@type": "type.googleapis.com/google.rpc.RequestInfo", "requestId": "rid"},
            ],
        }
    }


def test_ollama_shape_is_one_string() -> None:
    body = error_body("ollama", 503, "Too busy.", "service_unavailable", "overloaded", "rid")
    assert body == b'{"error":"Too busy. (overloaded) (request_id=rid)"}'


def test_the_buffered_502_is_the_same_shape() -> None:
    for protocol in Protocol:
        body, headers = failure_body(protocol, Reason.INVALID_JSON, "rid")
        message = "The upstream's answer is not valid JSON."
        assert body == error_body(protocol, 502, message, "upstream_error", "invalid_json", "rid")
        assert (b"content-length", str(len(body)).encode()) in headers


@pytest.mark.parametrize(
    ("protocol", "status", "message", "type_", "code"),
    [
        (None, 502, "The upstream could not be reached.", "upstream_error", "upstream_unavailable"),
        ("messages", 401, "Missing or invalid API key.", "authentication_error", "unauthorized"),
        ("gemini", 503, "Too many concurrent streams; retry shortly.", "x", "overloaded"),
        (
            "ollama",
            413,
            "Request body exceeds the gateway limit of 33554432 bytes.",
            "invalid_request_error",
            "body_too_large",
        ),
    ],
)
def test_the_documented_examples_are_what_the_gateway_sends(
    protocol: str | None, status: int, message: str, type_: str, code: str
) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "wire-contract.md").read_text()
    assert error_body(protocol, status, message, type_, code, "7f3a2c9e").decode() in doc
