"""The gateway's configuration: one pydantic-settings model, read once at start.

Sources, highest precedence first: explicit values (command-line flags),
environment variables (``GATEWAY_`` prefix, ``__`` for nesting), a TOML file
(``--config FILE`` or ``GATEWAY_CONFIG``), then the defaults below. Nothing
else in the package reads the environment.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
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

__all__ = [
    "Limits",
    "RouteConfig",
    "Settings",
    "Timeouts",
    "describe_errors",
    "export_for_workers",
    "load_settings",
    "settings_for_worker",
]

ProtocolName = Literal["auto", "chat", "completions", "responses", "messages", "sse"]
_ROUTE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def _base_url(value: str) -> str:
    """An upstream base URL: http(s) with a host, without a trailing slash."""
    if not re.match(r"^https?://[^/\s]+", value):
        raise ValueError("must be an http:// or https:// URL")
    return value.rstrip("/")


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
    client_header: float = Field(
        10.0, gt=0, description="Client edge: to receive a whole request head (408)."
    )
    client_body: float = Field(
        30.0, gt=0, description="Client edge: longest gap between two reads of a body (408)."
    )


class RouteTimeouts(_Strict):
    """Per-route overrides of the global deadlines; unset fields inherit."""

    connect: float | None = Field(None, gt=0)
    first_byte: float | None = Field(None, gt=0)
    idle: float | None = Field(None, gt=0)
    total: float | None = Field(None, gt=0)


class Limits(_Strict):
    """Byte and concurrency limits."""

    max_request_bytes: int = Field(32 * 1024 * 1024, gt=0, description="Request body limit (413).")
    max_response_bytes: int = Field(
        1024 * 1024 * 1024, gt=0, description="Streamed response limit (limit_exceeded)."
    )
    max_line_bytes: int = Field(16 * 1024 * 1024, gt=0, description="Longest SSE line.")
    max_event_bytes: int = Field(16 * 1024 * 1024, gt=0, description="Largest SSE event data.")
    max_concurrent_streams: int | None = Field(
        None, gt=0, description="Global cap on concurrent streams (503 beyond)."
    )
    max_header_bytes: int = Field(
        32 * 1024, gt=0, description="Client edge: bytes of a request head (431 beyond)."
    )
    max_header_fields: int = Field(
        100, gt=0, description="Client edge: header fields of a request (431 beyond)."
    )


class RouteConfig(_Strict):
    """One client path prefix mapped to one upstream."""

    name: str = Field("default", description="Route name, used as the metrics label.")
    prefix: str = Field("/v1", description="Client path prefix, e.g. /v1 or /anthropic/v1.")
    upstream: str = Field(description="Upstream base URL, e.g. https://api.openai.com/v1.")
    credential_env: str | None = Field(
        None, description="Name of an environment variable holding the upstream credential."
    )
    credential_style: Literal["auto", "bearer", "x-api-key"] = "auto"
    protocol: ProtocolName = Field(
        "auto", description="Contract; auto: by the path's last segment."
    )
    require_finish_reason: bool = True
    inject_include_usage: bool = False
    timeouts: RouteTimeouts = RouteTimeouts()
    max_concurrent_streams: int | None = Field(None, gt=0)

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
    def _upstream(cls, value: str) -> str:
        return _base_url(value)


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
    host: str = Field("127.0.0.1", min_length=1, description="Listen address.")
    port: int = Field(8080, ge=0, le=65535)
    workers: int = Field(1, ge=1, le=64)
    routes: list[RouteConfig] = Field(default_factory=list)
    timeouts: Timeouts = Timeouts()
    limits: Limits = Limits()
    annotate: bool = Field(True, description="Append the complete/incomplete annotation.")
    access_log: bool = Field(
        True, description="One JSON line per request under a route prefix, on stdout."
    )
    uvicorn_access_log: bool = False
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
        default_factory=list, description="SHA-256 hex digests of accepted client keys."
    )
    upstream_transport: Literal["aiohttp", "httpx"] = "aiohttp"
    upstream_max_connections: int = Field(10000, ge=1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    credentials: dict[str, SecretStr] = Field(
        default_factory=dict, exclude=True, description="Resolved upstream credentials (internal)."
    )

    @field_validator("client_key_sha256")
    @classmethod
    def _hashes(cls, value: list[str]) -> list[str]:
        for digest in value:
            if not _SHA256_HEX.match(digest):
                raise ValueError("each entry must be 64 lower-case hex digits (a SHA-256)")
        return value

    @field_validator("upstream_url")
    @classmethod
    def _upstream_url(cls, value: str | None) -> str | None:
        return _base_url(value) if value else value

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


def _config_path(*sources: PydanticBaseSettingsSource) -> Path | None:
    for source in sources:
        value = source().get("config")
        if value:
            path = Path(value)
            if not path.is_file():
                raise FileNotFoundError(f"config file not found: {path}")
            return path
    return None


def describe_errors(exc: ValidationError, config: str | None = None) -> str:
    """A precise, multi-line message: which key, where it came from, why."""
    config = config or os.environ.get("GATEWAY_CONFIG")
    lines = ["invalid configuration:"]
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc) or "(root)"
        env_name = "GATEWAY_" + "__".join(p.upper() for p in loc)
        if env_name in os.environ:
            origin = f" (environment variable {env_name})"
        elif config:
            origin = f" (config file {config}, or its default)"
        else:
            origin = ""
        lines.append(f"  {key}{origin}: {err['msg']}")
    return "\n".join(lines)


def load_settings(**overrides: Any) -> Settings:
    """Build the settings from flags (``overrides``), environment and TOML file.

    Route credentials named by ``credential_env`` are resolved here, so that
    this module stays the only reader of the environment.
    """
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
    credentials: dict[str, SecretStr] = {}
    for route in settings.effective_routes():
        if route.credential_env:
            value = os.environ.get(route.credential_env)
            if not value:
                raise ValueError(
                    f"routes[{route.name}].credential_env: environment variable "
                    f"{route.credential_env} is not set or empty"
                )
            credentials[route.name] = SecretStr(value)
    return settings.model_copy(update={"credentials": credentials})


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
