"""Configuration and command line as a newcomer and an operator meet them.

No silent simulator, no ignored variable, no traceback: every mistake is exit 2
with a message naming the key, where it came from and what is wrong. Driven
through the CLI's ``main`` in-process in a controlled environment (tests/cli.py),
through ``load_settings``, or against a real server; the misspelt variable below runs
``python -m gateway`` as a real process, to prove the interpreter's path to a refusal.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from gateway.settings import RouteConfig, Settings, UpstreamConfig, describe_errors, load_settings
from gateway.simulator._knobs import FAULTS, Knobs, knob_header
from tests import web
from tests.cli import environment, run_cli, run_cli_process
from tests.conftest import ServerThread, free_port, gateway_process

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "gateway.example.toml"
UPSTREAM = "http://upstream.test/v1"


def _bare_env(**extra: str) -> dict[str, str]:
    """An environment with no GATEWAY_ variable and no credential of any kind."""
    return environment(extra, inherit=False)


def _gateway(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``gateway ARGS`` in-process under ``env`` (by default a bare one): see tests/cli.py."""
    return run_cli(*args, env=env if env is not None else {}, inherit=False)


def _gateway_process(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m gateway ARGS`` as a real process: the interpreter's path to ``main``."""
    return run_cli_process(*args, env=env if env is not None else {}, inherit=False)


def _refused(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """For in-process ``load_settings``: no GATEWAY_ variable from the test runner."""
    for name in list(os.environ):
        if name.upper().startswith("GATEWAY_"):
            monkeypatch.delenv(name)


# ------------------------------------------------------------ no silent simulator


def test_serve_with_nothing_to_front_exits_2_and_says_what_to_set() -> None:
    result = _gateway("serve", "--port", str(free_port()))
    _refused(
        result,
        "no upstream configured",
        "--upstream URL",
        "GATEWAY_UPSTREAM_URL",
        "[[routes]]",
        "--simulator",
        "GATEWAY_SIMULATOR=true",
    )


def test_a_misspelt_upstream_variable_never_starts_a_server() -> None:
    """The dangerous case: once, this served made-up answers with HTTP 200."""
    env = _bare_env(GATEWAY_UPSTREAM_ULR="https://api.openai.com/v1")
    result = _gateway_process("serve", "--port", str(free_port()), env=env)
    _refused(result, "GATEWAY_UPSTREAM_ULR is not a setting", "did you mean GATEWAY_UPSTREAM_URL?")


def test_the_simulator_is_a_setting_too_and_excludes_an_upstream(tmp_path: Path) -> None:
    shown = _gateway("check-config", env=_bare_env(GATEWAY_SIMULATOR="true"))
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["simulator"] is True
    config = tmp_path / "g.toml"
    config.write_text("simulator = true\n")
    assert _gateway("check-config", "--config", str(config)).returncode == 0
    both = _gateway("check-config", "--simulator", "--upstream", UPSTREAM)
    _refused(both, "simulator (--simulator, GATEWAY_SIMULATOR) and an upstream")


def test_serve_simulator_fronts_the_fake_provider_and_logs_each_start_line_once() -> None:
    import openai

    with gateway_process(["--simulator"], env={"GATEWAY_ACCESS_LOG": "false"}) as gw:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="any", max_retries=0)
        chat: dict[str, Any] = {
            "model": "sim-model",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        }
        text = "".join(
            chunk.choices[0].delta.content or ""
            for chunk in client.chat.completions.create(**chat)
            if chunk.choices
        )
        assert text
        with pytest.raises(openai.APIError) as caught:
            for _ in client.chat.completions.create(
                **chat, extra_headers={"x-sim-fault": "drop_before_done"}
            ):
                pass
        assert caught.value.code == "missing_done"
        out, err = gw.stop()
    output = (out + err).decode()
    # One plain line with both addresses, and the simulator's is the one that answers.
    lines = re.findall(
        r"simulator: the built-in fake provider is at (http://127\.0\.0\.1:(\d+)/v1); "
        rf"the gateway serves it at http://127\.0\.0\.1:{gw.port}/v1\n",
        output,
    )
    assert len(lines) == 1, output
    assert lines[0][1] != str(gw.port)
    # uvicorn's own start-up lines: once each, and only for the gateway's port.
    for line in (
        "Started server process",
        "Waiting for application startup.",
        "Application startup complete.",
        "Uvicorn running on",
    ):
        assert output.count(line) == 1, (line, output)
    assert f"Uvicorn running on http://127.0.0.1:{gw.port} " in output


# ------------------------------------------------------------ environment variables


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("GATEWAY_UPSTREAM_ULR", "GATEWAY_UPSTREAM_URL"),
        ("GATEWAY_TIMEOUT__IDLE", "GATEWAY_TIMEOUTS__IDLE"),
        ("GATEWAY_TIMEOUTS_IDLE", "GATEWAY_TIMEOUTS__IDLE"),
        ("GATEWAY_LIMITS__MAX_REQUEST_BYTE", "GATEWAY_LIMITS__MAX_REQUEST_BYTES"),
        ("GATEWAY_DRAIN_TIMOUT", "GATEWAY_DRAIN_TIMEOUT"),
        ("gateway_worker", "GATEWAY_WORKERS"),
    ],
)
def test_an_unknown_gateway_variable_is_refused_naming_the_closest_key(
    name: str, closest: str
) -> None:
    result = _gateway("check-config", "--upstream", UPSTREAM, env=_bare_env(**{name: "5"}))
    _refused(result, f"environment variable {name} is not a setting", f"did you mean {closest}?")


