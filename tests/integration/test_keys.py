"""Keys issued at run time on one gateway (the memory store): the admin API's shapes and
refusals, an issued key through the openai and anthropic SDKs, its routes and models,
rotation, revocation, expiry, the audit line, the metric and the status page."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests import web
from tests.conftest import ServerThread
from tests.integration.helpers import gateway_for, metric_value
from tests.sdk import anthropic, openai

ADMIN, OTHER_ADMIN, PLAIN = "sk-admin-0123", "sk-admin-4567", "sk-plain-89ab"


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


CLIENTS: list[dict[str, Any]] = [
    {"name": "ops", "key_sha256": [_sha(ADMIN)], "keys_admin": True},
    {"name": "ops-eu", "key_sha256": [_sha(OTHER_ADMIN)], "keys_admin": True},
    {"name": "team-a", "key_sha256": [_sha(PLAIN)], "routes": ["v1"]},
]


def _routes(simulator: ServerThread) -> list[dict[str, Any]]:
    return [
        {"name": "v1", "prefix": "/v1", "upstream": simulator.url + "/v1"},
        {"name": "other", "prefix": "/other", "upstream": simulator.url + "/v1"},
    ]


@pytest.fixture(scope="module")
def gw(simulator: ServerThread) -> Iterator[ServerThread]:
    with gateway_for(
        "",
        routes=_routes(simulator),
        clients=CLIENTS,
        keys={"store": "memory", "max_metadata_bytes": 1024},
        status_page=True,
    ) as server:
        yield server


def _api(gw: ServerThread, method: str, path: str = "", key: str = ADMIN, **kwargs: Any) -> Any:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    url = f"{gw.url}/v1/gateway/keys{path}"
    return web.request(method, url, headers=headers, timeout=30, **kwargs)


def _create(gw: ServerThread, body: dict[str, Any], key: str = ADMIN) -> dict[str, Any]:
    answer = _api(gw, "POST", json=body, key=key)
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created


def _chat(gw: ServerThread, key: str, prefix: str = "/v1", model: str = "sim-model") -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    return web.post(
        gw.url + prefix + "/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )


def test_a_created_key_is_shown_once_and_works_through_both_sdks(gw: ServerThread) -> None:
    answer = _api(gw, "POST", json={"client": "sdk-user", "metadata": {"owner": "ana"}})
    assert answer.status_code == 201
    created = answer.json()
    secret = created["key"]
    assert secret.startswith("gwk_")
    assert answer.headers["location"] == f"/v1/gateway/keys/{created['id']}"
    assert created["prefix"] == secret[:8]
    assert created["digest_start"] == _sha(secret)[:8]
    assert created["state"] == "active"
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=secret, max_retries=0)
    reply = client.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert reply.choices[0].message.content
    claude = anthropic.Anthropic(base_url=gw.url, api_key=secret, max_retries=0)
    with claude.messages.stream(
        model="sim", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        assert "".join(stream.text_stream)
    shown = _api(gw, "GET", f"/{created['id']}").json()
    assert "key" not in shown
    assert secret not in _api(gw, "GET").text
    assert shown["metadata"] == {"owner": "ana"}


def test_the_api_refuses_non_admins_forged_keys_and_bad_bodies(gw: ServerThread) -> None:
    before = _api(gw, "GET").json()["data"]
    refused = _api(gw, "POST", json={"client": "sneaky"}, key=PLAIN)
    assert refused.status_code == 403
    assert refused.json()["error"]["type"] == "permission_error"
    assert _api(gw, "POST", json={"client": "sneaky"}, key="sk-forged").status_code == 401
    assert _api(gw, "POST", json={"client": "sneaky"}, key="").status_code == 401
    bad = _api(gw, "POST", json={"client": "Not A Name"})
    assert bad.status_code == 422
    assert bad.json()["error"]["param"] == "client"
    limit = _api(gw, "POST", json={"client": "x1", "limits": {"requests_per_minute": -1}})
    assert limit.status_code == 422
    assert limit.json()["error"]["param"] == "limits.requests_per_minute"
    assert _api(gw, "POST", content=b"{not json").status_code == 422
    assert _api(gw, "POST", json={"client": "x2", "colour": "red"}).status_code == 422
    huge = _api(gw, "POST", json={"client": "x3", "metadata": {"owner": "o" * 2000}})
    assert huge.status_code == 413
    assert _api(gw, "POST", content=b" " * 100_000).status_code == 413
    assert _api(gw, "GET").json()["data"] == before


def test_a_name_clash_is_409_and_a_configured_client_needs_existing_client(
    gw: ServerThread,
) -> None:
    _create(gw, {"client": "clash"})
    again = _api(gw, "POST", json={"client": "clash"})
    assert again.status_code == 409
    configured = _api(gw, "POST", json={"client": "team-a"})
    assert configured.status_code == 409
    assert "existing_client" in configured.json()["error"]["message"]
    created = _create(gw, {"client": "team-a", "existing_client": True})
    assert _chat(gw, created["key"]).status_code == 200
    # team-a may use the v1 route only: so may its issued key
    assert _chat(gw, created["key"], "/other").status_code == 403


def test_another_admins_key_is_404_as_an_unknown_one(gw: ServerThread) -> None:
    mine = _create(gw, {"client": "tenant-owned"})
    for method, path in (("GET", ""), ("PATCH", ""), ("POST", "/rotate"), ("POST", "/revoke")):
        foreign = _api(gw, method, f"/{mine['id']}{path}", key=OTHER_ADMIN, json={})
        unknown = _api(gw, method, f"/key_000000000000000000000000{path}", json={})
        assert foreign.status_code == unknown.status_code == 404
        assert foreign.json()["error"]["code"] == unknown.json()["error"]["code"]
    assert all(k["id"] != mine["id"] for k in _api(gw, "GET", key=OTHER_ADMIN).json()["data"])
    assert _chat(gw, mine["key"]).status_code == 200


def test_routes_and_models_scope_a_key(gw: ServerThread) -> None:
    created = _create(gw, {"client": "scoped", "routes": ["other"], "models": ["sim-model"]})
    assert _chat(gw, created["key"], "/v1").status_code == 403
    assert _chat(gw, created["key"], "/other").status_code == 200
    refused = _chat(gw, created["key"], "/other", model="gpt-4o")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "model_not_allowed"
    unknown_route = _api(gw, "POST", json={"client": "scoped2", "routes": ["nope"]})
    assert unknown_route.status_code == 422
    assert unknown_route.json()["error"]["param"] == "routes"


def test_rotate_keeps_the_old_secret_for_the_overlap_then_refuses_it(
    gw: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    created = _create(gw, {"client": "rotated"})
    old = created["key"]
    with caplog.at_level(logging.INFO, logger="gateway.keys"):
        rotated = _api(gw, "POST", f"/{created['id']}/rotate", json={"overlap_seconds": 1.0})
    assert rotated.status_code == 200
    new = rotated.json()["key"]
    assert new != old
    assert _chat(gw, new).status_code == 200
    assert _chat(gw, old).status_code == 200  # within its overlap
    deadline = time.monotonic() + 10
    while _chat(gw, old).status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _chat(gw, old).status_code == 401
    assert _chat(gw, new).status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.keys"]
    assert lines == [f"key rotate: id={created['id']} client=rotated by=ops"]
    assert old not in caplog.text
    assert new not in caplog.text


def test_revoke_and_expiry_refuse_with_401_in_the_routes_shape(gw: ServerThread) -> None:
    created = _create(gw, {"client": "revoked"})
    assert _chat(gw, created["key"]).status_code == 200
    revoked = _api(gw, "POST", f"/{created['id']}/revoke")
    assert revoked.json()["state"] == "revoked"
    refused = _chat(gw, created["key"])
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"
    expiring = _create(gw, {"client": "expiring", "expires_in_seconds": 0.5})
    deadline = time.monotonic() + 10
    while _chat(gw, expiring["key"]).status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _chat(gw, expiring["key"]).status_code == 401
    assert _api(gw, "GET", f"/{expiring['id']}").json()["state"] == "expired"


def test_changes_are_counted_and_the_status_page_lists_keys_never_a_secret(
    gw: ServerThread,
) -> None:
    before = (
        metric_value(
            web.get(gw.url + "/metrics").text, "gateway_key_changes_total", action="create"
        )
        or 0
    )
    created = _create(gw, {"client": "listed"})
    assert _chat(gw, created["key"]).status_code == 200
    text = web.get(gw.url + "/metrics").text
    assert metric_value(text, "gateway_key_changes_total", action="create") == before + 1
    page = web.get(gw.url + "/status").text
    assert created["id"] in page
    assert "listed" in page
    assert created["key"] not in page
    assert _sha(created["key"]) not in page
    shown = _api(gw, "GET", f"/{created['id']}").json()
    assert shown["last_used"] is not None


def test_a_digest_from_the_file_moves_to_the_store(gw: ServerThread) -> None:
    secret = "sk-moved-from-the-file"
    created = _create(gw, {"client": "moved", "key_sha256": _sha(secret)})
    assert created["key"] is None
    assert _chat(gw, secret).status_code == 200
    taken = _api(gw, "POST", json={"client": "moved2", "key_sha256": _sha(PLAIN)})
    assert taken.status_code == 422


def test_keys_issued_for_a_team_share_its_limits(simulator: ServerThread) -> None:
    teams = [{"name": "red", "limits": {"requests_per_minute": 3}}]
    with gateway_for(
        simulator.url + "/v1", clients=CLIENTS[:1], teams=teams, keys={"store": "memory"}
    ) as server:
        first = _create(server, {"client": "red-1", "team": "red"})
        second = _create(server, {"client": "red-2", "team": "red"})
        assert first["team"] == "red"
        statuses = [_chat(server, k["key"]).status_code for k in (first, second, first, second)]
        assert statuses == [200, 200, 200, 429]
        unknown = _api(server, "POST", json={"client": "blue-1", "team": "blue"})
        assert unknown.status_code == 422
        assert unknown.json()["error"]["param"] == "team"


def test_a_revoked_keys_stream_in_flight_finishes_and_new_requests_are_refused(
    gw: ServerThread,
) -> None:
    created = _create(gw, {"client": "streaming"})
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    headers = {
        "authorization": f"Bearer {created['key']}",
        "x-sim-tokens": "20",
        "x-sim-tps": "20",
    }
    with web.stream(
        "POST", gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        chunks = response.iter_bytes()
        received = next(chunks)
        assert _api(gw, "POST", f"/{created['id']}/revoke").status_code == 200
        assert _chat(gw, created["key"]).status_code == 401
        received += b"".join(chunks)
    assert b": gateway outcome=complete reason=stop" in received
