"""httpx's one-call helpers and clients with one TLS context per process.

Each ``httpx.get()``, ``httpx.post()``... builds a new ``Client``, and with it a new
``SSLContext`` that loads certifi's CA bundle: about 45 ms of CPU per call, for requests
that all go to plain ``http://`` on 127.0.0.1. The suite makes about a thousand of them,
a quarter of its CPU. These helpers are the same calls with ``verify=VERIFY``: one
context, built once the way httpx builds its default, so a call costs what its request
costs; ``client()`` and ``async_client()`` are ``httpx.Client`` and
``httpx.AsyncClient`` likewise. Everything else (a new client and connection per
call, timeouts, errors) is httpx's own.
"""

from __future__ import annotations

import ssl
from contextlib import AbstractContextManager
from typing import Any

import certifi
import httpx

__all__ = [
    "VERIFY",
    "async_client",
    "client",
    "delete",
    "get",
    "head",
    "post",
    "request",
    "stream",
]

#: httpx's default verification (certifi's CA bundle), built once per process.
VERIFY = ssl.create_default_context(cafile=certifi.where())


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, url, verify=VERIFY, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.get(url, verify=VERIFY, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(url, verify=VERIFY, **kwargs)


def head(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.head(url, verify=VERIFY, **kwargs)


def delete(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.delete(url, verify=VERIFY, **kwargs)


def stream(method: str, url: str, **kwargs: Any) -> AbstractContextManager[httpx.Response]:
    return httpx.stream(method, url, verify=VERIFY, **kwargs)


def client(**kwargs: Any) -> httpx.Client:
    return httpx.Client(verify=VERIFY, **kwargs)


def async_client(**kwargs: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(verify=VERIFY, **kwargs)