def test_an_unknown_variable_without_a_close_key_is_refused_too() -> None:
    result = _gateway("check-config", "--upstream", UPSTREAM, env=_bare_env(GATEWAY_XYZZY="1"))
    _refused(result, "GATEWAY_XYZZY is not a setting", "config/gateway.example.toml")


def test_nested_internal_and_lower_case_variables_are_known() -> None:
    env = _bare_env(
        GATEWAY_UPSTREAM_URL=UPSTREAM,
        GATEWAY_TIMEOUTS__IDLE="5",
        GATEWAY_LIMITS__MAX_REQUEST_BYTES="1000",
        GATEWAY_LIMITS__MAX_CONCURRENT_STREAMS="7",
        GATEWAY_WORKER_SETTINGS="{}",  # set by the parent for its workers; not read here
        gateway_port="1234",
    )
    result = _gateway("check-config", env=env)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["timeouts"]["idle"] == 5.0
    assert shown["limits"]["max_request_bytes"] == 1000
    assert shown["limits"]["max_concurrent_streams"] == 7
    assert shown["port"] == 1234


def test_every_setting_has_a_variable_that_is_read(
    clean_environ: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each settings key, nested ones through ``__``, passes the check and is read."""
    monkeypatch.setenv("GATEWAY_UPSTREAM_URL", UPSTREAM)
    given: dict[str, list[str]] = {}
    for section in ("timeouts", "limits"):
        model = Settings.model_fields[section].annotation
        assert isinstance(model, type)
        assert issubclass(model, BaseModel)
        for key, field in model.model_fields.items():
            if field.annotation in (int, float, int | None, float | None):
                monkeypatch.setenv(f"GATEWAY_{section.upper()}__{key.upper()}", "7")
                given.setdefault(section, []).append(key)
    settings = load_settings()
    for section, keys in given.items():
        values = getattr(settings, section).model_dump()
        assert {key: values[key] for key in keys} == dict.fromkeys(keys, 7), section


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"GATEWAY_ROUTES": '[{"name": "a", "upstream": '},
            "environment variable GATEWAY_ROUTES must be a JSON array, but is not JSON",
        ),
        (
            {"GATEWAY_ROUTES": ""},
            "environment variable GATEWAY_ROUTES must be a JSON array, but is not JSON",
        ),
        (
            {"GATEWAY_UPSTREAM_URL": UPSTREAM, "GATEWAY_MODEL_LABELS": "gpt-4o,claude"},
            "environment variable GATEWAY_MODEL_LABELS must be a JSON array, but is not JSON",
        ),
        (
            {"GATEWAY_UPSTREAM_URL": UPSTREAM, "GATEWAY_TIMEOUTS": "idle=5"},
            "environment variable GATEWAY_TIMEOUTS must be a JSON object, but is not JSON",
        ),
        (
            {"GATEWAY_ROUTES": '{"name": "a"}'},
            "routes (environment variable GATEWAY_ROUTES): Input should be a valid list",
        ),
        (
            {"GATEWAY_ROUTES": '[{"name": "a", "upstream": "http://exa mple.com/v1"}]'},
            "routes[0].upstream (environment variable GATEWAY_ROUTES): must not contain spaces",
        ),
        (
            {"GATEWAY_UPSTREAM_URL": UPSTREAM, "GATEWAY_CLIENT_KEY_SHA256": '["abc"]'},
            "client_key_sha256 (environment variable GATEWAY_CLIENT_KEY_SHA256)",
        ),
    ],
)
def test_a_bad_complex_variable_is_named_with_what_is_wrong(
    env: dict[str, str], expected: str
) -> None:
    result = _gateway("check-config", env=_bare_env(**env))
    _refused(result, expected)
    assert "EnvSettingsSource" not in result.stderr


# ------------------------------------------------------------ the example file


def test_the_example_config_loads_as_shipped_without_any_credential() -> None:
    result = _gateway("check-config", "--config", str(EXAMPLE), env=_bare_env())
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert [r["name"] for r in shown["effective_routes"]] == ["openai", "anthropic", "pool"]
    assert all(r["credential"] is None for r in shown["effective_routes"])
    pool = shown["effective_routes"][2]["upstreams"]
    assert [u["name"] for u in pool] == ["primary", "fallback"]
    assert all(u["credential"] is None for u in pool)


def _example_with_commented_keys() -> dict[str, Any]:
    """The example as TOML, with every commented-out ``# key = value`` line live."""
    assignment = re.compile(r"^#\s?(?=[a-z][a-z0-9_]*\s*=\s*\S)")
    return tomllib.loads(
        "\n".join(assignment.sub("", line) for line in EXAMPLE.read_text().splitlines())
    )


def test_the_example_config_shows_every_key_with_its_default() -> None:
    """Every key of the settings model is in the example, live or commented out.

    A live key carries its default; a commented-out one is unset by default. The
    first example route shows every route key. A new setting missing from the
    example fails here.
    """
    live = tomllib.loads(EXAMPLE.read_text())
    shown = _example_with_commented_keys()
    # config names the file itself; credentials are resolved from credential_env.
    _check_shown_with_defaults(Settings, live, shown, "", {"config", "credentials", "routes"})
    # The first example route shows every route key; any route's keys but name, prefix,
    # upstream and upstreams carry their defaults.
    first_live, first_shown = live["routes"][0], shown["routes"][0]
    _check_shown_with_defaults(
        RouteConfig, first_live, first_shown, "routes[0].", {"name", "prefix", "upstream"}
    )
    for index, route in enumerate(live["routes"]):
        example = RouteConfig.model_validate(route)
        defaults = RouteConfig(upstream="https://example.test/v1")
        for key in route.keys() - {"name", "prefix", "upstream", "upstreams"}:
            assert getattr(example, key) == getattr(defaults, key), f"routes[{index}].{key}"
    # The first pool's first upstream shows every upstream key, with its default.
    index, pool = next((i, r) for i, r in enumerate(live["routes"]) if r.get("upstreams"))
    shown_pool = shown["routes"][index]
    _check_shown_with_defaults(
        UpstreamConfig,
        pool["upstreams"][0],
        shown_pool["upstreams"][0],
        f"routes[{index}].upstreams[0].",
        {"name", "url"},
    )


def _check_shown_with_defaults(
    model: type[BaseModel],
    live: dict[str, Any],
    shown: dict[str, Any],
    at: str,
    skip: set[str],
) -> None:
    for key, field in model.model_fields.items():
        if key in skip:
            continue
        where = at + key
        assert key in shown, f"{where} missing from {EXAMPLE.name}"
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            _check_shown_with_defaults(
                annotation, live.get(key, {}), shown[key], where + ".", set()
            )
            continue
        default = field.get_default(call_default_factory=True)
        if key in live:
            assert live[key] == default, f"{where} = {live[key]!r}, but defaults to {default!r}"
        else:
            assert default is None, f"{where} is commented out, but defaults to {default!r}"


# ------------------------------------------------------------ metrics directory


@pytest.mark.parametrize("command", ["check-config", "serve"])
@pytest.mark.parametrize("source", ["flag", "environment", "file"])
@pytest.mark.parametrize("kind", ["a file", "under a file", "under /proc"])
def test_an_unusable_metrics_dir_is_a_configuration_error(
    tmp_path: Path, command: str, source: str, kind: str
) -> None:
    regular = tmp_path / "regular-file"
    regular.write_text("not a directory")
    path, reason = {
        "a file": (regular, "is not a directory: it is a file"),
        "under a file": (regular / "metrics", f"is not a directory: {regular} is a file"),
        "under /proc": (Path("/proc/gateway-metrics-test"), "cannot create directories in /proc"),
    }[kind]
    args = [command, "--upstream", UPSTREAM, "--port", str(free_port())]
    env = _bare_env()
    if source == "flag":
        args += ["--metrics-dir", str(path)]
        origin = "(command-line flag --metrics-dir)"
    elif source == "environment":
        env["GATEWAY_METRICS_DIR"] = str(path)
        origin = "(environment variable GATEWAY_METRICS_DIR)"
    else:
        config = tmp_path / "g.toml"
        config.write_text(f'metrics_dir = "{path}"\n')
        args += ["--config", str(config)]
        origin = f"(config file {config}"
    _refused(_gateway(*args, env=env), f"metrics_dir {origin}", reason)


def test_a_metrics_dir_that_can_be_made_passes_and_check_config_leaves_no_trace(
    tmp_path: Path,
) -> None:
    target = tmp_path / "not" / "yet" / "there"
    result = _gateway("check-config", "--upstream", UPSTREAM, "--metrics-dir", str(target))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["metrics_dir"] == str(target)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------ upstream URLs


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://exa mple.com/v1", "must not contain spaces or control characters"),
        ("http://exa%20mple.com/v1", "has an invalid host 'exa%20mple.com'"),
        ("http://exa<mple>.com/v1", "has an invalid host"),
        ("http://-example.com/v1", "has an invalid host"),
        ("http://a..b/v1", "has an invalid host"),
        ("http://1.2.3.999/v1", "not a valid IPv4 address"),
        ("http://host:99999/v1", "is not a valid URL: Port out of range"),
        ("http://host:0/v1", "port must be between 1 and 65535"),
        ("http://[::1/v1", "is not a valid URL"),
        ("http:///v1", "must be an http:// or https:// URL"),
        ("api.openai.com/v1", "must be an http:// or https:// URL"),
        ("http://example.com/v1#x", "must not have a #fragment"),
    ],
)
def test_an_upstream_url_with_an_invalid_host_is_refused_at_load(
    clean_environ: None, url: str, expected: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        load_settings(upstream_url=url)
    assert expected in describe_errors(caught.value)
    with pytest.raises(ValidationError) as caught:
        load_settings(routes=[{"upstream": url}])
    message = describe_errors(caught.value)
    assert "routes[0].upstream" in message
    assert expected in message


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9000/v1",
        "http://[::1]:8000/v1",
        "http://simulator:9000/v1",
        "http://my_service:8000/v1",
        "https://münchen.example/v1",
        "https://user:sk-x@api.example.test/v1?api-key=1",
        "https://res.openai.azure.com/openai/deployments/x?api-version=2024-10-21",
        "https://api.openai.com/v1/",
    ],
)
def test_valid_upstream_urls_load(clean_environ: None, url: str) -> None:
    settings = load_settings(upstream_url=url)
    assert settings.upstream_url == url.rstrip("/")


