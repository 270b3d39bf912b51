"""Router registrars: put a cluster's coordinator into an LLM router, and take it out.

`ConfigFileRegistrar` edits the router's YAML (the default; docs/router.md); `AdminApiRegistrar`
calls continuum-router's admin REST API. `registrar_from_settings` builds either from the
orchestrator's configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from orchestrator.registrar.admin_api import AdminApiRegistrar, ApiKeyAuth, Auth, BasicAuth, BearerAuth
from orchestrator.registrar.base import BackendEntry, Registrar, RegistrarError
from orchestrator.registrar.config_file import ConfigFileRegistrar
from orchestrator.registrar.routing import RouteState

__all__ = ["AdminApiRegistrar", "ApiKeyAuth", "Auth", "BackendEntry", "BasicAuth", "BearerAuth",
           "ConfigFileRegistrar", "Registrar", "RegistrarError", "RouteState", "registrar_from_settings"]


def registrar_from_settings(settings: Mapping[str, Any]) -> Registrar:
    """A registrar from settings such as

    `{"kind": "config_file", "path": "router.yaml"}` or
    `{"kind": "admin_api", "url": "http://127.0.0.1:8080", "auth": {"type": "bearer", "token": "..."},
      "list_path": ..., "create_path": ..., "item_path": ...}` (auth types: bearer, basic, api_key);
    either with `"router_url"`: the router asked whether it routes to an entry (registrar/routing.py).
    """
    kind = settings.get("kind", "config_file")
    if kind == "config_file":
        if not settings.get("path"):
            raise RegistrarError("config_file registrar: `path` (the router YAML) is required")
        return ConfigFileRegistrar(Path(settings["path"]), settings.get("router_url"))
    if kind == "admin_api":
        if not settings.get("url"):
            raise RegistrarError("admin_api registrar: `url` (the router's base URL) is required")
        paths = {k: settings[k] for k in ("list_path", "create_path", "item_path") if settings.get(k)}
        return AdminApiRegistrar(settings["url"], _auth(settings.get("auth")), router_url=settings.get("router_url"),
                                 **paths)
    raise RegistrarError(f"unknown registrar kind {kind!r} (config_file or admin_api)")


def _auth(spec: Mapping[str, Any] | None) -> Auth | None:
    if not spec:
        return None
    kind = spec.get("type")
    try:
        if kind == "bearer":
            return BearerAuth(spec["token"])
        if kind == "basic":
            return BasicAuth(spec["username"], spec["password"])
        if kind == "api_key":
            return ApiKeyAuth(spec["key"], spec.get("header", "X-API-Key"))
    except KeyError as exc:
        raise RegistrarError(f"admin_api auth {kind!r} needs {exc.args[0]!r}") from None
    raise RegistrarError(f"unknown admin_api auth type {kind!r} (bearer, basic or api_key)")
