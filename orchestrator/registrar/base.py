"""The registrar interface: how the orchestrator tells an LLM router about a cluster.

A cluster is ONE router backend (docs/router.md): its name, the coordinator's URL, the models
it serves and a weight. Registering the same name again replaces the entry; removing a
name that is not there is not an error — so a retried launch or teardown is always safe.

A registrar may know the URL of the router its entries reach (`router_url`): then
`route_state` asks that router whether it routes to a backend yet (routing.py). Without one
(a file written for a router nobody named) nothing can be asked.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from orchestrator.registrar.routing import RouteState, ask_router
from orchestrator.router.config import BackendConfig


class RegistrarError(RuntimeError):
    """The router could not be updated; the message says where and why."""


@dataclass(frozen=True)
class BackendEntry:
    """One router backend as a registrar sees it (extra keys of the entry in `extra`)."""

    name: str
    url: str
    models: tuple[str, ...] = ()
    weight: int = 1
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def as_dict(self) -> dict[str, Any]:
        """The entry in continuum-router's shape."""
        return {"name": self.name, "url": self.url, "weight": self.weight, "models": list(self.models)}


def validated_entry(name: str, url: str, models: list[str] | tuple[str, ...], weight: int) -> BackendEntry:
    """Check a registration against the router's own rules; raises RegistrarError (nothing changed)."""
    if isinstance(models, str):
        models = [models]
    try:
        b = BackendConfig.model_validate({"name": name, "url": url, "models": list(models), "weight": weight})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise RegistrarError(f"invalid backend {name!r}: {where}: {err.get('msg')}") from None
    return BackendEntry(b.name, b.url, b.models, b.weight)


def entry_from_dict(doc: Any) -> BackendEntry | None:
    """A BackendEntry from a router's dict (None for something that is not a backend)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        return None
    models = doc.get("models") or ()
    models = (models,) if isinstance(models, str) else tuple(str(m) for m in models)
    extra = {k: v for k, v in doc.items() if k not in ("name", "url", "models", "weight")}
    weight = doc.get("weight", 1)
    return BackendEntry(doc["name"], str(doc.get("url", "")), models, int(weight) if isinstance(weight, int) else 1,
                        extra)


class Registrar(abc.ABC):
    """Adds and removes router backends. Implementations are safe to call from any thread."""

    router_url: str | None = None  # the router to ask whether it routes to an entry (None: nobody to ask)

    @abc.abstractmethod
    def register(self, name: str, url: str, models: list[str] | tuple[str, ...], weight: int = 1) -> None:
        """Add the backend, or replace the one with this name (never a duplicate)."""

    @abc.abstractmethod
    def deregister(self, name: str) -> None:
        """Remove the backend with this name; nothing happens if there is none."""

    @abc.abstractmethod
    def backends(self) -> list[BackendEntry]:
        """The backends the router has now."""

    def route_state(self, name: str, url: str, model: str) -> RouteState:
        """What the router says of the backend now (routing.ask_router); needs `router_url`."""
        if self.router_url is None:
            raise RegistrarError("no router URL to ask whether it routes to the backend")
        return ask_router(self.router_url, name, url, model)