def test_serve_refuses_an_invalid_host_from_the_command_line() -> None:
    result = _gateway("serve", "--upstream", "http://exa mple.com/v1", "--port", "0")
    _refused(result, "upstream_url (command-line flag --upstream): must not contain spaces")


def test_serve_logs_each_route_with_its_base_url_masked_and_warns_without_annotation(
    tmp_path: Path,
) -> None:
    config = tmp_path / "g.toml"
    config.write_text(
        "annotate = false\n"
        '[[routes]]\nname = "oa"\nprefix = "/v1"\n'
        'upstream = "http://user:sk-in-url@127.0.0.1:9/deep/v1?api-key=sk-in-query"\n'
        '[[routes]]\nname = "an"\nprefix = "/anthropic/v1"\n'
        'upstream = "http://[::1]:9/v1"\nprotocol = "messages"\n'
        '[[routes]]\nname = "ol"\nprefix = "/ollama/v1"\n'
        'upstream = "http://127.0.0.1:11434"\n'
    )
    with gateway_process(["--config", str(config)]) as gw:
        assert web.get(gw.url + "/healthz").status_code == 200
        out, err = gw.stop()
    output = (out + err).decode()
    masked = "http://<redacted>@127.0.0.1:9/deep/v1?api-key=<redacted>"
    assert output.count(f"route oa: /v1 -> {masked} (protocol auto)\n") == 1
    assert output.count("route an: /anthropic/v1 -> http://[::1]:9/v1 (protocol messages)\n") == 1
    assert output.count("route ol: /ollama/v1 -> http://127.0.0.1:11434 (protocol auto)\n") == 1
    assert "sk-in-url" not in output
    assert "sk-in-query" not in output
    pathless = re.findall(r"WARNING gateway: route (\w+): .* a base URL with no path.*", output)
    assert pathless == ["ol"], output
    assert "did you mean http://127.0.0.1:11434/v1?" in output
    warning = re.findall(r"WARNING gateway: annotate = false: a stream the upstream cut .*", output)
    assert len(warning) == 1, output


