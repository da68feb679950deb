"""Operating the gateway: configuration, credentials, client keys, admission, drain."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gateway.settings import Settings, load_settings
from tests import web
from tests.cli import run_cli, run_cli_process
from tests.conftest import ServerThread, gateway_process
from tests.integration.control import WAIT_SECONDS, gated_upstream, settled_metrics, wait_until
from tests.integration.helpers import annotation, gateway_for, metric_value

CHAT = {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}], "stream": True}
ROOT = Path(__file__).resolve().parents[2]


def _check_config(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``gateway check-config ARGS`` in-process (tests/cli.py), runner's GATEWAY_ ones unset."""
    return run_cli("check-config", *args, env=env)


# ---------------------------------------------------------------- configuration


def test_precedence_flags_over_environment_over_file(tmp_path: Path) -> None:
    config = tmp_path / "g.toml"
    config.write_text(
        'upstream_url = "http://upstream.test/v1"\nport = 1111\nhost = "10.1.1.1"\n'
        "[timeouts]\nidle = 11.0\nconnect = 3.0\n"
    )
    only_file = json.loads(_check_config("--config", str(config)).stdout)
    assert (only_file["port"], only_file["host"]) == (1111, "10.1.1.1")
    assert only_file["timeouts"]["idle"] == 11.0
    env = {"GATEWAY_PORT": "2222", "GATEWAY_TIMEOUTS__IDLE": "22"}
    with_env = json.loads(_check_config("--config", str(config), env=env).stdout)
    assert with_env["port"] == 2222
    assert with_env["timeouts"]["idle"] == 22.0
    assert with_env["timeouts"]["connect"] == 3.0  # untouched keys still come from the file
    flags = json.loads(
        _check_config(
            "--config", str(config), "--port", "3333", "--idle-timeout", "33", env=env
        ).stdout
    )
    assert flags["port"] == 3333
    assert flags["timeouts"]["idle"] == 33.0
    assert flags["timeouts"]["connect"] == 3.0
    assert flags["host"] == "10.1.1.1"
    via_env_file = json.loads(_check_config(env={"GATEWAY_CONFIG": str(config)}).stdout)
    assert via_env_file["port"] == 1111


def test_check_config_names_where_each_value_came_from(tmp_path: Path) -> None:
    """Each value given anywhere, with the one source that won (flag over environment
    over file, a section's keys one by one); every other key has its default."""
    config = tmp_path / "g.toml"
    config.write_text(
        'upstream_url = "http://upstream.test/v1"\nport = 1111\n'
        "[timeouts]\nidle = 11.0\nconnect = 3.0\n"
    )
    env = {"GATEWAY_TIMEOUTS__IDLE": "22", "GATEWAY_LIMITS": '{"max_concurrent_streams": 7}'}
    result = _check_config("--config", str(config), "--port", "3333", env=env)
    assert result.returncode == 0, result.stderr
    effective = json.loads(result.stdout)
    assert (effective["port"], effective["timeouts"]["idle"]) == (3333, 22.0)
    lines = result.stderr.splitlines()
    start = lines.index("gateway: where each value came from (any other key: its default):")
    sources = dict(line.strip().split(": ", 1) for line in lines[start + 1 :])
    assert sources == {
        "config": "command-line flag --config",
        "port": "command-line flag --port",
        "upstream_url": f"config file {config}",
        "timeouts.connect": f"config file {config}",
        "timeouts.idle": "environment variable GATEWAY_TIMEOUTS__IDLE",
        "limits.max_concurrent_streams": "environment variable GATEWAY_LIMITS",
    }
    assert effective["drain_timeout"] == Settings.model_fields["drain_timeout"].default


@pytest.mark.parametrize("source", ["file", "environment", "flag"])
def test_an_invalid_value_names_its_one_source(tmp_path: Path, source: str) -> None:
    """A value written in the file is the file's, not "the file's, or its default"."""
    config = tmp_path / "g.toml"
    config.write_text('upstream_url = "http://upstream.test/v1"\n[timeouts]\nconnect = 3.0\n')
    args = ["--config", str(config)]
    env: dict[str, str] = {}
    if source == "file":
        config.write_text(config.read_text() + "idle = -1\n")
        origin = f"(config file {config})"
    elif source == "environment":
        env["GATEWAY_TIMEOUTS__IDLE"] = "-1"
        origin = "(environment variable GATEWAY_TIMEOUTS__IDLE)"
    else:
        args += ["--idle-timeout", "-1"]
        origin = "(command-line flag --idle-timeout)"
    result = _check_config(*args, env=env)
    assert result.returncode == 2
    assert f"  timeouts.idle {origin}: Input should be greater than 0" in result.stderr
    assert "or its default" not in result.stderr


@pytest.mark.parametrize(
    ("content", "env", "expected"),
    [
        ('port = "eighty"\n', {}, "port (config file"),
        ("bogus_key = 1\n", {}, "bogus_key (config file"),
        (
            "[timeouts]\nidel = 3\n",
            {},
            "bad.toml): is not a setting (did you mean timeouts.idle?)",
        ),
        (
            '[[routes]]\nname = "a"\nprefix = "/v1"\nupstream = "http://x"\nmax_atempts = 2\n',
            {},
            "bad.toml): is not a setting (did you mean routes[0].max_attempts?)",
        ),
        (
            '[[routes]]\nname = "a"\nprefix = "/v1"\n'
            '[[routes.upstreams]]\nname = "u"\nurl = "http://x"\nwieght = 2\n',
            {},
            "bad.toml): is not a setting (did you mean routes[0].upstreams[0].weight?)",
        ),
        ("zzzz_qqqq = 1\n", {}, "bad.toml): is not a setting (no setting has a similar"),
        ("[timeouts]\nidle = -1\n", {}, "timeouts.idle"),
        ("", {"GATEWAY_TIMEOUTS__IDLE": "soon"}, "environment variable GATEWAY_TIMEOUTS__IDLE"),
        (
            '[[routes]]\nname = "a"\nprefix = "/v1"\nupstream = "ftp://x"\n',
            {},
            "routes[0].upstream",
        ),
        (
            '[[routes]]\nname = "a"\nprefix = "v1/"\nupstream = "http://x"\n',
            {},
            "routes[0].prefix",
        ),
        (
            '[[routes]]\nname = "a"\nprefix = "/v1"\nupstream = "http://x"\n'
            '[[routes]]\nname = "a"\nprefix = "/v2"\nupstream = "http://y"\n',
            {},
            "route names must be unique",
        ),
        (
            '[[routes]]\nname = "a"\nprefix = "/v1"\nupstream = "http://x"\n'
            'credential_env = "GW_TEST_UNSET_KEY"\n',
            {},
            "routes[0].credential_env: environment variable GW_TEST_UNSET_KEY is not set",
        ),
        ('client_key_sha256 = ["abc"]\n', {}, "client_key_sha256"),
        ("[limits]\nmax_request_bytes = 0\n", {}, "limits.max_request_bytes"),
        ("this is not toml", {}, "bad.toml is not valid TOML"),
        ('host = ""\n', {}, "host (config file"),
        (
            'upstream_url = "http://a.test/v1"\n'
            '[[routes]]\nname = "a"\nprefix = "/v1"\nupstream = "http://b.test/v1"\n',
            {},
            "upstream_url (--upstream, GATEWAY_UPSTREAM_URL) and routes are both set",
        ),
        ('upstream_url = "api.openai.com/v1"\n', {}, "upstream_url (config file"),
    ],
)
def test_invalid_configs_are_refused_with_a_precise_message(
    tmp_path: Path, content: str, env: dict[str, str], expected: str
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(content)
    result = _check_config("--config", str(config), env=env)
    assert result.returncode == 2
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_missing_config_file_is_refused() -> None:
    result = _check_config("--config", "/nonexistent/gateway.toml")
    assert result.returncode == 2
    assert "config file not found: /nonexistent/gateway.toml" in result.stderr
    result = _check_config(env={"GATEWAY_CONFIG": "/nonexistent/x.toml"})
    assert result.returncode == 2
    assert "config file not found" in result.stderr


def test_a_bad_config_never_starts_a_server(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[timeouts]\nidle = 0\n")
    # A real process: that `serve` exits at load is the interpreter's exit status.
    result = run_cli_process("serve", "--config", str(config), "--port", "0")
    assert result.returncode == 2
    assert "timeouts.idle" in result.stderr


def test_check_config_redacts_secrets(tmp_path: Path) -> None:
    key = "sk-route-secret-value-42"
    client_key_hash = hashlib.sha256(b"client-key").hexdigest()
    config = tmp_path / "g.toml"
    config.write_text(
        f'client_key_sha256 = ["{client_key_hash}"]\n'
        '[[routes]]\nname = "openai"\nprefix = "/v1"\nupstream = "https://api.example.test/v1"\n'
        'credential_env = "GW_TEST_ROUTE_KEY"\n'
    )
    result = _check_config("--config", str(config), env={"GW_TEST_ROUTE_KEY": key})
    assert result.returncode == 0, result.stderr
    assert key not in result.stdout
    # keys in an upstream URL (user-info, query) are masked too
    leaky = _check_config("--upstream", "https://user:sk-in-url@api.example.test/v1?api-key=sk-q")
    assert leaky.returncode == 0, leaky.stderr
    assert "sk-in-url" not in leaky.stdout
    assert "sk-q" not in leaky.stdout
    assert "api.example.test" in leaky.stdout
    assert client_key_hash not in result.stdout
    shown = json.loads(result.stdout)
    assert shown["effective_routes"][0]["credential"] == "<redacted>"


CONFIGURATION_PAGE = ROOT / "docs" / "configuration.md"


def test_the_configuration_reference_lists_every_setting() -> None:
    readme = CONFIGURATION_PAGE.read_text()
    from gateway.settings import ClientConfig, RouteConfig, UpstreamConfig

    for name in Settings.model_fields:
        if name in ("credentials", "timeouts", "limits", "tracing", "keys"):  # listed by key
            continue
        assert f"`{name}`" in readme, f"the configuration reference lacks {name}"
    for section in ("timeouts", "limits", "tracing", "keys"):
        model = Settings.model_fields[section].default
        for key in model.model_dump():
            assert f"`{section}.{key}`" in readme, f"no row for {section}.{key}"
    for key in RouteConfig.model_fields:
        assert f"`routes[].{key}`" in readme, f"no row for routes[].{key}"
    for key in UpstreamConfig.model_fields:
        assert f"`routes[].upstreams[].{key}`" in readme, f"no row for routes[].upstreams[].{key}"
    for key in ClientConfig.model_fields:
        assert f"`clients[].{key}`" in readme, f"no row for clients[].{key}"


def _readme_default(value: object) -> str:
    """A default as the configuration reference's tables write it."""
    if value is None:
        return "none"
    if isinstance(value, BaseModel):
        return "inherit"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value == "":
        return '`""`'  # an empty string, written as one
    return f"`{json.dumps(value)}`" if isinstance(value, list | dict) else f"`{value}`"


def _settings_rows(page: str) -> dict[str, str]:
    """Key and default of each row of the page's settings tables (``| key | default | ...``)."""
    rows: dict[str, str] = {}
    for table in re.split(r"\n(?=\| key \| default \|)", page)[1:]:
        for line in table.split("\n\n", 1)[0].splitlines()[2:]:
            match = re.match(r"^\| `([a-z0-9_.\[\]]+)` \| ([^|]*) \|", line)
            assert match is not None, line
            assert match.group(1) not in rows, f"two rows for {match.group(1)}"
            rows[match.group(1)] = match.group(2)
    return rows


def test_the_configuration_tables_give_each_settings_default() -> None:
    """Each row of the reference's settings tables is a setting, with the code's default."""
    from gateway.settings import ClientConfig, RouteConfig, UpstreamConfig

    rows = _settings_rows(CONFIGURATION_PAGE.read_text())
    fields: dict[str, FieldInfo] = {}
    for name, field in Settings.model_fields.items():
        if name in ("timeouts", "limits", "tracing", "keys"):
            model = field.annotation
            assert isinstance(model, type)
            assert issubclass(model, BaseModel)
            fields |= {f"{name}.{key}": sub for key, sub in model.model_fields.items()}
        elif name != "credentials":  # resolved from credential_env, not a setting
            fields[name] = field
    fields |= {f"routes[].{k}": f for k, f in RouteConfig.model_fields.items()}
    fields |= {f"routes[].upstreams[].{k}": f for k, f in UpstreamConfig.model_fields.items()}
    fields |= {f"clients[].{k}": f for k, f in ClientConfig.model_fields.items()}
    assert set(rows) == set(fields), set(rows) ^ set(fields)
    for key, field in fields.items():
        if key == "routes[].upstream":  # optional in the model; required without upstreams
            assert rows[key].startswith("required, unless `upstreams`"), rows[key]
            continue
        default = (
            "required"
            if field.is_required()
            else _readme_default(field.get_default(call_default_factory=True))
        )
        assert rows[key].startswith(default), (key, rows[key], default)


# ---------------------------------------------------------------- credentials


def _sim_headers(simulator: ServerThread, rid: str) -> dict[str, Any]:
    record = web.get(f"{simulator.url}/_sim/requests/{rid}").json()
    headers: dict[str, Any] = record["headers"]
    return headers


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _seen(headers: dict[str, Any], name: str) -> str | None:
    """The simulator records credential headers as presence plus a sha256 of the value."""
    value = headers.get(name)
    if value is None:
        return None
    if isinstance(value, dict):
        return str(value.get("sha256"))
    return str(value)


def test_route_credential_replaces_the_clients(simulator: ServerThread) -> None:
    os.environ["GW_TEST_OPENAI_KEY"] = "sk-route-openai"
    os.environ["GW_TEST_ANTHROPIC_KEY"] = "sk-route-anthropic"
    try:
        settings = load_settings(
            access_log=False,
            routes=[
                {
                    "name": "oa",
                    "prefix": "/v1",
                    "upstream": simulator.url + "/v1",
                    "credential_env": "GW_TEST_OPENAI_KEY",
                },
                {
                    "name": "an",
                    "prefix": "/anthropic/v1",
                    "upstream": simulator.url + "/v1",
                    "credential_env": "GW_TEST_ANTHROPIC_KEY",
                    "protocol": "messages",
                },
                {"name": "open", "prefix": "/open/v1", "upstream": simulator.url + "/v1"},
            ],
        )
    finally:
        del os.environ["GW_TEST_OPENAI_KEY"], os.environ["GW_TEST_ANTHROPIC_KEY"]
    from gateway.app import create_app
    from gateway.server.edge import uvicorn_options
    from tests.conftest import running

    with running(create_app(settings), **uvicorn_options()) as gw:
        client_headers = {
            "authorization": "Bearer sk-client",
            "x-api-key": "sk-client-x",
            "api-key": "sk-client-azure",
        }
        web.post(
            gw.url + "/v1/chat/completions",
            json=CHAT,
            headers=client_headers | {"x-request-id": "cred-oa"},
        )
        seen = _sim_headers(simulator, "cred-oa")
        assert _seen(seen, "authorization") == _sha("Bearer sk-route-openai")
        assert _seen(seen, "x-api-key") is None
        assert _seen(seen, "api-key") is None

        web.post(
            gw.url + "/anthropic/v1/messages",
            json={"model": "c", "max_tokens": 5, "messages": [], "stream": True},
            headers=client_headers | {"x-request-id": "cred-an"},
        )
        seen = _sim_headers(simulator, "cred-an")
        assert _seen(seen, "x-api-key") == _sha("sk-route-anthropic")
        assert _seen(seen, "authorization") is None

        web.post(
            gw.url + "/open/v1/chat/completions",
            json=CHAT,
            headers={"authorization": "Bearer sk-client", "x-request-id": "cred-open"},
        )
        seen = _sim_headers(simulator, "cred-open")
        assert _seen(seen, "authorization") == _sha("Bearer sk-client")


def test_client_keys_are_checked(simulator: ServerThread) -> None:
    good = "gw-client-key-1"
    with gateway_for(
        simulator.url + "/v1", client_key_sha256=[hashlib.sha256(good.encode()).hexdigest()]
    ) as gw:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"x-api-key": "nope"}):
            response = web.post(
                gw.url + "/v1/chat/completions", json=CHAT, headers=headers | {"x-request-id": "k0"}
            )
            assert response.status_code == 401
            assert response.json()["error"]["type"] == "authentication_error"
            assert "wrong" not in response.text
            assert "nope" not in response.text
        assert web.get(f"{simulator.url}/_sim/requests/k0").status_code == 404
        ok = web.post(
            gw.url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {good}"}
        )
        assert ok.status_code == 200
        ok = web.post(gw.url + "/v1/chat/completions", json=CHAT, headers={"x-api-key": good})
        assert ok.status_code == 200
        metrics = web.get(gw.url + "/metrics").text
        assert metric_value(metrics, "gateway_rejected_requests_total", reason="unauthorized") == 3
        assert good not in metrics


