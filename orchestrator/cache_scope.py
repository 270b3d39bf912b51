"""Prompt-cache scopes: a request reuses only the cache entries of requests of its own scope.

Without scopes the prompt cache is an oracle over other users' prompts: a client sending a
guess of another's prompt learns from `cached_tokens` (and from its time to first token) how
many of its tokens someone already sent (issue 39). A request's scope is made of

- what `pipeserve router` knows of its caller (`SCOPE_HEADER`, set by the router from the
  caller's API key or a configured header, never passed through from a client: `caller_scope`),
- and the request's own `cache_salt` (the field vLLM uses), which a client picks itself.

The coordinator turns both into one opaque scope (`request_scope`); requests with neither
share the default scope "". A caller's scope is a hash of its API key, so another client
cannot name it without holding that key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

SCOPE_HEADER = "X-Pipeserve-Cache-Scope"
MAX_PART = 1024  # characters of a cache_salt or scope header: a scope is a name, not a payload
_DOMAIN = "pipeserve cache scope v1"


class ScopeError(ValueError):
    """A `cache_salt` or scope header that cannot name a scope; `param` is the field to blame."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _hash(*parts: str) -> str:
    return hashlib.sha256("\0".join((_DOMAIN, *parts)).encode()).hexdigest()[:32]


def caller_scope(caller: str) -> str:
    """The router's scope header for a caller (its API key, or its configured header's value)."""
    return _hash("caller", caller)


def caller_of(headers: Mapping[str, str], header: str | None) -> str | None:
    """Who calls, as the router knows it: the configured `header`'s value when set, else the API
    key (`Authorization: Bearer …`, or Anthropic's `x-api-key`); None when nothing names it."""
    if header:
        value = (headers.get(header) or "").strip()
        return value or None
    auth = (headers.get("Authorization") or "").strip()
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        return auth[7:].strip()
    return (headers.get("x-api-key") or "").strip() or None


def request_scope(scope_header: str | None, cache_salt: Any) -> str:
    """The scope of a request from the router's header and the body's `cache_salt`: "" (the
    default scope) with neither. Raises ScopeError for a salt that is not a string, or too long."""
    if cache_salt is not None and not isinstance(cache_salt, str):
        raise ScopeError("cache_salt must be a string", "cache_salt")
    salt = cache_salt or ""
    caller = (scope_header or "").strip()
    if len(salt) > MAX_PART:
        raise ScopeError(f"cache_salt is longer than {MAX_PART} characters", "cache_salt")
    if len(caller) > MAX_PART:
        raise ScopeError(f"{SCOPE_HEADER} is longer than {MAX_PART} characters", SCOPE_HEADER)
    if not salt and not caller:
        return ""
    return _hash("request", caller, salt)


__all__ = ["MAX_PART", "SCOPE_HEADER", "ScopeError", "caller_of", "caller_scope", "request_scope"]
