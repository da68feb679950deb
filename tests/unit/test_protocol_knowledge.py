"""A protocol is its spec: nothing outside ``gateway/protocols/`` and ``gateway/guard/``
names a protocol or a framing (docs/adding-a-protocol.md).

Everything the gateway knows about one protocol (its contract and framing, its
error shape, its redaction, whether it is continued, its credential style) is
read from its registry entry, so a new protocol takes no edit anywhere else.
The simulator is exempt: it is a stand-in upstream that speaks each protocol
on its own wire, not part of the gateway's path.

What counts as naming one, read from the source (``ast``):

- a member of ``Protocol`` (``Protocol.CHAT``);
- an import of a protocol's contract or a framing's decoder module
  (``gateway.guard.chat``, ``gateway.guard.ndjson``), of a contract class
  (``ChatContract``), or of a framing record (``gateway.guard.framing.SSE``);
- a protocol's or framing's name as a string compared with something, as
  a key of a table, or as a ``protocol=`` argument (``protocol == "ndjson"``,
  ``{"messages": ...}``, ``RouteConfig(protocol="ollama")``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gateway.guard import Protocol, framing
from gateway.protocols import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gateway"
#: Where protocol knowledge lives, and the stand-in upstream.
ALLOWED = ("gateway/protocols/", "gateway/guard/", "gateway/simulator/")
#: The Responses API's WebSocket mode: a transport that only that protocol has (its
#: own edge, ``gateway.server.wsedge``, and relay); not a stream the registry dispatches.
ONE_PROTOCOLS_TRANSPORT = ("gateway/proxy/websocket.py",)
#: Lines that may name one, and why: ``serve --simulator`` fronts the simulator's Ollama
#: API by the route its page documents (``protocol = "ollama"``).
NAMED_ON_PURPOSE = {("gateway/app.py", 'protocol="ollama"')}

FRAMINGS = {value for value in vars(framing).values() if isinstance(value, framing.Framing)}
FRAMING_RECORDS = {
    name for name, value in vars(framing).items() if isinstance(value, framing.Framing)
}
NAMES = {str(p) for p in Protocol} | {f.name for f in FRAMINGS}
#: Guard modules that hold one protocol's contract or one framing's decoder.
SPECIFIC_MODULES = {spec.contract.__module__ for spec in REGISTRY if spec.contract is not None} | {
    type(f.new_decoder(1024, 1024)).__module__ for f in FRAMINGS
}
CONTRACT_CLASSES = {spec.contract.__name__ for spec in REGISTRY}


def _modules() -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not str(path.relative_to(ROOT)).startswith(ALLOWED + ONE_PROTOCOLS_TRANSPORT)
    ]


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _is_name(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_name(e) for e in node.elts)
    return False


def _namings(path: Path) -> list[str]:
    text = path.read_text()
    tree = ast.parse(text, str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "Protocol"
        ):
            found.append(f"{line}: Protocol.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in SPECIFIC_MODULES:
                found.append(f"{line}: imports {node.module}")
            for alias in node.names:
                if alias.name in CONTRACT_CLASSES:
                    found.append(f"{line}: imports {alias.name}")
                if node.module == "gateway.guard.framing" and alias.name in FRAMING_RECORDS:
                    found.append(f"{line}: imports the framing {alias.name}")
        elif isinstance(node, ast.Import):
            found += [f"{line}: imports {a.name}" for a in node.names if a.name in SPECIFIC_MODULES]
        elif isinstance(node, ast.Compare):
            if any(_is_name(side) for side in [node.left, *node.comparators]):
                found.append(f"{line}: compares with a protocol's or framing's name")
        elif isinstance(node, ast.keyword) and node.arg == "protocol" and _is_name(node.value):
            source = ast.get_source_segment(text, node) or ""
            if (_relative(path), source) not in NAMED_ON_PURPOSE:
                found.append(f"{line}: {source}")
        elif isinstance(node, ast.Dict) and any(
            key is not None and _is_name(key) for key in node.keys
        ):
            found.append(f"{line}: a table keyed by a protocol's or framing's name")
    return found


def test_the_scan_sees_what_it_looks_for() -> None:
    assert {"chat", "messages", "ollama", "sse", "ndjson"} <= NAMES
    assert {"gateway.guard.chat", "gateway.guard.ndjson", "gateway.guard.sse"} <= SPECIFIC_MODULES
    assert "MessagesContract" in CONTRACT_CLASSES
    assert "SSE" in FRAMING_RECORDS


def test_a_naming_is_found(tmp_path: Path) -> None:
    """The scan is not blind: each kind of naming in a module is reported."""
    source = tmp_path / "m.py"
    source.write_text(
        "from gateway.guard import MessagesContract, Protocol\n"
        "from gateway.guard.framing import NDJSON\n"
        "import gateway.guard.ndjson\n"
        "x = Protocol.CHAT\n"
        "y = framing == 'ndjson'\n"
        "z = {'gemini': 1}\n"
        "w = p in ('responses', 'other')\n"
        "v = RouteConfig(protocol='chat')\n"
    )
    assert len(_namings(source)) == 8


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_protocol_is_named_outside_its_spec(path: Path) -> None:
    assert not _namings(path), _namings(path)