# ------------------------------------------------------------ help


def test_help_is_plain_text() -> None:
    result = _gateway("--help")
    assert result.returncode == 0
    for command in ("serve", "check-config", "simulate"):
        assert command in result.stdout
    assert "``" not in result.stdout
    serve = _gateway("serve", "--help")
    assert "--simulator" in serve.stdout
    assert "``" not in serve.stdout


def test_simulate_help_lists_every_fault_and_how_to_ask_for_one() -> None:
    result = _gateway("simulate", "--help")
    assert result.returncode == 0
    text = result.stdout
    listed = re.split(r"[,\s]+", text.split("faults (", 1)[1].split("\n\n", 1)[0])
    assert set(FAULTS) <= set(listed), set(FAULTS) - set(listed)
    assert "x-sim-fault: NAME" in text
    assert '"sim": {"fault": "NAME"}' in text
    for field in dataclasses.fields(Knobs):
        if field.name != "fault":
            assert knob_header(field.name) in text
            assert field.name in text


# ------------------------------------------------------------ README


def test_the_readme_uses_the_one_model_the_simulator_lists(simulator: ServerThread) -> None:
    """The README and the getting-started page run against the simulator as written."""
    readme = (ROOT / "README.md").read_text() + (ROOT / "docs" / "getting-started.md").read_text()
    sent = set(re.findall(r'"model": "([^".]+)"', readme))
    sent |= set(re.findall(r'model="([^"]+)"', readme))
    listed = {m["id"] for m in web.get(simulator.url + "/v1/models").json()["data"]}
    anthropic = web.get(simulator.url + "/v1/models", headers={"anthropic-version": "2023-06-01"})
    assert {m["id"] for m in anthropic.json()["data"]} == listed
    assert len(listed) == 1
    assert sent == listed, (sent, listed)


