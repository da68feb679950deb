"""LiteLLM's proxy as a benchmark target: its own virtualenv, its config, its command line.

The ``litellm`` target of bench_gateway.py: the best-known peer, measured beside the
gateway on the same upstream. It is never a dependency of the project: the first run
that asks for it installs a pinned ``litellm[proxy]`` from PyPI into
``tests/perf/.venv-litellm`` (git-ignored, ~750 MB, about a minute), and later runs reuse it.

Settings, from LiteLLM's "Best Practices for Production" page:

* one uvicorn worker (``--num_workers 1``, the documented default for a container);
* a ``config.yaml`` with a ``model_list`` entry ``openai/<model>`` whose ``api_base`` is
  the bench upstream and whose key is a dummy; a master key (``sk-bench``, the key the
  load generator sends), so every request is authenticated as in production;
* no database; ``general_settings`` ``disable_spend_logs`` and ``disable_error_logs``;
  ``litellm_settings`` ``request_timeout: 600``, ``set_verbose: false``, ``json_logs``;
* ``LITELLM_MODE=PRODUCTION`` (no ``.env`` loading), ``LITELLM_LOG=ERROR`` (no per-request
  info log), ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (no download of the cost map at start:
  this machine reaches no such host). Telemetry: this version has none to turn off (its
  ``--telemetry`` flag is a documented no-op), and ``LITELLM_TELEMETRY=False`` is set anyway.
* one setting differs from the defaults, for the bench's sake, not LiteLLM's:
  ``REPEATED_STREAMING_CHUNK_LIMIT``. The bench upstream sends the same token over and
  over, and LiteLLM ends a stream with an error event after 100 identical content chunks
  in a row (a guard against a looping model), which would end every 150-event stream.
  The limit is raised past any stream's length; the check still runs on every chunk.

Everything else is LiteLLM's default, including what bounds it: uvicorn with h11 (its
requirements have no httptools, neither in the package nor in its Docker image), uvloop,
and at most 500 upstream connections per host (``AIOHTTP_CONNECTOR_LIMIT_PER_HOST``): in
scenario 5 the streams past 500 wait for a connection and time out.

LiteLLM does not forward the client's query string, by which the bench upstream is told
which stream to send (``mode=paced&n=150&rate=50``). For this target the load generator
names the stream in the request's ``model`` instead (``bench?mode=paced&n=150&rate=50``),
the config has one ``model_list`` entry per stream the run can ask for, and the upstream
reads the model when the URL has no query. LiteLLM re-renders every chunk but keeps unknown
top-level fields, so each event's ``"ts"`` stamp arrives as the upstream wrote it and the
target is verified like ``direct`` and ``nginx`` (every stamped event, ``data: [DONE]``
last, nothing after it).

The pin is exact on purpose: versions 1.82.7 and 1.82.8 on PyPI were a credential stealer
(a ``litellm_init.pth`` that runs at every interpreter start), and the later 1.107 line was
withdrawn. ``ensure_venv`` refuses a virtualenv whose version is not the pin or that holds
a ``.pth`` file not on a short list, and the proxy runs with an environment of its own,
not the harness's. Newer releases than the pin need ``litellm-proxy`` / newer
``litellm-proxy-extras`` packages that the registry here does not serve.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

VERSION = "1.106.12"
VENV = Path(__file__).resolve().parent / ".venv-litellm"
MASTER_KEY = "sk-bench"  # what bench_gateway's load generator sends as its bearer token
MODEL_PREFIX = "bench?"  # model = MODEL_PREFIX + the upstream query
_KNOWN_PTH = ("distutils-precedence.pth",)


def model_for(query: str) -> str:
    """The ``model`` a request names to get the upstream stream ``query`` through LiteLLM."""
    return MODEL_PREFIX + query


def _python() -> Path:
    return VENV / "bin" / "python"


def installed_version() -> str | None:
    python = _python()
    if not python.exists():
        return None
    probe = "import importlib.metadata as m; print(m.version('litellm'))"
    try:
        out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def _unexpected_pth() -> list[str]:
    found = []
    for site in VENV.glob("lib/python*/site-packages"):
        for pth in site.glob("*.pth"):
            if pth.name not in _KNOWN_PTH and not pth.name.endswith("-nspkg.pth"):
                found.append(str(pth))
    return found


def ensure_venv() -> Path:
    """The LiteLLM virtualenv's ``litellm`` executable; installs the pin if it is missing."""
    if installed_version() != VERSION:
        print(
            f"installing litellm[proxy]=={VERSION} into {VENV} (once; ~750 MB, about a minute)",
            flush=True,
        )
        if not _python().exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=300)
        pip = [str(_python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        try:
            subprocess.run([*pip, "--upgrade", "pip"], check=True, timeout=600)
            subprocess.run([*pip, f"litellm[proxy]=={VERSION}"], check=True, timeout=1800)
        except (OSError, subprocess.SubprocessError) as exc:
            raise RuntimeError(f"could not install litellm[proxy]=={VERSION}: {exc}") from exc
        if installed_version() != VERSION:
            raise RuntimeError(f"{VENV} does not hold litellm {VERSION} after installing it")
    strange = _unexpected_pth()
    if strange:
        raise RuntimeError(
            f"refusing to run LiteLLM: unexpected .pth files in its virtualenv: {strange} "
            f"(remove {VENV} to reinstall)"
        )
    return VENV / "bin" / "litellm"


def config_yaml(upstream_port: int, queries: Iterable[str]) -> str:
    """The proxy's config.yaml (JSON is YAML): one model per stream the run can ask for."""
    api_base = f"http://127.0.0.1:{upstream_port}/v1"
    models = [
        {
            "model_name": model_for(query),
            "litellm_params": {
                "model": "openai/" + model_for(query),
                "api_base": api_base,
                "api_key": "sk-bench-upstream-dummy",
            },
        }
        for query in sorted(set(queries))
    ]
    config = {
        "model_list": models,
        "general_settings": {
            "master_key": MASTER_KEY,
            "disable_spend_logs": True,
            "disable_error_logs": True,
        },
        "litellm_settings": {"request_timeout": 600, "set_verbose": False, "json_logs": True},
    }
    return json.dumps(config, indent=2) + "\n"


def environment(home: Path) -> dict[str, str]:
    """The proxy's whole environment: nothing of the harness's but PATH and the locale."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LITELLM_MODE": "PRODUCTION",
        "LITELLM_LOG": "ERROR",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        # The bench upstream repeats one token; LiteLLM ends a stream with a 500 error event
        # after 100 identical content chunks in a row (its guard against a looping model).
        # Raised above any stream's length: the check still runs on every chunk.
        "REPEATED_STREAMING_CHUNK_LIMIT": "1000000000",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    for name in ("LANG", "LC_ALL", "TZ"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def command(executable: Path, config: Path, port: int, extra: Iterable[str] = ()) -> list[str]:
    return [
        str(executable),
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
        *extra,
    ]