def test_upstream_is_fixed_by_the_route(simulator: ServerThread) -> None:
    with gateway_for(simulator.url + "/v1") as gw:
        for target in (
            "http://127.0.0.1:1/v1/models",
            "//127.0.0.1:1/v1/models",
        ):
            response = web.get(gw.url + "/v1/models", headers={"host": target})
            assert response.status_code == 200  # still the route's upstream
        # an absolute-form request target does not pick the upstream either
        import socket

        with socket.create_connection(("127.0.0.1", gw.port)) as conn:
            conn.sendall(
                b"GET http://127.0.0.1:1/v1/models HTTP/1.1\r\nHost: 127.0.0.1:1\r\n"
                b"Connection: close\r\n\r\n"
            )
            raw = b""
            while chunk := conn.recv(65536):
                raw += chunk
        assert b'"object":"list"' in raw.replace(b" ", b"") or raw.startswith(b"HTTP/1.1 4")


# ---------------------------------------------------------------- admission and drain


def test_concurrency_limit_gives_503_with_retry_after() -> None:
    with (
        gated_upstream() as upstream,
        gateway_for(upstream.url + "/v1", limits={"max_concurrent_streams": 2}) as gw,
        web.client(base_url=gw.url, timeout=WAIT_SECONDS) as client,
    ):
        with (
            client.stream("POST", "/v1/chat/completions", json=CHAT, headers={"x-gate": "a"}) as a,
            client.stream("POST", "/v1/chat/completions", json=CHAT, headers={"x-gate": "b"}) as b,
        ):
            # both answers have started, and neither ends before its gate opens
            extra = client.post("/v1/chat/completions", json=CHAT)
            upstream.open_all()
            bodies = [a.read(), b.read()]
        assert a.status_code == b.status_code == 200
        assert [annotation(body)["outcome"] for body in bodies] == ["complete", "complete"]
        assert extra.status_code == 503
        assert extra.headers["retry-after"]
        assert extra.json()["error"]["code"] == "overloaded"
        # the two streams are over once they are counted
        metrics = settled_metrics(gw.url, requests=3)
        assert metric_value(metrics, "gateway_rejected_requests_total", reason="overloaded") == 1
        # capacity returns once the streams end
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_sigterm_drains_then_ends_the_rest_with_gateway_shutdown() -> None:
    drain = 3.0
    with (
        gated_upstream() as upstream,
        gateway_process(
            ["--upstream", upstream.url + "/v1", "--drain-timeout", str(drain)],
            env={"GATEWAY_ACCESS_LOG": "false"},
        ) as gw,
    ):
        results: dict[str, bytes] = {}
        statuses: dict[str, int] = {}
        ended: dict[str, float] = {}

        def stream(name: str, headers: dict[str, str]) -> None:
            with web.client(timeout=30) as client:
                response = client.post(gw.url + "/v1/chat/completions", json=CHAT, headers=headers)
                ended[name] = time.monotonic()
                results[name] = response.content
                statuses[name] = response.status_code

        gates = {
            "short": {"x-gate": "short"},  # a stream that ends when the test says so
            "long": {"x-gate": "long"},  # a stream that would outlive the drain
            "waiting": {"x-gate": "waiting", "x-gate-at": "headers"},  # no answer yet
        }
        threads = {
            name: threading.Thread(target=stream, args=(name, headers))
            for name, headers in gates.items()
        }
        for thread in threads.values():
            thread.start()
        for name in gates:  # all three are in flight
            assert upstream.gate(name).reached.wait(WAIT_SECONDS), name
        signalled = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        # not ready, and refusing new work, while the streams are still in flight
        wait_until(lambda: web.get(gw.url + "/readyz", timeout=5).status_code == 503, "not ready")
        refused = web.post(gw.url + "/v1/chat/completions", json=CHAT, timeout=5)
        assert refused.status_code == 503
        assert ended == {}
        # a stream that ends during the drain ends normally, while the others wait
        upstream.gate("short").open()
        threads["short"].join(30)
        assert set(ended) == {"short"}
        for thread in threads.values():
            thread.join(30)
        gw.proc.wait(timeout=30)
    assert annotation(results["short"])["outcome"] == "complete"
    note = annotation(results["long"])
    assert (note["outcome"], note["reason"]) == ("incomplete", "gateway_shutdown")
    assert b'"code":"gateway_shutdown"' in results["long"]
    # stopped before any response byte: a clean JSON 503, not a server error
    assert statuses["waiting"] == 503
    assert json.loads(results["waiting"])["error"]["code"] == "gateway_shutdown"
    # the signal was handled by the drain: a clean exit, not a death by SIGTERM
    assert gw.proc.returncode == 0
    # the rest were stopped by the drain timeout, not before it (a lower bound only:
    # the stalled upstreams would hold them for ever)
    assert ended["long"] - signalled >= drain * 0.9
    assert ended["waiting"] - signalled >= drain * 0.9


