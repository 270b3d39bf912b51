"""The router's YAML configuration: the continuum-router shape, validated with pydantic.

```yaml
backends:
  - {name: smollm2-2stage, url: "http://127.0.0.1:39600", weight: 1, models: [smollm2]}
health_checks: {enabled: true, interval: 10s, timeout: 5s, unhealthy_threshold: 3,
                healthy_threshold: 2, endpoint: /v1/models}
prefix_affinity: {enabled: true}   # pipeserve's own: a conversation goes back to its backend (affinity.py)
cache_scope: {enabled: true}       # pipeserve's own: each caller's prompt-cache entries are its own
```

Unknown keys (top level and inside a backend) are kept, not refused: the same file is read
by continuum-router, whose other settings this router does not use but must not reject.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class ConfigError(ValueError):
    """The YAML cannot be used; the message names the key and the problem."""


def parse_duration(value: Any) -> float:
    """Seconds from a number or a duration string such as "500ms", "2s", "1m"."""
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of seconds or a string like '2s'")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        raise ValueError(f"{value!r} is not a duration (use seconds, or a string like '500ms', '2s', '1m')")
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return seconds


def normalize_url(url: str) -> str:
    """`http(s)://host:port[/prefix]` without a trailing slash or a trailing `/v1`.

    Requests are forwarded to `url + path` where path already starts with /v1, so a URL
    written with /v1 at the end (a common habit with OpenAI clients) is accepted as well.
    """
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL with a host")
    if parts.query or parts.fragment:
        raise ValueError(f"{url!r}: a backend URL takes no query or fragment")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        raise ValueError(f"{url!r}: {exc}") from None
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{parts.scheme}://{parts.netloc}{path}"


class BackendConfig(BaseModel):
    """One backend: usually one pipeserve coordinator (one cluster)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(min_length=1)
    url: str
    weight: int = Field(default=1, ge=1, le=1000)
    models: tuple[str, ...] = ()

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v != v.strip() or "/" in v:
            raise ValueError("a backend name has no surrounding spaces and no '/'")
        return v

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return normalize_url(v)

    @field_validator("models", mode="before")
    @classmethod
    def _models(cls, v: Any) -> Any:
        if v is None:
            return ()
        if isinstance(v, str):
            return (v,)
        return v


class HealthChecks(BaseModel):
    """How backends are probed (continuum-router's `health_checks`)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    enabled: bool = True
    interval: float = 10.0
    timeout: float = 5.0
    unhealthy_threshold: int = Field(default=3, ge=1, le=100)
    healthy_threshold: int = Field(default=2, ge=1, le=100)
    endpoint: str = "/v1/models"

    @field_validator("interval", "timeout", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float:
        return parse_duration(v)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("the endpoint is a path starting with '/'")
        return v


_HEADER_NAME = r"[A-Za-z0-9!#$%&'*+.^_`|~-]+"  # an HTTP header name (RFC 9110 token)


class PrefixAffinity(BaseModel):
    """Prefix-aware routing (`prefix_affinity:`; pipeserve's own key, continuum-router ignores it).

    Off by default: a conversation is then balanced like any request.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    enabled: bool = False
    header: str = Field(default="X-Session-Id", min_length=1)  # a client's explicit session key
    max_entries: int = Field(default=10000, ge=1, le=10_000_000)
    prefix_chars: int = Field(default=4096, ge=1, le=10_000_000)  # /v1/completions: characters of the prompt

    @field_validator("header")
    @classmethod
    def _header(cls, v: str) -> str:
        if not re.fullmatch(_HEADER_NAME, v):
            raise ValueError(f"{v!r} is not an HTTP header name")
        return v


class CacheScope(BaseModel):
    """Prompt-cache scopes by caller (`cache_scope:`; pipeserve's own key, continuum-router ignores it).

    On by default: a request's caller — its API key (`Authorization: Bearer`, `x-api-key`), or
    `header`'s value when one is named (an authenticating proxy in front sets it) — becomes its
    prompt-cache scope (orchestrator/cache_scope.py), so no caller reuses, or learns of, another's
    cached prompts. Callers that send neither share the default scope.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    enabled: bool = True
    header: str | None = None

    @field_validator("header")
    @classmethod
    def _header(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(_HEADER_NAME, v):
            raise ValueError(f"{v!r} is not an HTTP header name")
        return v


class RouterConfig(BaseModel):
    """The whole file. Other top-level keys are kept in `model_extra`."""

    model_config = ConfigDict(extra="allow", frozen=True)

    backends: tuple[BackendConfig, ...] = ()
    health_checks: HealthChecks = HealthChecks()
    prefix_affinity: PrefixAffinity = PrefixAffinity()
    cache_scope: CacheScope = CacheScope()

    @field_validator("backends", "health_checks", "prefix_affinity", "cache_scope", mode="before")
    @classmethod
    def _none_is_default(cls, v: Any, info: Any) -> Any:
        # `backends:` with nothing after it is YAML null; read it as "no backends".
        if v is None:
            return () if info.field_name == "backends" else {}
        return v

    @model_validator(mode="after")
    def _unique_names(self) -> "RouterConfig":
        seen: set[str] = set()
        for b in self.backends:
            if b.name in seen:
                raise ValueError(f"backend name {b.name!r} appears twice")
            seen.add(b.name)
        return self


def _describe(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "(top level)"
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        problems.append(f"{where}: {msg}")
    more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return "; ".join(problems) + more


def parse_config(text: str, source: str = "<config>") -> RouterConfig:
    """Validate YAML text; raises ConfigError naming the key and the problem."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: the top level must be a mapping (backends:, health_checks:, ...)")
    try:
        return RouterConfig.model_validate(doc)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from None


def load_config(path: Path) -> RouterConfig:
    """Read and validate the YAML file; raises ConfigError (also for an unreadable file)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    return parse_config(text, str(path))
