"""The package's layout keeps its promises: each folder imports only what it may.

- ``gateway/policy/`` decides; neither it nor any module of the package it
  imports, at any depth, imports asyncio, httpx, aiohttp, uvicorn or starlette
  (a library of its own may: pydantic-settings loads asyncio).
- ``gateway/guard/`` is sans-IO and imports nothing of the package but itself.
- Nothing imports ``gateway.cli`` (the command line is the top), and nothing
  but the command line and the probe imports ``gateway.app``.
- ``gateway/store/`` imports nothing of the package but itself (no HTTP, no
  protocol, no cache), and the cache's key (``gateway.cache.key``) does no I/O.
- No import cycle among the package's modules, imports inside functions included.
- The package's top level holds at most nine modules; the rest live in folders
  named for what kind of code they hold.
- A name names one room: one module or package is called ``limits`` (the client
  limits' counters and limiter), one ``quota`` (their arithmetic, in ``policy``);
  the ``[limits]`` table's model is ``GatewayLimits``, a client's ``ClientLimits``.

The import graph is read from the source (``ast``), so lazy imports count; the
loaded-module checks run in a fresh interpreter, so nothing a test imported
before hides a dependency.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gateway"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, *, outside: bool = False) -> set[str]:
    """The package modules ``name`` imports, anywhere in its source (with ``outside``,
    the top-level names of everything else it imports)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        absolute = isinstance(node, ast.Import) or not getattr(node, "level", 0)
        for target in targets:
            if outside:
                if absolute and target.split(".")[0] != "gateway":
                    found.add(target.split(".")[0])
            elif target in MODULES and target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name) for name in MODULES}
EXTERNAL = {name: _imports(name, outside=True) for name in MODULES}


def _reachable(module: str) -> set[str]:
    seen = {module}
    todo = [module]
    while todo:
        for dep in GRAPH[todo.pop()] - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


def _loaded_by(module: str) -> set[str]:
    code = f"import sys, json; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    return set(json.loads(out))


_IO = ("asyncio", "httpx", "aiohttp", "uvicorn", "starlette", "anyio")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("gateway.policy")))
def test_policy_imports_no_io(module: str) -> None:
    offending = sorted(
        f"{m} imports {lib}" for m in _reachable(module) for lib in EXTERNAL[m] & set(_IO)
    )
    assert not offending, offending


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("gateway.guard")))
def test_guard_imports_nothing_of_the_package(module: str) -> None:
    outside = sorted(
        m for m in GRAPH[module] if not m.startswith("gateway.guard") and m != "gateway"
    )
    assert not outside, f"{module} imports {outside}"


def test_the_cache_key_is_pure() -> None:
    """What makes a request's key (``gateway.cache.key``) does no I/O and knows no relay."""
    reachable = _reachable("gateway.cache.key")
    offending = sorted(f"{m} imports {lib}" for m in reachable for lib in EXTERNAL[m] & set(_IO))
    assert not offending, offending
    assert not any(m.startswith("gateway.proxy") for m in reachable)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("gateway.store")))
def test_the_stream_store_knows_no_http_and_no_cache(module: str) -> None:
    """The store imports nothing of the package but itself: its Redis clients are handed
    in (``RedisConnection``, built by the app with the one client factory)."""
    outside = sorted(
        m for m in GRAPH[module] if not m.startswith("gateway.store") and m != "gateway"
    )
    assert not outside, f"{module} imports {outside}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("gateway.redisconn")))
def test_the_redis_factory_knows_nothing_of_its_users(module: str) -> None:
    """``gateway.redisconn`` builds clients for the limits, the store and the rest: it
    imports none of them (nor the settings), so each may use it."""
    outside = sorted(
        m for m in GRAPH[module] if not m.startswith("gateway.redisconn") and m != "gateway"
    )
    assert not outside, f"{module} imports {outside}"


@pytest.mark.parametrize("name", ["limits", "quota"])
def test_a_name_names_one_room(name: str) -> None:
    rooms = sorted(m for m in MODULES if m.rpartition(".")[2] == name)
    assert len(rooms) == 1, f"{name!r} names {rooms}"


def test_the_two_kinds_of_limit_have_two_names() -> None:
    import gateway.settings as settings

    # the [limits] table (the gateway's own) and [clients.limits] (a named client's)
    assert settings.Settings.model_fields["limits"].annotation is settings.GatewayLimits
    assert settings.ClientConfig.model_fields["limits"].annotation is settings.ClientLimits
    assert not hasattr(settings, "Limits")


def test_nothing_imports_the_command_line() -> None:
    importers = sorted(m for m, deps in GRAPH.items() if "gateway.cli" in deps)
    assert importers == ["gateway.__main__"]


def test_only_the_command_line_and_the_probe_import_the_app() -> None:
    importers = sorted(m for m, deps in GRAPH.items() if "gateway.app" in deps)
    assert all(m == "gateway.cli" or m.startswith("gateway.probe") for m in importers), importers


def test_recording_a_request_loads_no_metrics_library() -> None:
    assert "prometheus_client" not in _loaded_by("gateway.observe.record")


def test_the_relay_layers_do_not_load_the_server() -> None:
    for module in ("gateway.proxy.relay", "gateway.proxy.answers"):
        loaded = _loaded_by(module)
        assert "uvicorn" not in {m.split(".")[0] for m in loaded}, module


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(GRAPH[node]):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for name in sorted(GRAPH):
        if name not in state and (found := visit(name)):
            return found
    return None


def test_the_top_level_holds_at_most_nine_modules() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 9, top


def test_no_import_cycle() -> None:
    assert _cycle() is None, " -> ".join(_cycle() or [])


def test_the_graph_is_read() -> None:
    # The checks above mean something only if the reader finds the real edges.
    assert "gateway.proxy.relay" in GRAPH["gateway.app"]
    assert "gateway.policy.pool" in GRAPH["gateway.policy.failover"]
    assert "gateway.app" in GRAPH["gateway.cli"]  # a lazy import, inside a function
    assert "asyncio" in EXTERNAL["gateway.proxy.relay"]
    assert "httpx" in EXTERNAL["gateway.proxy.attempt"]


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000",
        "http://127.0.0.1:8000/v1",
        "https://api.example.com/v1/",
        "http://host/a b/é?x=1 2&y=ü",
        "http://host/already%20encoded?q=%C3%A9",
        "http://user:pw@host:9/p;x=1/q?a=b=c&d",
        "http://bücher.example/v1",
    ],
)
def test_routing_encodes_upstream_urls_as_httpx_does(url: str) -> None:
    # routing dropped httpx (policy/ loads no I/O library) but must build the same URLs.
    import httpx

    from gateway.policy.routing import encoded_url

    assert encoded_url(url) == str(httpx.URL(url))
