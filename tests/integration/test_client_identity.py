"""Who the client is: forwarding headers, client keys per route, and the explicit
choice to listen beyond loopback without client keys."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import web
from tests.cli import run_cli
from tests.conftest import ServerThread, free_port, gateway_process
from tests.integration.helpers import access_log_lines, gateway_for, metric_value
from tests.integration.raw_upstream import RawUpstream, raw_upstream

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _access_log(stdout: str | bytes) -> dict[str, dict[str, Any]]:
    """The access-log lines of a stopped gateway, by request id."""
    return {entry["request_id"]: entry for entry in access_log_lines(stdout)}


# ------------------------------------------------------------ forwarding headers

SPOOFING = {
    "x-forwarded-for": "198.51.100.9, 203.0.113.7",
    "x-forwarded-proto": "https",
    "forwarded": "for=192.0.2.1;proto=https",
    "x-real-ip": "192.0.2.1",
}


def _send_spoofed(gw_url: str, upstream: RawUpstream, rid: str) -> dict[bytes, list[bytes]]:
    upstream.requests.clear()
    response = web.post(
        gw_url + "/v1/chat/completions",
        json=CHAT,
        headers={**SPOOFING, "x-request-id": rid},
        timeout=20,
    )
    assert response.status_code == 200
    (seen,) = upstream.requests
    names = (b"x-forwarded-for", b"x-forwarded-proto", b"forwarded", b"x-real-ip")
    return {name: seen.header_values(name) for name in names}


def test_no_client_is_trusted_by_default() -> None:
    """The real command line (uvicorn's own proxy-header rewriting would let a
    client on 127.0.0.1 replace its address): the peer is appended, the
    client's claims about itself go no further."""
    with raw_upstream() as upstream:
        with gateway_process(["--upstream", upstream.url + "/v1"]) as gw:
            seen = _send_spoofed(gw.url, upstream, "xff-untrusted")
            out, _ = gw.stop()
        assert gw.proc.returncode == 0
    assert seen[b"x-forwarded-for"] == [b"198.51.100.9, 203.0.113.7, 127.0.0.1"]
    assert seen[b"x-forwarded-proto"] == [b"http"]
    assert seen[b"forwarded"] == seen[b"x-real-ip"] == []
    assert _access_log(out)["xff-untrusted"]["client"] == "127.0.0.1"