def test_worker_processes_log_the_gateways_own_lines_at_log_level(
    simulator: ServerThread,
) -> None:
    """With ``--workers 2`` each worker logs its drain as one process does (docs: log_level).

    uvicorn starts workers as fresh interpreters, so the logging ``gateway serve`` set up
    in the parent is not theirs: without their own, ``log_level`` does not reach them and
    the drain's INFO lines of a Kubernetes pod (2 workers) are lost.
    """
    with gateway_process(
        ["--upstream", simulator.url + "/v1", "--workers", "2"],
        env={"GATEWAY_ACCESS_LOG": "false"},
    ) as gw:
        # Both workers past their start-up: one stopped while it still starts has no drain.
        gw.wait_stderr(b"Application startup complete.", count=2)
        out, err = gw.stop()
    output = (out + err).decode()
    assert gw.proc.returncode == 0, output
    assert output.count("INFO gateway: drained\n") == 2, output
    with gateway_process(
        ["--upstream", simulator.url + "/v1", "--workers", "2"],
        env={"GATEWAY_ACCESS_LOG": "false", "GATEWAY_LOG_LEVEL": "warning"},
    ) as gw:
        # (uvicorn's start-up lines are INFO too: at least the worker that answered
        # /readyz had started, and its drain is not logged)
        out, err = gw.stop()
    output = (out + err).decode()
    assert gw.proc.returncode == 0, output
    assert "drained" not in output, output
