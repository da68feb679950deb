"""The gateway's configuration: one pydantic-settings model, read once at start.

Sources, highest precedence first: explicit values (command-line flags),
environment variables (``GATEWAY_`` prefix, ``__`` for nesting), a TOML file
(``--config FILE`` or ``GATEWAY_CONFIG``), then the defaults below. Nothing
else in the package reads the environment.

A mistake is an error at start, never a silent fallback: a ``GATEWAY_*``
variable that names no setting, a complex value that is not JSON, an upstream
URL with an invalid host, a metrics directory that cannot be written, and a
configuration with nothing to front (no route, no ``upstream_url``, and no
``simulator = true``) are all refused with a message naming the key and its
source.
"""

from __future__ import annotations

import contextlib
import difflib
import ipaddress
import json
import os
import re
import tempfile
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from gateway.guard import Protocol
from gateway.protocols import REGISTRY, CredentialStyle, spec_for
from gateway.protocols.sigv4 import AwsKeys, botocore_available
from gateway.redisconn.target import RedisTarget

__all__ = [
    "DEFAULT_RETRY_ON",
    "AwsSigning",
    "ClientConfig",
    "ClientLimits",
    "GatewayLimits",
    "IssuedKeys",
    "PriceOverride",
    "RetryCause",
    "RouteConfig",
    "Settings",
    "TeamConfig",
    "Timeouts",
    "Tracing",
    "UpstreamConfig",
    "UpstreamTimeouts",
    "check_environment",
    "describe_errors",
    "export_for_workers",
    "load_settings",
    "settings_for_worker",
]

#: A route's protocol: one of the registry's, or ``auto`` (by the request path).
ProtocolName = Literal["auto"] | Protocol
#: A route's credential style: one the registry knows, or ``auto`` (by the protocol).
CredentialStyleName = Literal["auto"] | CredentialStyle
_ROUTE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
#: A named client: a bounded metric label.
_CLIENT_NAME = re.compile(r"^[a-z0-9_-]{1,40}$")
#: The client label of requests that no named client made.
ANONYMOUS = "anonymous"
#: Where ``Settings.credentials`` keeps the secrets of the AWS keys issued to named clients
#: (by access key id): no route can have this name.
ISSUED_AWS_KEYS = "@issued-aws-keys"
#: One DNS label, as urlsplit gives it (lower-case); "_" for container service names.
_HOST_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")