@pytest.mark.parametrize(
    ("trusted", "client"),
    [
        (["127.0.0.0/8"], "203.0.113.7"),
        (["127.0.0.1", "203.0.113.0/24"], "198.51.100.9"),
        (["::1/128", "10.0.0.0/8"], "127.0.0.1"),  # the peer is not one of them
    ],
)
def test_a_trusted_proxy_is_believed(
    trusted: list[str], client: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In-process, uvicorn configured as ``serve`` does (the test above runs the real
    command line; the one below reads ``GATEWAY_TRUSTED_PROXIES`` through it)."""
    with (
        raw_upstream() as upstream,
        gateway_for(upstream.url + "/v1", trusted_proxies=trusted, access_log=True) as gw,
    ):
        seen = _send_spoofed(gw.url, upstream, "xff-trusted")
    assert _access_log(capsys.readouterr().out)["xff-trusted"]["client"] == client
    # Appended in every case: the last entry is always the one the gateway saw.
    assert seen[b"x-forwarded-for"] == [b"198.51.100.9, 203.0.113.7, 127.0.0.1"]
    peer_trusted = client != "127.0.0.1"
    assert seen[b"x-forwarded-proto"] == [b"https" if peer_trusted else b"http"]
    assert seen[b"x-real-ip"] == ([b"192.0.2.1"] if peer_trusted else [])


def test_trusted_proxies_must_be_addresses_or_cidrs(tmp_path: Path) -> None:
    for bad in ('["10.0.0.0/33"]', '["proxy.internal"]', '["10.0.0.1/8"]'):
        result = _cli("check-config", "--simulator", env={"GATEWAY_TRUSTED_PROXIES": bad})
        assert result.returncode == 2, bad
        assert "trusted_proxies" in result.stderr
    good = _cli(
        "check-config", "--simulator", env={"GATEWAY_TRUSTED_PROXIES": '["10.0.0.0/8", "::1"]'}
    )
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["trusted_proxies"] == ["10.0.0.0/8", "::1/128"]


# ------------------------------------------------------------ client keys per route

KEYS = {name: f"sk-client-{name}" for name in ("alpha", "beta", "global", "stranger")}


@pytest.fixture(scope="module")
def scoped() -> Iterator[tuple[ServerThread, RawUpstream]]:
    """Three routes: alpha and beta list their own keys, open uses the global list."""
    with raw_upstream() as upstream:
        routes = [
            {
                "name": "alpha",
                "prefix": "/alpha/v1",
                "upstream": upstream.url + "/v1",
                "client_key_sha256": [_sha(KEYS["alpha"])],
            },
            {
                "name": "beta",
                "prefix": "/beta/v1",
                "upstream": upstream.url + "/v1",
                "client_key_sha256": [_sha(KEYS["beta"]), _sha(KEYS["global"])],
            },
            {"name": "shared", "prefix": "/v1", "upstream": upstream.url + "/v1"},
        ]
        with gateway_for("", routes=routes, client_key_sha256=[_sha(KEYS["global"])]) as gw:
            yield gw, upstream


@pytest.mark.parametrize(
    ("prefix", "key", "status"),
    [
        ("/alpha/v1", "alpha", 200),
        ("/alpha/v1", "beta", 403),  # a key of another route
        ("/alpha/v1", "global", 403),  # the route's own list replaces the global one
        ("/beta/v1", "beta", 200),
        ("/beta/v1", "global", 200),
        ("/beta/v1", "alpha", 403),
        ("/v1", "global", 200),
        ("/v1", "alpha", 403),  # scoped to alpha only
        ("/alpha/v1", "stranger", 401),
        ("/v1", "stranger", 401),
        ("/alpha/v1", None, 401),
    ],
)
def test_a_key_works_only_on_the_routes_that_accept_it(
    scoped: tuple[ServerThread, RawUpstream], prefix: str, key: str | None, status: int
) -> None:
    gw, upstream = scoped
    upstream.requests.clear()
    headers = {"authorization": f"Bearer {KEYS[key]}"} if key else {}
    before = web.get(gw.url + "/metrics").text
    response = web.post(
        gw.url + prefix + "/chat/completions", json=CHAT, headers=headers, timeout=20
    )
    after = web.get(gw.url + "/metrics").text
    assert response.status_code == status
    if status == 200:
        assert len(upstream.requests) == 1
        return
    assert upstream.requests == []  # nothing reached the upstream
    label = {401: "unauthorized", 403: "forbidden"}[status]
    assert response.json()["error"]["code"] == label
    assert KEYS.get(key or "", "sk-none") not in response.text

    def rejected(text: str) -> float:
        return metric_value(text, "gateway_rejected_requests_total", reason=label)

    assert rejected(after) - rejected(before) == 1


def test_a_scoped_key_is_accepted_in_every_header_a_client_may_use(
    scoped: tuple[ServerThread, RawUpstream],
) -> None:
    gw, _ = scoped
    for header in ("x-api-key", "api-key"):
        good = web.post(
            gw.url + "/alpha/v1/chat/completions", json=CHAT, headers={header: KEYS["alpha"]}
        )
        assert good.status_code == 200, header
        wrong = web.post(
            gw.url + "/beta/v1/chat/completions", json=CHAT, headers={header: KEYS["alpha"]}
        )
        assert wrong.status_code == 403, header


# ------------------------------------------------------------ listening beyond loopback


def _cli(
    command: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``gateway COMMAND ARGS`` in-process (tests/cli.py), without the runner's GATEWAY_ ones."""
    return run_cli(command, *args, env=env)


ROUTE_WITH_CREDENTIAL = (
    '[[routes]]\nname = "paid"\nprefix = "/v1"\nupstream = "https://api.example.test/v1"\n'
    'credential_env = "GW_TEST_PAID_KEY"\n'
)


def test_beyond_loopback_a_credential_without_client_keys_is_refused_at_load(
    tmp_path: Path,
) -> None:
    config = tmp_path / "g.toml"
    config.write_text(ROUTE_WITH_CREDENTIAL)
    env = {"GW_TEST_PAID_KEY": "sk-upstream"}
    # `serve` stops at load: it never binds (the port would be on every interface).
    port = str(free_port())
    served = _cli("serve", "--config", str(config), "--host", "0.0.0.0", "--port", port, env=env)
    assert served.returncode == 2
    for hint in ("paid", "client_key_sha256", "allow_unauthenticated", "0.0.0.0"):
        assert hint in served.stderr, hint
    assert "Traceback" not in served.stderr
    assert "sk-upstream" not in served.stderr
    for host in ("::", "10.1.2.3", "gateway.internal"):
        assert (
            _cli("check-config", "--config", str(config), "--host", host, env=env).returncode == 2
        )


@pytest.mark.parametrize(
    ("extra", "env", "host"),
    [
        ("", {}, "127.0.0.1"),  # loopback: only local clients
        ("", {}, "::1"),
        ("", {}, "localhost"),
        ("", {"GATEWAY_ALLOW_UNAUTHENTICATED": "true"}, "0.0.0.0"),
        (f'client_key_sha256 = ["{_sha("k")}"]\n', {}, "0.0.0.0"),
        ("", {"GATEWAY_CLIENT_KEY_SHA256": f'["{_sha("k")}"]'}, "0.0.0.0"),
    ],
)
def test_what_makes_listening_beyond_loopback_acceptable(
    tmp_path: Path, extra: str, env: dict[str, str], host: str
) -> None:
    config = tmp_path / "g.toml"
    config.write_text(extra + ROUTE_WITH_CREDENTIAL)
    result = _cli(
        "check-config",
        "--config",
        str(config),
        "--host",
        host,
        env={"GW_TEST_PAID_KEY": "sk-upstream", **env},
    )
    assert result.returncode == 0, result.stderr


def test_a_routes_own_empty_key_list_is_no_key(tmp_path: Path) -> None:
    config = tmp_path / "g.toml"
    config.write_text(
        f'client_key_sha256 = ["{_sha("k")}"]\n'
        + ROUTE_WITH_CREDENTIAL
        + "client_key_sha256 = []\n"
    )
    env = {"GW_TEST_PAID_KEY": "sk-upstream"}
    assert _cli("check-config", "--config", str(config), env=env).returncode == 0
    refused = _cli("check-config", "--config", str(config), "--host", "0.0.0.0", env=env)
    assert refused.returncode == 2
    assert "paid" in refused.stderr
    shown = _cli("check-config", "--config", str(config), env=env)
    assert _sha("k") not in shown.stdout


def test_check_config_masks_a_routes_own_keys(tmp_path: Path) -> None:
    config = tmp_path / "g.toml"
    config.write_text(ROUTE_WITH_CREDENTIAL + f'client_key_sha256 = ["{_sha("r")}"]\n')
    shown = _cli("check-config", "--config", str(config), env={"GW_TEST_PAID_KEY": "sk-up"})
    assert shown.returncode == 0, shown.stderr
    assert _sha("r") not in shown.stdout
    (route,) = json.loads(shown.stdout)["routes"]
    assert route["client_key_sha256"] == [f"<sha256 {_sha('r')[:8]}…>"]
