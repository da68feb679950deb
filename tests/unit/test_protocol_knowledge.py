"""A protocol is its spec: nothing outside ``gateway/protocols/`` and ``gateway/guard/``
names a protocol or a framing (docs/adding-a-protocol.md).

Everything the gateway knows about one protocol (its contract and framing, its
output-limit fields, its error shape, its redaction, its credential headers,
its request-id headers, the statuses that cool its upstream down, whether and
how it is continued or retrieved) is read from its registry entry, so a new
protocol takes no edit anywhere else. The simulator is exempt: it is a
stand-in upstream that speaks each protocol on its own wire, not part of the
gateway's path. Docstrings and the text of error messages may name one (they
explain); code may not.

What counts as naming one, read from the source (``ast``); each form has its
own test case below, so the scan is known to see it:

1. a member of ``Protocol`` (``Protocol.CHAT``);
2. an import of a protocol's contract or a framing's decoder module
   (``import gateway.guard.ndjson``);
3. an import from one (``from gateway.guard.chat import ...``);
4. an import of a contract class (``ChatContract``);
5. an import of a framing record (``from gateway.guard.framing import SSE``);
6. a framing record read as an attribute (``framing.NDJSON``);
7. a protocol's or framing's name compared with something (``kind == "ndjson"``,
   ``p in ("responses", "other")``);
8. a table keyed by one (``{"gemini": ...}``);
9. one as a keyword argument (``RouteConfig(protocol="ollama")``,
   ``redactor(framing="sse")``);
10. one as a ``match`` case (``case "bedrock":``);
11. a distinctive name (a framing's, or a provider's: ``sse``, ``ndjson``,
    ``eventstream``, ``gemini``, ``ollama``, ``bedrock``) as any string in code: a
    default, an assignment, a call's argument, a subscript (``kind: str = "sse"``);
12. a string built from parts that spells a name (``"nd" + "json"``,
    ``f"{'s'}se"``, ``"".join(("s", "se"))``);
13. an identifier that says one (``def _sse_lines``, ``self.ndjson``,
    ``is_bedrock = ...``, an argument ``eventstream``, an import ``as sse``);
14. a framing's media type as a string (``"text/event-stream"``).

The names ``chat``, ``completions``, ``responses`` and ``messages`` are also
ordinary words (and JSON members: a request's ``messages``), so forms 11 and 13
count only the distinctive names; forms 7-10 count every name.
"""

from __future__ import annotations

import ast
import re
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
#: Names that are also ordinary words, counted only where a name is used as one.
WORDS = {"chat", "completions", "responses", "messages"}
DISTINCT = NAMES - WORDS
MEDIA_TYPES = {f.media_type for f in FRAMINGS}
#: Guard modules that hold one protocol's contract or one framing's decoder.
SPECIFIC_MODULES = {spec.contract.__module__ for spec in REGISTRY if spec.contract is not None} | {
    type(f.new_decoder(1024, 1024)).__module__ for f in FRAMINGS
}
CONTRACT_CLASSES = {spec.contract.__name__ for spec in REGISTRY}
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def _says_one(identifier: str) -> bool:
    """Whether one of an identifier's words (``snake_case``, ``CamelCase``) is a
    distinctive name: ``_sse_lines``, ``NdjsonRedactor``, ``SSE``; not ``passed``."""
    return any(word.lower() in DISTINCT for word in _WORDS.findall(identifier))


def _modules() -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not str(path.relative_to(ROOT)).startswith(ALLOWED + ONE_PROTOCOLS_TRANSPORT)
    ]


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _folded(node: ast.AST) -> str | None:
    """The string an expression spells when it is built of constants only, else None:
    a constant, ``a + b``, an f-string of constants, ``"sep".join((a, b))``."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _folded(node.left), _folded(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.JoinedStr):
        parts = [_folded(v.value if isinstance(v, ast.FormattedValue) else v) for v in node.values]
        return None if None in parts else "".join(p for p in parts if p is not None)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "join"
        and len(node.args) == 1
        and isinstance(node.args[0], (ast.Tuple, ast.List))
    ):
        sep = _folded(node.func.value)
        parts = [_folded(e) for e in node.args[0].elts]
        return None if sep is None or None in parts else sep.join(p for p in parts if p)
    return None


def _is_name(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_name(e) for e in node.elts)
    return _folded(node) in NAMES


def _identifiers(node: ast.AST) -> list[str]:
    """The names a node binds or reads: a variable, an attribute, a function, a class,
    an argument, an import's alias."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.alias):
        return [node.asname or node.name.rpartition(".")[2]]
    if isinstance(node, ast.keyword) and node.arg:
        return [node.arg]
    return []


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of every docstring's node (a docstring may name anything)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _messages(tree: ast.AST) -> set[int]:
    """The ids of the strings that are the text of an error or a log line: arguments of a
    raised exception or of a logger's call (they explain; they decide nothing)."""
    found = set()
    for node in ast.walk(tree):
        call = None
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            call = node.exc
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"debug", "info", "warning", "error", "exception", "critical"}
        ):
            call = node
        if call is not None:
            for arg in [*call.args, *(k.value for k in call.keywords)]:
                found |= {id(n) for n in ast.walk(arg)}
    return found


def _on_purpose(path: Path, text: str, tree: ast.AST) -> set[int]:
    """The ids of the nodes of a naming ``NAMED_ON_PURPOSE`` allows."""
    return {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.keyword)
        and (_relative(path), ast.get_source_segment(text, node)) in NAMED_ON_PURPOSE
        for inner in ast.walk(node)
    }


