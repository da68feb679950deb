"""The Grafana dashboard and its provisioning, checked with the real tools.

- Structure: config/grafana/gateway.json is a dashboard Grafana loads (the
  classic JSON model: uid, schemaVersion, panels with unique ids on a 24-column
  grid without overlaps, rows, targets with unique refIds), its variables are
  the data source, route and model, and every ``$variable`` a panel uses is
  defined.
- Metrics: every metric and label a panel names is one the gateway exports
  (``METRIC_LABELS``, fixed by the lead), or one of the upstream-pool metrics
  of ``PENDING`` that this build does not export yet.
- ``promtool check rules``: every panel expression, its variables replaced as
  Grafana would with "All" selected, as a recording rule in a temporary file.
- A real Prometheus (Debian's package, as in the observability tests) scrapes
  a real gateway in front of the simulator at 1 s; after traffic, every
  expression returns data, except those whose metrics the gateway does not
  export (``PENDING``: they must then return nothing, and say why).
- Provisioning: the data source and dashboard provider files, and the compose
  service that mounts them, with a pinned image.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests import web
from tests.conftest import ServerThread, free_port
from tests.deploy.test_deploy_config import METRIC_LABELS, REPO, _tool, promtool
from tests.integration.helpers import annotation, gateway_for

GRAFANA = REPO / "config" / "grafana"
DASHBOARD = GRAFANA / "gateway.json"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "gateway.yml"

#: Metrics the dashboard shows that this build does not export yet, and why: their
#: panels stay empty until the metric exists (the live test checks both ways).
PENDING = {
    "gateway_upstream_attempts_total": "upstream pools and failover (issue 14)",
    "gateway_upstream_ejected": "passive health of upstream pools (issue 14)",
    "gateway_upstream_active_streams": "upstream pools (issue 14)",
}
PENDING_LABELS = {"route", "upstream", "result"}
PANEL_TYPES = {"row", "timeseries", "stat"}
VARIABLES = {"datasource", "route", "model"}
# What Grafana substitutes, as a check: "All" is the variables' allValue (.*).
SUBSTITUTIONS = {
    "$__rate_interval": "1m",
    "$route": ".*",
    "$model": ".*",
}
METRIC = re.compile(r"\b(gateway_[a-z_]+?)(?:_bucket|_count|_sum)?\b(?=\s*[{\[)])")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def expressions() -> Iterator[tuple[str, str]]:
    """(panel id + refId, expression) for every target of every panel."""
    for panel in panels():
        for target in panel["targets"]:
            yield f"panel_{panel['id']}_{target['refId']}", target["expr"]


def substituted(expr: str, rate_interval: str = "1m") -> str:
    for name, value in {**SUBSTITUTIONS, "$__rate_interval": rate_interval}.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


def metrics_in(expr: str) -> set[str]:
    return set(METRIC.findall(expr))


# --------------------------------------------------------------------- structure


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    board = dashboard()
    assert board["uid"] == "llm-stream-gateway"
    assert board["title"]
    assert isinstance(board["schemaVersion"], int)
    assert board["schemaVersion"] >= 36  # the timeseries/stat model of Grafana 9 and later
    assert "id" not in board or board["id"] is None  # provisioned: Grafana assigns it
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        assert panel["type"] in PANEL_TYPES, panel["type"]
        assert panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0
        assert grid["y"] >= 0
        assert grid["w"] >= 1
        assert grid["h"] >= 1
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))
        if panel["type"] == "row":
            assert grid["w"] == 24
            assert panel["panels"] == []
            continue
        assert panel["description"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["fieldConfig"]["defaults"]["unit"]
        refs = [target["refId"] for target in panel["targets"]]
        assert refs
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            assert target["expr"].strip()


def test_the_variables_are_data_source_route_and_model() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert set(variables) == VARIABLES
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name, metric in (("route", "gateway_requests_total"), ("model", "gateway_streams_total")):
        variable = variables[name]
        assert variable["type"] == "query"
        assert variable["multi"] is True
        assert variable["includeAll"] is True
        assert variable["allValue"] == ".*"
        assert variable["query"]["query"].startswith(f"label_values({metric}")
        assert variable["query"]["query"].endswith(f", {name})")
    used: set[str] = set()
    for _, expr in expressions():
        used.update(re.findall(r"\$(\w+)", expr))
    assert used - {"__rate_interval"} <= VARIABLES
    assert {"route", "model"} <= used


def test_the_panels_cover_what_an_operator_looks_for() -> None:
    titles = " / ".join(panel["title"].lower() for panel in panels())
    for wanted in (
        "streams by outcome and reason",
        "incomplete-stream ratio per route and model",
        "time to first byte",
        "time to first token",
        "inter-chunk latency",
        "tokens per second",
        "active streams",
        "rejections",
        "upstream attempts",
        "ejected upstreams",
        "build",
    ):
        assert wanted in titles, wanted
    quantiles = [expr for _, expr in expressions() if "histogram_quantile" in expr]
    for histogram in (
        "gateway_time_to_first_byte_seconds",
        "gateway_time_to_first_token_seconds",
        "gateway_time_per_output_chunk_seconds",
    ):
        assert any(f"{histogram}_bucket" in expr for expr in quantiles), histogram


def test_every_metric_and_label_a_panel_names_is_exported() -> None:
    for key, expr in expressions():
        names = metrics_in(expr)
        assert names, f"{key}: no gateway metric in {expr}"
        for name in names:
            assert name in METRIC_LABELS or name in PENDING, f"{key}: unknown metric {name}"
        labels = set(re.findall(r"(\w+)\s*=~?\s*\"", expr))
        labels |= {
            label.strip()
            for group in re.findall(r"by \(([^)]*)\)", expr)
            for label in group.split(",")
        }
        known = {"le"}
        for name in names:
            known |= METRIC_LABELS.get(name, PENDING_LABELS)
        assert labels <= known, f"{key}: labels {labels - known} are not on {names}"


# --------------------------------------------------------------------- promtool


def _rules_file(path: Path, exprs: list[tuple[str, str]]) -> Path:
    rules = [{"record": f"dashboard:{key}", "expr": substituted(expr)} for key, expr in exprs]
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}), encoding="utf-8"
    )
    return path


def test_promtool_accepts_every_panel_expression(tmp_path: Path) -> None:
    tool = promtool()
    exprs = list(expressions())
    assert len(exprs) >= 20
    rules = _rules_file(tmp_path / "dashboard.rules.yml", exprs)
    result = subprocess.run(
        [tool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_promtool_rejects_a_broken_panel_expression(tmp_path: Path) -> None:
    tool = promtool()
    key, expr = next(expressions())
    rules = _rules_file(tmp_path / "broken.rules.yml", [(key, expr.replace(")", "", 1))])
    result = subprocess.run(
        [tool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0, result.stdout


# --------------------------------------------------------------------- provisioning


def test_provisioning_and_compose_serve_the_dashboard() -> None:
    (source,) = yaml.safe_load(DATASOURCES.read_text(encoding="utf-8"))["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["current"]["value"] == source["uid"]

    (provider,) = yaml.safe_load(PROVIDERS.read_text(encoding="utf-8"))["providers"]
    assert provider["type"] == "file"
    folder = provider["options"]["path"]

    compose = yaml.safe_load((REPO / "compose.yaml").read_text(encoding="utf-8"))
    grafana = compose["services"]["grafana"]
    image, _, tag = grafana["image"].partition(":")
    assert image == "grafana/grafana"
    assert re.fullmatch(r"\d+\.\d+\.\d+", tag), "pin an exact Grafana version"
    mounts = {}
    for volume in grafana["volumes"]:
        source_path, target = volume.split(":")[:2]
        if source_path.startswith("."):
            assert (REPO / source_path).is_file(), f"grafana mounts missing file {source_path}"
            mounts[target] = (REPO / source_path).resolve()
    assert mounts[f"{folder}/gateway.json"] == DASHBOARD
    provisioning = "/etc/grafana/provisioning"
    assert mounts[f"{provisioning}/datasources/prometheus.yml"] == DATASOURCES
    assert mounts[f"{provisioning}/dashboards/gateway.yml"] == PROVIDERS
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home in mounts
    assert "prometheus" in grafana["depends_on"]
    (port,) = grafana["ports"]
    for page in ("deployment.md", "metrics.md"):
        text = (REPO / "docs" / page).read_text(encoding="utf-8")
        assert f"http://localhost:{port.split(':')[0]}/d/{dashboard()['uid']}" in text, page


# --------------------------------------------------------------------- live


CHAT = {"model": "sim-1", "messages": [{"role": "user", "content": "hi"}], "stream": True}
USAGE = {"stream_options": {"include_usage": True}}


def _traffic(base: str) -> None:
    """A mix that feeds every exported metric: usage and none, paced streams (output
    gaps), cut and broken streams, an upstream that refuses connections, a refusal."""
    with web.client(base_url=base, timeout=15) as client:
        for fault, extra, headers in (
            ("none", USAGE, {}),
            ("none", {}, {"x-sim-tps": "200", "x-sim-tokens": "6"}),
            ("none", USAGE, {"x-sim-tps": "200", "x-sim-tokens": "6"}),
            ("drop_before_done", {}, {}),
            ("abort_mid_body", {}, {}),
        ):
            body = client.post(
                "/v1/chat/completions", json=CHAT | extra, headers={"x-sim-fault": fault, **headers}
            ).content
            annotation(body)
        assert client.get("/v1/%2e%2e/x").status_code == 400
        assert client.post("/dead/v1/chat/completions", json=CHAT).status_code == 502


def _query(api: str, promql: str) -> list[dict[str, Any]]:
    try:
        answer = web.get(f"{api}/query", params={"query": promql}, timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return []
    assert answer.get("status") == "success", (promql, answer)
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def _has_data(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


def test_every_panel_returns_data_from_a_real_prometheus(
    simulator: ServerThread, tmp_path: Path, dead_port: int
) -> None:
    prometheus = _tool("prometheus", "install it with `apt-get install prometheus`")
    routes = [
        {"name": "default", "prefix": "/v1", "upstream": simulator.url + "/v1"},
        {"name": "dead", "prefix": "/dead/v1", "upstream": f"http://127.0.0.1:{dead_port}/v1"},
    ]
    with gateway_for("", routes=routes) as gw:
        exported = {
            line.split()[2]
            for line in web.get(gw.url + "/metrics").text.splitlines()
            if line.startswith("# TYPE ")
        }
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: gateway\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{gw.port}']\n"
        )
        api = f"http://127.0.0.1:{port}/api/v1"
        proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            # Two rounds of traffic: the first creates the series (rate() sees nothing of a
            # series' first sample), the second, once Prometheus has them, increases them.
            _traffic(gw.url)
            deadline = time.monotonic() + 40
            while not _query(api, "gateway_time_per_output_chunk_seconds_count > 0"):
                assert time.monotonic() < deadline, "Prometheus never scraped the traffic"
                time.sleep(0.2)
            _traffic(gw.url)
            pending: dict[str, str] = {}
            waiting = dict(expressions())
            deadline = time.monotonic() + 60
            while waiting and time.monotonic() < deadline:
                for key, expr in list(waiting.items()):
                    missing = {name for name in metrics_in(expr) if name not in exported}
                    if missing:
                        pending[key] = expr
                        del waiting[key]
                    elif _has_data(_query(api, substituted(expr, "30s"))):
                        del waiting[key]
                time.sleep(0.5)
            assert not waiting, f"no data for: {json.dumps(waiting, indent=1)}"
            # Empty because their metric does not exist here, and only those of PENDING.
            for key, expr in pending.items():
                assert metrics_in(expr) <= set(PENDING), key
                assert _query(api, substituted(expr, "30s")) == [], key
            # The variables' queries find the route and the model.
            route_values = web.get(
                f"{api}/label/route/values", params={"match[]": "gateway_requests_total"}
            ).json()["data"]
            models = web.get(
                f"{api}/label/model/values", params={"match[]": "gateway_streams_total"}
            ).json()["data"]
            assert sorted(route_values) == ["dead", "default"]
            assert "sim-1" in models
        finally:
            proc.terminate()
            proc.wait(timeout=20)