def _base_url(value: str) -> str:
    """An upstream base URL: http(s) with a valid host, no trailing slash, maybe a query."""
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ValueError("must not contain spaces or control characters")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:  # a bad IPv6 literal, a port out of range or not a number
        raise ValueError(f"is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("must be an http:// or https:// URL, e.g. https://api.openai.com/v1")
    if not parts.hostname:
        raise ValueError("names no host, e.g. https://api.openai.com/v1")
    problem = _host_problem(parts.hostname)
    if problem:
        raise ValueError(f"has an invalid host {parts.hostname!r}: {problem}")
    if port == 0:
        raise ValueError("port must be between 1 and 65535")
    if parts.fragment:
        raise ValueError("must not have a #fragment")
    path, mark, query = value.partition("?")
    return path.rstrip("/") + mark + query


def _host_problem(host: str) -> str | None:
    """Why ``host`` (as urlsplit returns it: lower-case, no brackets) is no host, or None."""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:
        return "not a valid host name (an empty or over-long label?)"
    labels = ascii_host.removesuffix(".").split(".")
    if len(ascii_host) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
        return "a host name is letters, digits and '-', in labels separated by '.'"
    if all(label.isdigit() for label in labels):
        return "not a valid IPv4 address"
    return None


def _flag(value: object) -> object:
    """A boolean setting is a boolean: TOML's or JSON's ``true``/``false``, or (from an
    environment variable or a flag, where every value is text) the words ``true`` and
    ``false``. ``"yes"``, ``"on"``, ``1`` are refused, never read as true."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"must be true or false (a boolean, not {value!r})")


#: A boolean setting (``_flag``).
Flag = Annotated[bool, BeforeValidator(_flag)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Timeouts(_Strict):
    """Deadlines in seconds (each ends a stream with its own reason)."""

    connect: float = Field(10.0, gt=0, description="TCP/TLS connect to the upstream.")
    first_byte: float = Field(
        300.0,
        gt=0,
        description="Request sent to the first response byte (headers, then first body byte).",
    )
    idle: float = Field(
        120.0, gt=0, description="Longest silence between two upstream chunks (heartbeats count)."
    )
    total: float = Field(3600.0, gt=0, description="Whole request, start to last byte.")
    client_send: float = Field(
        60.0,
        gt=0,
        description="Longest wait for a client to take bytes (client_stalled, connection aborted).",
    )
    client_header: float = Field(
        10.0, gt=0, description="Client edge: to receive a whole request head (408)."
    )
    client_body: float = Field(
        30.0, gt=0, description="Client edge: longest gap between two reads of a body (408)."
    )
    client_body_total: float = Field(
        300.0, gt=0, description="Client edge: to receive a whole request body (408)."
    )
    client_keepalive: float = Field(
        75.0,
        gt=0,
        description="Client edge: an idle keep-alive connection is closed after this "
        "(nginx's keepalive_timeout). Keep it above the clients' own reuse window (the "
        "httpx-based SDKs: 5 s; a load balancer's idle timeout: 60 s), or a request "
        "written just as the gateway closes the connection fails.",
    )


class RouteTimeouts(_Strict):
    """Per-route overrides of the global deadlines; unset fields inherit."""

    connect: float | None = Field(None, gt=0)
    first_byte: float | None = Field(None, gt=0)
    idle: float | None = Field(None, gt=0)
    total: float | None = Field(None, gt=0)


class GatewayLimits(_Strict):
    """The gateway's own byte and concurrency limits, on every request whoever sends it
    (the ``[limits]`` table). A named client's are ``ClientLimits``."""

    max_request_bytes: int = Field(32 * 1024 * 1024, gt=0, description="Request body limit (413).")
    max_buffered_request_bytes: int = Field(
        256 * 1024 * 1024,
        gt=0,
        description="Request body bytes held in memory at once, all requests together (503).",
    )
    max_response_bytes: int = Field(
        1024 * 1024 * 1024, gt=0, description="Streamed response limit (limit_exceeded)."
    )
    max_buffered_answer_bytes: int = Field(
        8 * 1024 * 1024,
        ge=0,
        description="Plain 2xx JSON answers up to this Content-Length are read whole first "
        "(a cut or unparseable one becomes a 502); 0: relay every answer as it arrives.",
    )
    max_line_bytes: int = Field(
        16 * 1024 * 1024, gt=0, description="Longest SSE line (an event stream frame's headers)."
    )
    max_event_bytes: int = Field(
        16 * 1024 * 1024, gt=0, description="Largest SSE event data (an event stream frame)."
    )
    max_partial_event_bytes: int = Field(
        32 * 1024 * 1024,
        gt=0,
        description="What all streams of a worker may hold of events not yet whole, together "
        "(a stream that would pass it ends limit_exceeded).",
    )
    max_concurrent_streams: int | None = Field(
        None, gt=0, description="Global cap on concurrent streams (503 beyond)."
    )
    max_websocket_connections: int | None = Field(
        None, gt=0, description="Global cap on open WebSocket connections (refused beyond)."
    )
    max_header_bytes: int = Field(
        32 * 1024, gt=0, description="Client edge: bytes of a request head (431 beyond)."
    )
    max_header_fields: int = Field(
        100, gt=0, description="Client edge: header fields of a request (431 beyond)."
    )


#: What a failed attempt may be retried on (``routes[].retry_on``): a connect failure or
#: connect timeout, a first-byte timeout, a 429, a 5xx, or an answer that ends or breaks
#: before its first event. ``first_byte_timeout`` is opt-in: the slow upstream may have
#: started (and will bill) the generation the retry asks another one for.
#: ``context_length`` is opt-in too: a 400 saying the prompt is too long, retried on a
#: higher priority tier only (a larger-context model).
RetryCause = Literal["connect", "first_byte_timeout", "429", "5xx", "early_eof", "context_length"]
#: Finish reasons a cached answer may have (never length, content_filter or incomplete).
CacheReason = Literal["stop", "tool_calls"]


def _default_cache_reasons() -> list[CacheReason]:
    return ["stop"]


DEFAULT_RETRY_ON: tuple[RetryCause, ...] = ("connect", "429", "5xx", "early_eof")
#: An upstream's name: a bounded metric label.
_UPSTREAM_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _check_signing(credential_env: str | None, style: str, aws: AwsSigning | None) -> None:
    """An upstream signs with its ``aws`` keys (style ``sigv4`` or ``auto``) or sends
    its ``credential_env``, never both."""
    if aws is not None and credential_env is not None:
        raise ValueError("an upstream has either credential_env or aws (SigV4 keys), not both")
    if aws is not None and style not in ("auto", CredentialStyle.SIGV4):
        raise ValueError(f'aws keys sign requests: credential_style "{style}" sends a key')
    if aws is None and style == CredentialStyle.SIGV4:
        raise ValueError('credential_style "sigv4" needs the upstream\'s aws table')


class AwsSigning(_Strict):
    """An upstream's own AWS credentials (``credential_style = "sigv4"``, Bedrock): where
    its keys are in the environment, and its region. Needs the ``bedrock`` extra."""

    region: str = Field(description="The upstream's AWS region, e.g. us-east-1.")
    access_key_id_env: str = Field(
        "AWS_ACCESS_KEY_ID", description="Environment variable holding the access key id."
    )
    secret_access_key_env: str = Field(
        "AWS_SECRET_ACCESS_KEY", description="Environment variable holding the secret key."
    )
    session_token_env: str | None = Field(
        None, description="Environment variable holding a session token (temporary keys)."
    )

    @field_validator("region")
    @classmethod
    def _signer_installed(cls, value: str) -> str:
        if not botocore_available():
            raise ValueError(
                "aws: signing needs the bedrock extra: pip install 'llm-stream-gateway[bedrock]'"
            )
        return value


class UpstreamTimeouts(_Strict):
    """Per-upstream overrides of the route's deadlines for one attempt; unset fields inherit.

    ``total`` is the request's, across all its attempts: a route key only.
    """

    connect: float | None = Field(None, gt=0)
    first_byte: float | None = Field(None, gt=0)
    idle: float | None = Field(None, gt=0)


class UpstreamConfig(_Strict):
    """One upstream of a route's pool."""

    name: str = Field(description="Metrics and log label of this upstream, unique in its route.")
    url: str = Field(description="Base URL, e.g. https://api.openai.com/v1.")
    credential_env: str | None = Field(
        None, description="Name of an environment variable holding this upstream's credential."
    )
    credential_style: CredentialStyleName = "auto"
    aws: AwsSigning | None = Field(
        None, description="AWS keys and region: the upstream's requests are signed (SigV4)."
    )
    weight: int = Field(1, ge=1, le=10000, description="Share of the load (least outstanding).")
    priority: int = Field(
        0,
        ge=0,
        le=100,
        description="Tier: traffic goes to the lowest tier with an available upstream.",
    )
    continuation: Literal[
        "none", "assistant_prefill", "continue_final_message", "prefix", "regenerate"
    ] = Field(
        "none",
        description="How this upstream continues a partial answer after a cut "
        "(routes with continue_after_cut).",
    )
    models: dict[str, str] = Field(
        default_factory=dict,
        description="Client model name -> the name this upstream wants (rewrites the body); "
        '"*": the name for every model not listed.',
    )
    timeouts: UpstreamTimeouts = UpstreamTimeouts()

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _UPSTREAM_NAME.match(value):
            raise ValueError("must be 1-64 of [A-Za-z0-9_.-]")
        return value

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _base_url(value)

    @model_validator(mode="after")
    def _signing(self) -> UpstreamConfig:
        _check_signing(self.credential_env, self.credential_style, self.aws)
        return self

    @field_validator("models")
    @classmethod
    def _models(cls, value: dict[str, str]) -> dict[str, str]:
        if any(not name or not mapped for name, mapped in value.items()):
            raise ValueError("model names must not be empty")
        return value


class Tracing(_Strict):
    """OpenTelemetry traces (the ``otel`` extra); the exporter, sampler and service name
    come from the SDK's own ``OTEL_*`` variables."""

    enabled: Flag = Field(
        False, description="One span per proxied request, exported over OTLP/HTTP."
    )
    upstream_host: Flag = Field(
        False, description="Put the upstream's host and port in server.address/server.port."
    )

    @field_validator("enabled")
    @classmethod
    def _extra_installed(cls, value: bool) -> bool:
        if value:
            try:
                import opentelemetry.exporter.otlp.proto.http.trace_exporter
                import opentelemetry.sdk.trace  # noqa: F401
            except ImportError:
                raise ValueError(
                    "tracing needs the otel extra: pip install 'llm-stream-gateway[otel]'"
                ) from None
        return value


class RouteConfig(_Strict):
    """One client path prefix mapped to one upstream, or to a pool of upstreams."""

    name: str = Field("default", description="Route name, used as the metrics label.")
    prefix: str = Field("/v1", description="Client path prefix, e.g. /v1 or /anthropic/v1.")
    upstream: str | None = Field(
        None, description="Upstream base URL, e.g. https://api.openai.com/v1 (or upstreams)."
    )
    credential_env: str | None = Field(
        None, description="Name of an environment variable holding the upstream credential."
    )
    credential_style: CredentialStyleName = "auto"
    aws: AwsSigning | None = Field(
        None, description="AWS keys and region: the upstream's requests are signed (SigV4)."
    )
    upstreams: list[UpstreamConfig] = Field(
        default_factory=list, description="A pool of upstreams instead of one upstream."
    )
    protocol: ProtocolName = Field(
        "auto", description="Contract; auto: by the path's last segment."
    )
    require_finish_reason: Flag = True
    termination: Literal["done", "finish"] = Field(
        "done",
        description='How a Chat or Completions stream ends: "done" ([DONE]); "finish": '
        "a clean end once every choice finished, for servers that never send [DONE].",
    )
    inject_include_usage: Flag = False
    timeouts: RouteTimeouts = RouteTimeouts()
    max_concurrent_streams: int | None = Field(None, gt=0)
    default_output_reservation: int = Field(
        1024,
        ge=1,
        description="Output tokens reserved for a limited client's request that names no "
        "max_tokens (replaced by what the answer really cost when it ends).",
    )
    client_key_sha256: list[str] | None = Field(
        None,
        description="SHA-256 hex digests of the client keys this route accepts; "
        "set, it replaces the global list for this route ([] takes no key).",
    )
    capture: Literal["off", "incomplete", "all"] = Field(
        "off",
        description="Write a redacted capture of what the upstream sent: off, for "
        "incomplete streams, or for all streams (gateway/capture/).",
    )
    capture_dir: Path | None = Field(None, description="Directory of the capture files.")
    capture_max_bytes: int = Field(
        1024 * 1024, ge=4096, description="Largest capture file; a longer stream is cut."
    )
    capture_max_files: int = Field(
        100, ge=1, description="Capture files kept in capture_dir; the oldest go first."
    )
    max_attempts: int = Field(
        2, ge=1, le=10, description="Attempts per request, each on another upstream of the pool."
    )
    retry_on: list[RetryCause] = Field(
        default_factory=lambda: list(DEFAULT_RETRY_ON),
        description="What a failed attempt is retried on, before any byte reached the client.",
    )
    eject_after: int = Field(5, ge=1, description="Consecutive failures that eject an upstream.")
    eject_base_seconds: float = Field(
        30.0, gt=0, description="First ejection's length; doubles with each ejection."
    )
    eject_max_seconds: float = Field(300.0, gt=0, description="Longest ejection.")
    max_ejected_percent: int = Field(
        50, ge=0, le=100, description="At most this share of a pool is ejected (never all)."
    )
    retry_backoff_seconds: float = Field(
        0.25,
        gt=0,
        le=2,
        description="Wait before a retry on the same upstream; doubles, at most 2 s.",
    )
    continue_after_cut: Flag = Field(
        False,
        description="A stream cut after some text reached the client is continued by an "
        "upstream that can (its continuation key), as the same stream.",
    )
    max_continuations: int = Field(
        1, ge=0, le=5, description="Continuations of one answer, at most."
    )
    max_retry_after_seconds: float = Field(
        5.0,
        ge=0,
        description="A Retry-After up to this is waited out on the same upstream; "
        "a longer one sends the retry to the next tier.",
    )
    # -- structured outputs (docs/structured-outputs.md) --
    schema_check: Literal["off", "record", "end", "hold"] = Field(
        "record",
        description="What a structured answer or tool call that breaks the request's schema "
        'does: "record" (the verdict in the trailer, the log and the metrics; bytes '
        'unchanged), "end" (the stream ends at the violating event with the protocol\'s '
        'error event, reason schema_mismatch), "hold" (nothing of the answer goes out '
        'until it validated: a violation takes the next upstream, as a retry), "off".',
    )
    schema_hold_max_bytes: int = Field(
        256 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        description='With schema_check = "hold": the most of one answer held before it '
        "validated; past it the stream ends with limit_exceeded.",
    )
    schema_hold_seconds: float = Field(
        60.0,
        gt=0,
        description='With schema_check = "hold": the longest an answer is held before it '
        "validated; past it the stream ends with limit_exceeded.",
    )
    schema_max_answer_bytes: int = Field(
        1024 * 1024,
        gt=0,
        le=64 * 1024 * 1024,
        description="The most of one structured answer or tool call the end check holds; "
        "a larger one is unchecked.",
    )
    # -- resumable streams (docs/resume.md) --
    resume: Flag = Field(
        False,
        description="Log each stream's events so that a client can resume it "
        "(GET {prefix}/gateway/streams/{id}).",
    )
    resume_ttl_seconds: float = Field(
        600.0, gt=0, description="How long a stream's log is kept after its last write."
    )
    resume_max_bytes: int = Field(
        8 * 1024 * 1024,
        gt=0,
        description="The most of one stream the log keeps; a resume beyond it gets 410.",
    )
    detach_max_seconds: float = Field(
        600.0, gt=0, description="How long the upstream is read on after its client left."
    )
    on_client_disconnect: Literal["finish", "cancel"] | None = Field(
        None,
        description='A client that leaves a stream: "finish" reads the answer on into the '
        'log, "cancel" closes the upstream (default: finish with resume, else cancel).',
    )
    cache: Flag = Field(
        False,
        description="Cache answers verified whole, replayed byte for byte (docs/caching.md).",
    )
    cache_ttl_seconds: float = Field(3600.0, gt=0, description="How long an entry is served.")
    cache_max_entry_bytes: int = Field(
        1024 * 1024, ge=1024, description="Largest answer stored; a longer one is not."
    )
    cache_reasons: list[CacheReason] = Field(
        default_factory=_default_cache_reasons,
        min_length=1,
        description='Finish reasons an entry may have: "stop", "tool_calls".',
    )
    cache_scope: Literal["client", "route"] = Field(
        "client",
        description='"client": entries only for the client (or credential) that made them; '
        '"route": shared by every client of the route.',
    )
    cache_namespace: str = Field(
        "", max_length=200, description="Part of every key: change it to drop every entry."
    )

    @field_validator("client_key_sha256")
    @classmethod
    def _hashes(cls, value: list[str] | None) -> list[str] | None:
        return value if value is None else _sha256_list(value)

    @property
    def detaches(self) -> bool:
        """Whether a client that leaves a stream leaves its generation running."""
        return self.resume and (self.on_client_disconnect or "finish") == "finish"

    @model_validator(mode="after")
    def _finish_needs_resume(self) -> RouteConfig:
        if self.on_client_disconnect == "finish" and not self.resume:
            raise ValueError(
                'on_client_disconnect = "finish" needs resume = true (the answer is read '
                "on into the stream's log, for the client to resume)"
            )
        return self

    @model_validator(mode="after")
    def _continued_protocol(self) -> RouteConfig:
        # Only a protocol that declares it (ProtocolSpec.continuable) is continued.
        if (
            self.continue_after_cut
            and self.protocol != "auto"
            and not spec_for(self.protocol).continuable
        ):
            names = ", ".join(spec.name for spec in REGISTRY if spec.continuable)
            raise ValueError(
                f"continue_after_cut: a {self.protocol} stream is never continued "
                f"(streams of {names} are)"
            )
        return self

    @model_validator(mode="after")
    def _capture_dir(self) -> RouteConfig:
        if self.capture != "off":
            if self.capture_dir is None:
                raise ValueError(f'capture = "{self.capture}" needs capture_dir (a directory)')
            _check_writable_directory(self.capture_dir)
        return self

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _ROUTE_NAME.match(value):
            raise ValueError("must be 1-64 of [A-Za-z0-9_.-] starting with a letter or _")
        return value

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not value.startswith("/") or value != "/" + "/".join(
            p for p in value.split("/") if p not in ("", ".", "..")
        ):
            raise ValueError("must look like /v1 (absolute, no trailing slash, no . or ..)")
        return value

    @field_validator("upstream")
    @classmethod
    def _upstream(cls, value: str | None) -> str | None:
        return value if value is None else _base_url(value)

    @model_validator(mode="after")
    def _signing(self) -> RouteConfig:
        _check_signing(self.credential_env, self.credential_style, self.aws)
        signs = self.aws is not None or any(u.aws is not None for u in self.upstreams)
        if signs and self.protocol != "auto" and spec_for(self.protocol).signing_service is None:
            raise ValueError(
                f"aws: a {self.protocol} route's requests are not signed (AWS keys sign the "
                "requests of a protocol that names its service, bedrock)"
            )
        return self

    @model_validator(mode="after")
    def _one_form(self) -> RouteConfig:
        """Either ``upstream`` (with its credential keys) or ``upstreams``, never both."""
        if self.upstream is not None and self.upstreams:
            raise ValueError(
                "a route has either upstream or upstreams, not both: "
                "put this upstream in the upstreams list"
            )
        if self.upstream is None and not self.upstreams:
            raise ValueError("a route needs an upstream (a base URL) or upstreams (a pool)")
        if self.upstreams and (
            self.credential_env is not None
            or self.credential_style != "auto"
            or self.aws is not None
        ):
            raise ValueError(
                "credential_env, credential_style and aws belong to each of the route's "
                "upstreams when it has upstreams"
            )
        names = [u.name for u in self.upstreams]
        if len(set(names)) != len(names):
            raise ValueError("the names of a route's upstreams must be unique")
        if self.eject_max_seconds < self.eject_base_seconds:
            raise ValueError("eject_max_seconds must not be below eject_base_seconds")
        return self

    def pool(self) -> list[UpstreamConfig]:
        """The route's upstreams: ``upstreams``, or the one ``upstream`` named after the route."""
        if self.upstreams:
            return list(self.upstreams)
        assert self.upstream is not None
        return [
            UpstreamConfig(
                name=self.name,
                url=self.upstream,
                credential_env=self.credential_env,
                credential_style=self.credential_style,
                aws=self.aws,
            )
        ]


class ClientLimits(_Strict):
    """A named client's limits (all of it, or one route's or one model's share)."""

    requests_per_minute: int | None = Field(None, gt=0, description="Requests a UTC minute.")
    tokens_per_minute: int | None = Field(
        None, gt=0, description="Input + output tokens a UTC minute."
    )
    tokens_per_day: int | None = Field(None, gt=0, description="Token budget a UTC day.")
    tokens_per_month: int | None = Field(None, gt=0, description="Token budget a UTC month.")
    max_concurrent_streams: int | None = Field(None, gt=0, description="Streams at once.")
    usd_per_day: Decimal | None = Field(
        None, gt=0, decimal_places=9, description="Money budget a UTC day, in USD."
    )
    usd_per_month: Decimal | None = Field(
        None, gt=0, decimal_places=9, description="Money budget a calendar month (UTC), in USD."
    )
    usd_total: Decimal | None = Field(
        None, gt=0, decimal_places=9, description="Money budget in all, in USD (never resets)."
    )

    def any(self) -> bool:
        return any(v is not None for v in self.model_dump().values())


class TeamConfig(_Strict):
    """A team: named clients (each names it as its ``team``) that share its limits,
    checked with each client's own."""

    name: str = Field(description="Label in metrics, receipts and the spend report.")
    limits: ClientLimits = ClientLimits()

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _CLIENT_NAME.match(value):
            raise ValueError("must be 1-40 of [a-z0-9_-]")
        return value


class PriceOverride(_Strict):
    """A price the table lacks or that was negotiated (``[[prices]]``): for a model (or
    ``"*"``) on an upstream, a route or a client, in USD a million tokens; or the
    table's prices of another ``provider`` for it."""

    model: str = Field(min_length=1, description='The model as requested, or "*" for any.')
    upstream: str | None = Field(None, description="Only on this upstream (by name).")
    route: str | None = Field(None, description="Only on this route.")
    client: str | None = Field(None, description="Only for this named client.")
    provider: str | None = Field(
        None, description="Price it as this genai-prices provider's model (e.g. azure, groq)."
    )
    input: Decimal | None = Field(None, ge=0, description="USD a million input tokens.")
    output: Decimal | None = Field(None, ge=0, description="USD a million output tokens.")
    cache_read: Decimal | None = Field(
        None, ge=0, description="USD a million cached input tokens read (default: input)."
    )
    cache_write: Decimal | None = Field(
        None, ge=0, description="USD a million input tokens written to a cache (default: input)."
    )
    reasoning: Decimal | None = Field(
        None, ge=0, description="USD a million reasoning tokens (default: output)."
    )

    @model_validator(mode="after")
    def _either(self) -> PriceOverride:
        priced = self.input is not None, self.output is not None
        if any(priced) and not all(priced):
            raise ValueError("a price override gives both input and output")
        if all(priced) == (self.provider is not None):
            raise ValueError("a price override gives input and output prices, or a provider")
        return self

    @property
    def label(self) -> str:
        where = [
            f"{k}={v}"
            for k, v in (
                ("client", self.client),
                ("route", self.route),
                ("upstream", self.upstream),
            )
            if v
        ]
        return " ".join([self.model, *where])


class IssuedAwsKey(_Strict):
    """An AWS access key pair the gateway issued to a named client: requests it signs
    (SigV4) are that client's. The secret stays in the environment; never forwarded."""

    access_key_id: str = Field(min_length=16, max_length=128, pattern=r"^[A-Z0-9]+$")
    secret_access_key_env: str = Field(
        description="Environment variable holding the pair's secret access key."
    )


class IssuedKeys(_Strict):
    """Keys issued at run time (``gateway.keys``): where they live and how fast every
    replica learns of a change."""

    store: Literal["off", "memory", "redis"] = Field(
        "off",
        description='"memory": this process only, lost at restart; "redis": redis_url, '
        "shared by every worker and replica; off: no keys issued at run time.",
    )
    refresh_seconds: float = Field(
        0.5,
        gt=0,
        le=1,
        description="How often a replica checks the keys' version (besides Redis pub/sub).",
    )
    last_used_seconds: float = Field(
        60.0, gt=0, description="How often each process writes the keys' last use."
    )
    max_keys: int = Field(100_000, gt=0, description="The most keys the store holds.")
    max_metadata_bytes: int = Field(
        4096, gt=0, le=65536, description="Largest metadata of a key, as JSON bytes (413)."
    )
    rotation_overlap_seconds: float = Field(
        3600.0,
        ge=0,
        le=30 * 86400,
        description="How long a rotated key's old secret still works, unless the call says.",
    )


class ClientConfig(_Strict):
    """A named client: its keys, the routes it may use, its limits."""

    name: str = Field(description="Label in metrics, the access log and traces.")
    key_sha256: list[str] = Field(
        min_length=1, description="SHA-256 hex digests of its keys (several: rotation)."
    )
    aws_keys: list[IssuedAwsKey] = Field(
        default_factory=list,
        description="AWS key pairs issued to it: a request it signs with one (SigV4, "
        "Bedrock's clients) is its own, verified and never forwarded.",
    )
    routes: list[str] | None = Field(
        None, description="Routes it may use; default: every route that accepts keys."
    )
    limits: ClientLimits = ClientLimits()
    route_limits: dict[str, ClientLimits] = Field(
        default_factory=dict, description="Limits on its use of one route, by route name."
    )
    model_limits: dict[str, ClientLimits] = Field(
        default_factory=dict, description="Limits on its use of one model, by model name."
    )
    budget_enforcement: Literal["estimate", "strict"] = Field(
        "estimate",
        description='Token limits: "estimate" reserves an estimate (may overshoot); '
        '"strict" reserves an upper bound and caps the request\'s output at what is left.',
    )
    max_websocket_connections: int | None = Field(
        None, gt=0, description="Its WebSocket connections open at once (beyond: refused)."
    )
    cache_admin: Flag = Field(
        False, description="May delete its own cache entries (DELETE .../gateway/cache/{key})."
    )
    keys_admin: Flag = Field(
        False,
        description="May issue, list, rotate and revoke keys (the admin API "
        "{prefix}/gateway/keys); it sees the keys it issued.",
    )
    team: str | None = Field(
        None, description="The team (``[[teams]]``) whose limits it shares, checked with its own."
    )
    spend_admin: bool = Field(
        False, description="Sees every client's spend in GET .../gateway/spend (else its own)."
    )
    unpriced: Literal["refuse", "allow"] = Field(
        "refuse",
        description='Under a money budget, a model nothing prices: "refuse" (400 naming it) '
        'or "allow" (served, charged nothing and labelled unpriced).',
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _CLIENT_NAME.match(value) or value == ANONYMOUS:
            raise ValueError(f"must be 1-40 of [a-z0-9_-], and not {ANONYMOUS!r}")
        return value

    @field_validator("key_sha256")
    @classmethod
    def _hashes(cls, value: list[str]) -> list[str]:
        return _sha256_list(value)

    def limited(self) -> bool:
        return (
            self.limits.any()
            or any(v.any() for v in self.route_limits.values())
            or any(v.any() for v in self.model_limits.values())
        )


class Settings(BaseSettings):
    """Everything the gateway can be told. See config/gateway.example.toml."""

    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    config: Path | None = Field(None, description="TOML file with more settings.")
    upstream_url: str | None = Field(
        None, description="Shorthand for a single route: /v1 -> this base URL."
    )
    simulator: Flag = Field(
        False,
        description="Front the built-in simulator (a fake provider) instead of an upstream.",
    )
    host: str = Field("127.0.0.1", min_length=1, description="Listen address.")
    port: int = Field(8080, ge=0, le=65535)
    workers: int = Field(1, ge=1, le=64)
    routes: list[RouteConfig] = Field(default_factory=list)
    timeouts: Timeouts = Timeouts()
    limits: GatewayLimits = GatewayLimits()
    annotate: Flag = Field(True, description="Append the complete/incomplete annotation.")
    access_log: Flag = Field(
        True, description="One JSON line per request under a route prefix, on stdout."
    )
    uvicorn_access_log: Flag = False
    drain_timeout: float = Field(
        30.0, ge=0, description="Seconds in-flight streams get on SIGTERM."
    )
    metrics_dir: Path | None = Field(
        None, description="prometheus-client multiprocess directory (emptied at start)."
    )
    model_labels: list[str] = Field(
        default_factory=list,
        description="Models allowed as metric labels; empty: the first max_model_labels seen.",
    )
    max_model_labels: int = Field(50, ge=1, le=1000)
    client_key_sha256: list[str] = Field(
        default_factory=list,
        description="SHA-256 hex digests of accepted client keys (routes may set their own).",
    )
    allow_unauthenticated: Flag = Field(
        False,
        description="Allow listening beyond loopback with a route credential and no client keys.",
    )
    clients: list[ClientConfig] = Field(
        default_factory=list, description="Named clients: keys, routes, limits."
    )
    teams: list[TeamConfig] = Field(
        default_factory=list, description="Teams of named clients, with limits they share."
    )
    prices: list[PriceOverride] = Field(
        default_factory=list,
        description="Price overrides: negotiated rates, self-hosted models (over the table).",
    )
    receipts_ttl_seconds: float = Field(
        604800.0, gt=0, description="How long a request's receipt is kept (7 days)."
    )
    receipts_max: int = Field(
        100000, ge=1, description="Receipts the memory ledger keeps at most (oldest dropped)."
    )
    spend_retention_days: int = Field(
        400, ge=1, le=3660, description="Days of the spend report's totals kept."
    )
    limits_backend: Literal["memory", "redis"] = Field(
        "memory", description="Where the clients' counters live: this process, or Redis."
    )
    redis_url: str | None = Field(
        None,
        description="redis:// or rediss:// URL of the limits backend and the stream store "
        "(password and TLS options in it); sentinel and cluster modes take its scheme, "
        "credentials and options, and the nodes from redis_nodes.",
    )
    redis_mode: Literal["standalone", "sentinel", "cluster"] = Field(
        "standalone",
        description="How Redis is deployed: one server (redis_url), a Sentinel set "
        "(redis_nodes, redis_service) or a Cluster (redis_nodes as seeds).",
    )
    redis_nodes: list[str] = Field(
        default_factory=list,
        description="host:port of the sentinels (sentinel) or of more cluster seed nodes "
        "(cluster; redis_url's host is one too).",
    )
    redis_service: str | None = Field(
        None, description="The Sentinel service (master) name (sentinel mode)."
    )
    redis_sentinel_password: SecretStr | None = Field(
        None, description="The sentinels' own password, when they have one (sentinel mode)."
    )
    limits_timeout: float = Field(
        0.05, gt=0, le=10, description="Longest wait on the limits backend, in seconds."
    )
    on_backend_error: Literal["allow", "deny"] = Field(
        "allow", description="Limits backend unreachable or slow: serve anyway, or 503."
    )
    stream_store: Literal["memory", "redis"] = Field(
        "memory",
        description="Where stream logs live (resumable streams, the response cache): this "
        "process, or Redis (redis_url) shared by every worker and replica.",
    )
    stream_store_max_bytes: int = Field(
        256 * 1024 * 1024, gt=0, description="The most the stream store holds, in bytes."
    )
    stream_store_timeout: float = Field(
        1.0, gt=0, le=30, description="Longest wait on the Redis stream store, in seconds."
    )
    stream_lease_seconds: float = Field(
        5.0,
        gt=0,
        le=300,
        description="A stream's writer renews its lease this often (a third); a stream "
        "whose lease ran out with no end is taken over (owner_lost).",
    )
    limits_per_worker: Flag = Field(
        False,
        description="Memory backend with several workers: each enforces limits divided by N.",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="CIDRs of proxies whose X-Forwarded-* headers are believed; empty: none.",
    )
    max_ws_message_bytes: int = Field(
        16 * 1024 * 1024,
        gt=0,
        description="Largest WebSocket message either way (close 1009 beyond).",
    )
    ws_max_connection_seconds: float = Field(
        3600.0, gt=0, description="Longest life of a WebSocket connection (close 1000)."
    )
    ws_idle_seconds: float = Field(
        300.0,
        gt=0,
        description="Longest wait for the next response.create between responses (close 1000).",
    )
    ws_max_client_messages_per_second: int = Field(
        50, gt=0, description="Client messages (and pings) per second on a WebSocket (1008)."
    )
    ws_ping_interval_seconds: float = Field(
        20.0, gt=0, description="Keepalive pings to a quiet WebSocket client (1011 unanswered)."
    )
    upstream_transport: Literal["aiohttp", "httpx"] = "aiohttp"
    upstream_max_connections: int = Field(10000, ge=1)
    upstream_keepalive_seconds: float = Field(
        4.0,
        gt=0,
        description="An idle upstream connection is reused within this time, then closed: "
        "keep it below the upstream's own keep-alive (uvicorn, vLLM, Node: 5 s), or a "
        "request sent as the upstream closes the connection fails (502 upstream_disconnect).",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["text", "json"] = Field(
        "text",
        description="The process log on stderr: timestamped text lines, or one JSON object each.",
    )
    tracing: Tracing = Tracing()
    keys: IssuedKeys = IssuedKeys()
    status_page: Flag = Field(
        False,
        description="Serve GET /status: to loopback clients, or with a global client key.",
    )
    credentials: dict[str, dict[str, SecretStr]] = Field(
        default_factory=dict,
        exclude=True,
        description="Resolved upstream credentials by route, then upstream name (internal).",
    )

    @field_validator("client_key_sha256")
    @classmethod
    def _hashes(cls, value: list[str]) -> list[str]:
        return _sha256_list(value)

    @field_validator("trusted_proxies")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        networks = []
        for cidr in value:
            try:
                networks.append(str(ipaddress.ip_network(cidr.strip())))
            except ValueError as exc:
                raise ValueError(f"{cidr!r} is not an address or CIDR: {exc}") from None
        return networks

    @field_validator("upstream_url")
    @classmethod
    def _upstream_url(cls, value: str | None) -> str | None:
        return _base_url(value) if value else value

    @field_validator("metrics_dir")
    @classmethod
    def _metrics_dir(cls, value: Path | None) -> Path | None:
        if value is not None:
            _check_writable_directory(value)
        return value

    @model_validator(mode="after")
    def _unique_routes(self) -> Settings:
        if self.upstream_url and self.routes:
            raise ValueError(
                "upstream_url (--upstream, GATEWAY_UPSTREAM_URL) and routes are both set: "
                "the shorthand would be ignored; configure one or the other"
            )
        names = [r.name for r in self.routes]
        prefixes = [r.prefix for r in self.routes]
        if len(set(names)) != len(names):
            raise ValueError("route names must be unique")
        if len(set(prefixes)) != len(prefixes):
            raise ValueError("route prefixes must be unique")
        open_routes = [
            r.name
            for r in self.effective_routes()
            if any(u.credential_env for u in r.pool())
            and not (self.client_key_sha256 if r.client_key_sha256 is None else r.client_key_sha256)
        ]
        if open_routes and not self.allow_unauthenticated and not _is_loopback(self.host):
            raise ValueError(
                f"host {self.host} is beyond loopback and route(s) {', '.join(open_routes)} "
                "spend an upstream credential with no client key: anyone who can reach the "
                "port would spend it. Set client_key_sha256 (globally or on the route), or "
                "allow_unauthenticated = true (GATEWAY_ALLOW_UNAUTHENTICATED=true) if that "
                "is intended"
            )
        return self

    @model_validator(mode="after")
    def _clients(self) -> Settings:
        """Unique names, one owner per key, known routes, and a backend that can count."""
        names = [c.name for c in self.clients]
        if len(set(names)) != len(names):
            raise ValueError("client names must be unique")
        routes = {r.name for r in self.effective_routes()}
        owner: dict[str, str] = {}
        listed = set(self.client_key_sha256).union(
            *(r.client_key_sha256 or () for r in self.effective_routes())
        )
        for client in self.clients:
            for digest in client.key_sha256:
                if digest in owner:
                    raise ValueError(
                        f"clients {owner[digest]} and {client.name} share a key: "
                        "a key belongs to one client"
                    )
                if digest in listed:
                    raise ValueError(
                        f"a key of client {client.name} is also in a client_key_sha256 list: "
                        "list it in one place (the client's key_sha256)"
                    )
                owner[digest] = client.name
            unknown = sorted(set(client.routes or ()).union(client.route_limits).difference(routes))
            if unknown:
                raise ValueError(
                    f"client {client.name} names route(s) {', '.join(unknown)} that do not exist"
                )
        teams = {t.name: t for t in self.teams}
        if len(teams) != len(self.teams):
            raise ValueError("team names must be unique")
        for client in self.clients:
            if client.team is not None and client.team not in teams:
                raise ValueError(
                    f"client {client.name} names team {client.team} that does not exist"
                )
        limited = any(
            c.limited() or (c.team is not None and teams[c.team].limits.any()) for c in self.clients
        )
        if self.limits_backend == "redis" and self.redis_url is None:
            raise ValueError('limits_backend = "redis" needs redis_url (redis:// or rediss://)')
        if self.redis_url is not None:
            self.redis_target()  # raises ValueError naming the wrong key
        elif self.redis_mode != "standalone" or self.redis_nodes:
            raise ValueError(
                f'redis_mode = "{self.redis_mode}" needs redis_url (its scheme, '
                "password and TLS options)"
            )
        if self.keys.store == "redis" and self.redis_url is None:
            raise ValueError('keys.store = "redis" needs redis_url (redis:// or rediss://)')
        if self.keys.store == "memory" and self.workers > 1:
            raise ValueError(
                f'workers = {self.workers} with keys.store = "memory": a key issued by one '
                'worker would be unknown to the others. Use keys.store = "redis"'
            )
        if self.stream_store == "redis" and self.redis_url is None:
            raise ValueError('stream_store = "redis" needs redis_url (redis:// or rediss://)')
        resumable = [r.name for r in self.routes if r.resume]
        if resumable and self.stream_store == "memory" and self.workers > 1:
            raise ValueError(
                f'workers = {self.workers} with stream_store = "memory" and resume on route(s) '
                f"{', '.join(resumable)}: a stream kept by one worker could not be resumed "
                'on another. Use stream_store = "redis" (with redis_url)'
            )
        if (
            limited
            and self.limits_backend == "memory"
            and self.workers > 1
            and not self.limits_per_worker
        ):
            raise ValueError(
                f'workers = {self.workers} with limits_backend = "memory": each worker '
                "would count alone and admit up to N times every limit. Use "
                'limits_backend = "redis", or limits_per_worker = true (each worker enforces '
                "every limit divided by the number of workers)"
            )
        return self

    @model_validator(mode="after")
    def _something_to_front(self) -> Settings:
        """The simulator only when asked, and never beside a real upstream."""
        if self.simulator and (self.upstream_url or self.routes):
            raise ValueError(
                "simulator (--simulator, GATEWAY_SIMULATOR) and an upstream (upstream_url or "
                "routes) are both set: the gateway fronts either the built-in fake provider "
                "or real upstreams; configure one or the other"
            )
        if not (self.simulator or self.upstream_url or self.routes):
            raise ValueError(
                "no upstream configured: set upstream_url (--upstream URL, "
                "GATEWAY_UPSTREAM_URL) or [[routes]] (in the --config file, or GATEWAY_ROUTES); "
                "or, to try the gateway with the built-in fake provider, pass --simulator "
                "(simulator = true, GATEWAY_SIMULATOR=true)"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        toml_path = _config_path(init_settings, env_settings)
        if toml_path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_path))
        return tuple(sources)

    def redis_target(self) -> RedisTarget | None:
        """Where Redis is (every user of Redis builds its client from this), or None."""
        if self.redis_url is None:
            return None
        password = self.redis_sentinel_password
        return RedisTarget.build(
            self.redis_mode,
            self.redis_url,
            self.redis_nodes,
            self.redis_service,
            password.get_secret_value() if password is not None else None,
        )

    def effective_routes(self) -> list[RouteConfig]:
        """The configured routes, or the one-line ``upstream_url`` shorthand as ``/v1``."""
        if self.routes:
            return list(self.routes)
        if self.upstream_url:
            return [RouteConfig(name="default", prefix="/v1", upstream=self.upstream_url)]
        return []

    def route_timeouts(self, route: RouteConfig) -> Timeouts:
        overrides = {k: v for k, v in route.timeouts.model_dump().items() if v is not None}
        return self.timeouts.model_copy(update=overrides)


def _check_writable_directory(path: Path) -> None:
    """Raise ValueError unless ``path`` is, or can be created as, a writable directory.

    Probes by creating (and removing) a temporary entry, because permission bits
    do not tell (root may write anywhere, except where the kernel says no).
    """
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "it" if existing == path else existing
        raise ValueError(f"{path} is not a directory: {where} is a file")
    try:
        if existing == path:
            with tempfile.TemporaryFile(dir=path):
                pass
        else:
            os.rmdir(tempfile.mkdtemp(dir=existing))
    except OSError as exc:
        target = "write in" if existing == path else f"create directories in {existing} for"
        raise ValueError(f"cannot {target} {path}: {exc.strerror or exc}") from None


def _sha256_list(value: list[str]) -> list[str]:
    for digest in value:
        if not _SHA256_HEX.match(digest):
            raise ValueError("each entry must be 64 lower-case hex digits (a SHA-256)")
    return value


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def _config_path(*sources: PydanticBaseSettingsSource) -> Path | None:
    for source in sources:
        value = source().get("config")
        if value:
            path = Path(value)
            if not path.is_file():
                raise FileNotFoundError(f"config file not found: {path}")
            return path
    return None


_ENV_PREFIX = "GATEWAY_"
_ENV_DELIMITER = "__"
#: Variables the package sets for itself (the parent process, for its workers).
_INTERNAL_VARIABLES = frozenset({"GATEWAY_WORKER_SETTINGS"})
#: Fields that are no setting of their own: filled from other variables at load.
_NOT_FROM_ENVIRONMENT = frozenset({"credentials"})


def _environment_names() -> dict[str, Any]:
    """Every ``GATEWAY_*`` name the settings read, mapped to its field's annotation.

    Derived from the model (nested models through ``__``), so a new field is
    known the moment it exists.
    """
    names: dict[str, Any] = {}

    def walk(prefix: str, fields: Mapping[str, Any]) -> None:
        for key, field in fields.items():
            name = prefix + key.upper()
            names[name] = field.annotation
            model = _model_in(field.annotation)
            if model is not None:
                walk(name + _ENV_DELIMITER, model.model_fields)

    walk(
        _ENV_PREFIX,
        {k: f for k, f in Settings.model_fields.items() if k not in _NOT_FROM_ENVIRONMENT},
    )
    return names


def _union_members(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    for member in _union_members(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member
    return None


def _json_kind(annotation: Any) -> str | None:
    """What JSON a variable for this annotation must hold (None: a plain string)."""
    for member in _union_members(annotation):
        origin = typing.get_origin(member) or member
        if origin in (list, tuple, set, frozenset):
            return "a JSON array"
        if origin is dict or _model_in(member) is not None:
            return "a JSON object"
    return None


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuse ``GATEWAY_*`` variables that name no setting, and complex values that are
    not JSON, each by its name (pydantic-settings ignores the first and names only the
    field for the second).
    """
    known = _environment_names()
    suffixes = {name.removeprefix(_ENV_PREFIX): name for name in known}
    problems: list[str] = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(_ENV_PREFIX) or upper in _INTERNAL_VARIABLES:
            continue
        if upper not in known:
            close = difflib.get_close_matches(upper.removeprefix(_ENV_PREFIX), suffixes, 1, 0.6)
            if upper.startswith(("GATEWAY_SERVICE_", "GATEWAY_PORT_")):
                hint = (
                    "Kubernetes sets it for a Service named gateway: "
                    "set enableServiceLinks: false in the pod spec"
                )
            elif close:
                hint = f"did you mean {suffixes[close[0]]}?"
            else:
                hint = "no setting has a similar name; see config/gateway.example.toml"
            problems.append(f"environment variable {name} is not a setting ({hint})")
            continue
        kind = _json_kind(known[upper])
        if kind is None:
            continue
        try:
            json.loads(environ[name])
        except json.JSONDecodeError as exc:
            problems.append(f"environment variable {name} must be {kind}, but is not JSON: {exc}")
    if problems:
        raise ValueError("\n  ".join(problems))


def _environment_origin(loc: list[str]) -> str | None:
    """The variable a value at ``loc`` came from: the longest ``GATEWAY_A__B`` set."""
    present = {name.upper(): name for name in os.environ}
    for end in range(len(loc), 0, -1):
        name = _ENV_PREFIX + _ENV_DELIMITER.join(p.upper() for p in loc[:end])
        if name in present:
            return present[name]
    return None


def describe_errors(
    exc: ValidationError, config: str | None = None, flags: Mapping[str, str] | None = None
) -> str:
    """A precise, multi-line message: which key, where it came from, why.

    ``flags`` maps dotted keys given on the command line to the flag that set them.
    """
    config = config or os.environ.get("GATEWAY_CONFIG")
    flags = flags or {}
    lines = ["invalid configuration:"]
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = key_path(err["loc"])
        flag = next((flags[k] for k in _prefixes(loc) if k in flags), None)
        env_name = _environment_origin(loc)
        unknown = err["type"] == "extra_forbidden"
        if flag:
            origin = f" (command-line flag {flag})"
        elif env_name:
            origin = f" (environment variable {env_name})"
        elif config and loc:
            # an unknown key is never a default: it can only come from the file
            in_file = unknown or _in_values(_config_values(config), err["loc"])
            origin = f" (config file {config})" if in_file else " (default)"
        elif loc:
            origin = " (default)"
        else:
            origin = ""
        error = err.get("ctx", {}).get("error")
        if unknown:
            message = f"is not a setting ({_unknown_key_hint(err['loc'])})"
        elif err["type"] == "value_error" and error:
            message = str(error)
        else:
            message = err["msg"] + _allowed_value_hint(err)
        lines.append(f"  {key}{origin}: {message}" if key else f"  {message}")
    return "\n".join(lines)


def key_path(loc: Sequence[int | str]) -> str:
    """A location as the one key-path notation of every error: ``routes[0].max_attempts``."""
    path = ""
    for part in loc:
        if isinstance(part, int) or (isinstance(part, str) and part.isdigit()):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def _model_at(loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The settings model that holds the last key of ``loc`` (list indexes skipped)."""
    model: type[BaseModel] | None = Settings
    for part in loc[:-1]:
        if isinstance(part, int) or (isinstance(part, str) and part.isdigit()):
            continue
        if model is None or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
        model = _model_in(annotation)
        if model is None:
            for member in _union_members(annotation):
                for arg in typing.get_args(member):
                    model = model or _model_in(arg)
    return model


def _unknown_key_hint(loc: Sequence[int | str]) -> str:
    """``did you mean …?`` for a mistyped key, as for a mistyped ``GATEWAY_*`` variable."""
    model = _model_at(loc)
    known = [k for k in model.model_fields if k not in _NOT_FROM_ENVIRONMENT] if model else []
    close = difflib.get_close_matches(str(loc[-1]), known, 1, 0.6)
    if close:
        return f"did you mean {key_path([*loc[:-1], close[0]])}?"
    return "no setting has a similar name; see config/gateway.example.toml"


def _allowed_value_hint(err: Any) -> str:
    """`` (did you mean '5xx'?)`` for a value close to one of a closed list's, as a
    mistyped key gets (``_unknown_key_hint``)."""
    if err["type"] not in ("literal_error", "enum") or not isinstance(err.get("input"), str):
        return ""
    allowed = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
    close = difflib.get_close_matches(err["input"], allowed, 1, 0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _prefixes(loc: list[str]) -> list[str]:
    """``a.b.c``, ``a.b``, ``a``: the dotted keys that contain ``loc``, longest first."""
    return [".".join(loc[:end]) for end in range(len(loc), 0, -1)]


def _config_values(config: str | None) -> dict[str, Any]:
    """The TOML file's keys and values; nothing when it cannot be read (loading the
    settings says why)."""
    if not config:
        return {}
    try:
        return tomllib.loads(Path(config).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}


def _in_values(values: Any, loc: Sequence[int | str]) -> bool:
    """Whether ``loc`` (an error's location) names something written in ``values``.

    Parts of ``loc`` that are no key (pydantic's name of a union member or a validator,
    ``function-after[...]``) are stepped over."""
    for part in loc:
        if isinstance(values, list) and isinstance(part, int) and 0 <= part < len(values):
            values = values[part]
        elif isinstance(values, dict) and str(part) in values:
            values = values[str(part)]
        elif not (isinstance(part, str) and part.isidentifier()):
            continue
        else:
            return False
    return True


def _leaves(prefix: str, value: Any) -> list[str]:
    """The dotted keys of the values in ``value``: a table's keys one by one, a list or a
    scalar as one key."""
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(f"{prefix}.{k}", v)]
    return [prefix]


def setting_sources(
    config: str | None = None, flags: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Where each setting given anywhere came from, by dotted key: ``config file PATH``,
    ``environment variable GATEWAY_…`` or ``command-line flag --…`` (``flags`` maps the
    dotted keys the command line set to their flag), the highest-precedence source that
    set it. A key that is not here has its default.
    """
    config = config or os.environ.get("GATEWAY_CONFIG")
    sources: dict[str, str] = {}
    for key, value in _config_values(config).items():
        sources.update(dict.fromkeys(_leaves(key, value), f"config file {config}"))
    known = _environment_names()
    for name in sorted(os.environ):
        upper = name.upper()
        if upper not in known or upper in _INTERNAL_VARIABLES:
            continue
        key = ".".join(upper.removeprefix(_ENV_PREFIX).lower().split(_ENV_DELIMITER))
        given: Any = None
        if _json_kind(known[upper]) is not None:
            with contextlib.suppress(json.JSONDecodeError):
                given = json.loads(os.environ[name])
        sources.update(dict.fromkeys(_leaves(key, given), f"environment variable {name}"))
    for key, flag in (flags or {}).items():
        sources[key] = f"command-line flag {flag}"
    return dict(sorted(sources.items()))


def load_settings(**overrides: Any) -> Settings:
    """Build the settings from flags (``overrides``), environment and TOML file.

    The environment is checked first (:func:`check_environment`). Route
    credentials named by ``credential_env`` are resolved here, so that this
    module stays the only reader of the environment.
    """
    check_environment(os.environ)
    clean = {k: v for k, v in overrides.items() if v is not None}
    config = clean.get("config")
    if config is not None and not Path(config).is_file():
        raise FileNotFoundError(f"config file not found: {config}")
    try:
        settings = Settings(**clean)
    except tomllib.TOMLDecodeError as exc:
        path = config or os.environ.get("GATEWAY_CONFIG")
        raise ValueError(f"config file {path} is not valid TOML: {exc}") from None
    return _with_credentials(settings)


def _with_credentials(settings: Settings) -> Settings:
    """Resolve every upstream's ``credential_env``: route name -> upstream name -> secret."""
    credentials: dict[str, dict[str, SecretStr]] = {}
    for route in settings.effective_routes():
        for upstream in route.pool():
            if upstream.aws is not None:
                keys = _aws_keys(settings, route, upstream, upstream.aws)
                credentials.setdefault(route.name, {})[upstream.name] = keys
                continue
            if not upstream.credential_env:
                continue
            value = os.environ.get(upstream.credential_env)
            if not value:
                where = _credential_key(settings, route, upstream)
                raise ValueError(
                    f"{where}.credential_env: environment variable "
                    f"{upstream.credential_env} is not set or empty"
                )
            credentials.setdefault(route.name, {})[upstream.name] = SecretStr(value)
    for client in settings.clients:
        for issued in client.aws_keys:
            secret = os.environ.get(issued.secret_access_key_env)
            if not secret:
                raise ValueError(
                    f"clients[{settings.clients.index(client)}].aws_keys: environment variable "
                    f"{issued.secret_access_key_env} is not set or empty"
                )
            credentials.setdefault(ISSUED_AWS_KEYS, {})[issued.access_key_id] = SecretStr(secret)
    return settings.model_copy(update={"credentials": credentials})


def _aws_keys(
    settings: Settings, route: RouteConfig, upstream: UpstreamConfig, aws: AwsSigning
) -> SecretStr:
    """An upstream's AWS keys from the environment, packed as one secret."""
    values: list[str] = []
    for field, name in (
        ("access_key_id_env", aws.access_key_id_env),
        ("secret_access_key_env", aws.secret_access_key_env),
        ("session_token_env", aws.session_token_env),
    ):
        value = os.environ.get(name) if name else ""
        if name and not value:
            where = _credential_key(settings, route, upstream)
            raise ValueError(
                f"{where}.aws.{field}: environment variable {name} is not set or empty"
            )
        values.append(value or "")
    return SecretStr(AwsKeys(values[0], values[1], values[2] or None).packed())


def _credential_key(settings: Settings, route: RouteConfig, upstream: UpstreamConfig) -> str:
    """Where a ``credential_env`` was set, in the key-path notation of every error."""
    if not settings.routes:
        return "credential_env"
    index = settings.routes.index(route)
    if route.upstreams:
        return f"routes[{index}].upstreams[{route.upstreams.index(upstream)}]"
    return f"routes[{index}]"


_WORKER_ENV = "GATEWAY_WORKER_SETTINGS"


def export_for_workers(settings: Settings) -> None:
    """Hand the effective settings (flags included) to worker processes."""
    os.environ[_WORKER_ENV] = settings.model_dump_json(exclude={"credentials"})


def settings_for_worker() -> Settings:
    """In a worker process: the settings the parent exported, credentials resolved again."""
    raw = os.environ.get(_WORKER_ENV)
    if raw is None:
        return load_settings()
    # model_validate_json does not consult the sources again: the parent's view wins.
    return _with_credentials(Settings.model_validate_json(raw))