# ------------------------------------------------- allowed values and booleans (issue 45)


def test_a_mistyped_allowed_value_gets_a_suggestion_and_a_string_is_no_boolean(
    tmp_path: Path,
) -> None:
    """Issue 45 item 12: ``5xxx``, ``redsi``, ``strickt`` get the did-you-mean a mistyped
    key gets; ``cache = "yes"`` and ``resume = "on"`` were read as true."""
    config = tmp_path / "gateway.toml"
    config.write_text(
        'stream_store = "redsi"\n'
        "[[routes]]\n"
        'name = "a"\nprefix = "/v1"\nupstream = "http://127.0.0.1:9/v1"\n'
        'retry_on = ["5xxx"]\ncache = "yes"\nresume = "on"\n'
        "[[clients]]\n"
        'name = "c"\nkey_sha256 = ["' + "0" * 64 + '"]\nbudget_enforcement = "strickt"\n'
        "cache_admin = 1\n"
    )
    result = _gateway("check-config", "--config", str(config))
    _refused(
        result,
        "stream_store (config file",
        "(did you mean 'redis'?)",
        "routes[0].retry_on[0] (config file",
        "(did you mean '5xx'?)",
        "(did you mean 'strict'?)",
        "routes[0].cache (config file",
        "must be true or false (a boolean, not 'yes')",
        "routes[0].resume (config file",
        "(a boolean, not 'on')",
        "clients[0].cache_admin (config file",
        "(a boolean, not 1)",
    )


def test_a_boolean_from_the_environment_is_true_or_false() -> None:
    assert _gateway("check-config", env={"GATEWAY_SIMULATOR": "TRUE"}).returncode == 0
    _refused(
        _gateway("check-config", env={"GATEWAY_SIMULATOR": "yes"}),
        "simulator (environment variable GATEWAY_SIMULATOR): must be true or false",
    )