def _namings(path: Path) -> list[str]:
    text = path.read_text()
    tree = ast.parse(text, str(path))
    skip = _docstrings(tree) | _messages(tree) | _on_purpose(path, text, tree)
    found: list[str] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "Protocol"
        ):
            found.append(f"{line}: Protocol.{node.attr}")
        if isinstance(node, ast.Attribute) and node.attr in FRAMING_RECORDS:
            found.append(f"{line}: the framing record {node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module in SPECIFIC_MODULES:
                found.append(f"{line}: imports from {node.module}")
            for alias in node.names:
                if alias.name in CONTRACT_CLASSES:
                    found.append(f"{line}: imports {alias.name}")
                if node.module == "gateway.guard.framing" and alias.name in FRAMING_RECORDS:
                    found.append(f"{line}: imports the framing {alias.name}")
        elif isinstance(node, ast.Import):
            found += [f"{line}: imports {a.name}" for a in node.names if a.name in SPECIFIC_MODULES]
        if isinstance(node, ast.Compare):
            if any(_is_name(side) for side in [node.left, *node.comparators]):
                found.append(f"{line}: compares with a protocol's or framing's name")
        elif isinstance(node, ast.keyword) and node.arg and _is_name(node.value):
            if id(node) not in skip:
                found.append(f"{line}: {ast.get_source_segment(text, node)}")
        elif isinstance(node, ast.Dict) and any(
            key is not None and _is_name(key) for key in node.keys
        ):
            found.append(f"{line}: a table keyed by a protocol's or framing's name")
        elif isinstance(node, ast.MatchValue) and _is_name(node.value):
            found.append(f"{line}: a match case on a protocol's or framing's name")
        if id(node) not in skip and not isinstance(node, ast.Constant):
            spelled = _folded(node)
            if spelled is not None and not isinstance(node, ast.Constant) and spelled in NAMES:
                found.append(f"{line}: a name built from parts ({spelled!r})")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if node.value in DISTINCT:
                found.append(f"{line}: the string {node.value!r}")
            elif any(media in node.value for media in MEDIA_TYPES):
                found.append(f"{line}: a framing's media type in {node.value!r}")
        for name in _identifiers(node):
            if _says_one(name):
                found.append(f"{line}: the identifier {name}")
    return sorted(set(found), key=lambda f: int(f.partition(":")[0]))


def test_the_scan_sees_what_it_looks_for() -> None:
    assert {"chat", "messages", "ollama", "sse", "ndjson", "eventstream"} <= NAMES
    assert {"gateway.guard.chat", "gateway.guard.ndjson", "gateway.guard.sse"} <= SPECIFIC_MODULES
    assert "MessagesContract" in CONTRACT_CLASSES
    assert "SSE" in FRAMING_RECORDS
    assert "text/event-stream" in MEDIA_TYPES


FORMS = {
    "a Protocol member": "x = Protocol.CHAT\n",
    "an import of a specific module": "import gateway.guard.ndjson\n",
    "an import from a specific module": "from gateway.guard.chat import something\n",
    "an import of a contract class": "from gateway.guard import MessagesContract\n",
    "an import of a framing record": "from gateway.guard.framing import NDJSON\n",
    "a framing record as an attribute": "from gateway.guard import framing\nf = framing.SSE\n",
    "a comparison": "y = kind == 'ndjson'\n",
    "a membership": "w = p in ('responses', 'other')\n",
    "a table key": "z = {'gemini': 1}\n",
    "a protocol keyword": "v = RouteConfig(protocol='chat')\n",
    "any keyword": "v = redactor(framing='messages')\n",
    "a match case": "match kind:\n    case 'completions':\n        pass\n",
    "a default": "def redact(data: bytes, kind: str = 'sse') -> bytes:\n    return data\n",
    "an assignment": "KIND = 'eventstream'\n",
    "a call's argument": "spec = spec_for('ollama')\n",
    "a subscript": "spec = TABLE['bedrock']\n",
    "a sum of parts": "kind = 'nd' + 'json'\n",
    "an f-string of parts": "kind = f\"{'s'}se\"\n",
    "a join of parts": "kind = ''.join(('resp', 'onses'))\n",
    "a function's name": "def _sse_lines() -> None:\n    pass\n",
    "an attribute's name": "x = self.ndjson\n",
    "a variable's name": "is_bedrock = True\n",
    "an argument's name": "def f(eventstream: bool) -> None:\n    pass\n",
    "an import's alias": "from gateway.guard import framing as sse\n",
    "a media type": "SEEN = b'x', 'text/event-stream; charset=utf-8'\n",
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_form_of_naming_is_found(tmp_path: Path, form: str) -> None:
    """The scan is not blind: each way of naming a protocol or a framing is reported."""
    source = tmp_path / "m.py"
    source.write_text(FORMS[form])
    assert _namings(source), form


@pytest.mark.parametrize(
    "allowed",
    [
        '"""A docstring may say SSE, ndjson or Bedrock: it explains."""\n',
        "raise ValueError('not an ndjson stream')\n",
        "log.warning('the bedrock upstream %s', name)\n",
        "messages = request.get('messages')\n",  # an ordinary word, a JSON member
        "x = {'chat_id': 1}\n",
        "passed = processes = dataclasses = WorkerProcesses = 1\n",
    ],
)
def test_what_is_not_a_naming(tmp_path: Path, allowed: str) -> None:
    source = tmp_path / "m.py"
    source.write_text(allowed)
    assert not _namings(source), _namings(source)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_protocol_is_named_outside_its_spec(path: Path) -> None:
    assert not _namings(path), _namings(path)
