"""The command line, driven two ways: in-process (``gateway.cli.main``) and as a real process.

``run_cli`` calls ``main`` with the given argv under exactly the given environment,
with stdout and stderr captured, and turns ``SystemExit`` into the exit status: the
same argv, environment, exit status and output as ``python -m gateway``, without the
half second of CPU each new interpreter spends importing the gateway (the
configuration tests make about a hundred such calls). An unexpected exception is not
turned into a status: it propagates, and the test fails with its traceback, which is
stricter than asserting that ``Traceback`` is absent from a process's stderr.

Only the loading half of ``serve`` runs in-process: a ``serve`` whose configuration
loads fails the test (``ServeReached``) instead of binding a port, because every
in-process ``serve`` test expects a refusal at load.

``run_cli_process`` is the real ``python -m gateway`` for the few tests that prove the
path from the interpreter to ``main`` (exit status, stderr, no traceback).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from unittest import mock

from gateway import cli

ROOT = Path(__file__).resolve().parents[1]


class ServeReached(AssertionError):
    """``serve`` got past loading its configuration in an in-process run."""


def _refuse_to_serve(settings: Any) -> None:
    raise ServeReached("serve loaded its configuration: an in-process run never binds")


def environment(env: Mapping[str, str] | None = None, *, inherit: bool = True) -> dict[str, str]:
    """The runner's environment without ``GATEWAY_`` variables (or only PATH), plus ``env``."""
    if inherit:
        base = {k: v for k, v in os.environ.items() if not k.upper().startswith("GATEWAY_")}
    else:
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return base | dict(env or {})


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, inherit: bool = True
) -> subprocess.CompletedProcess[str]:
    """``gateway ARGS`` in-process, under exactly ``environment(env, inherit=inherit)``."""
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch.dict(os.environ, environment(env, inherit=inherit), clear=True),
        mock.patch.object(cli, "serve", _refuse_to_serve),
        contextlib.chdir(ROOT),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            cli.main(list(args))
            status = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                status = exc.code or 0
            else:  # sys.exit("message"): the interpreter prints it and exits 1
                print(exc.code, file=sys.stderr)
                status = 1
    return subprocess.CompletedProcess(["gateway", *args], status, out.getvalue(), err.getvalue())


def run_cli_process(
    *args: str, env: Mapping[str, str] | None = None, inherit: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python -m gateway ARGS`` as a real process, under ``environment(env, inherit=...)``."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        env=environment(env, inherit=inherit),
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )
