"""Routing state: which healthy backends serve which model, and weighted round-robin.

`build_table` is pure: configuration + health snapshot → an immutable table. The only
mutable routing state is the round-robin position (`Balancer`), kept per (model, backend)
so that rebuilding the table after a health change or a reload does not reset the rotation.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Mapping

from orchestrator.router.config import BackendConfig
from orchestrator.router.health import BackendHealth


@dataclass(frozen=True)
class Route:
    """A backend a request may be sent to."""

    name: str
    url: str
    weight: int


@dataclass(frozen=True)
class RoutingTable:
    """model → routable backends (in configuration order), and every model ever named."""

    routes: Mapping[str, tuple[Route, ...]] = field(default_factory=dict)
    known: frozenset[str] = frozenset()

    def models(self) -> list[str]:
        """Models with at least one healthy backend, sorted."""
        return sorted(self.routes)

    def candidates(self, model: str) -> tuple[Route, ...]:
        """Healthy backends serving `model` (empty when none)."""
        return self.routes.get(model, ())


def backend_models(backend: BackendConfig, health: BackendHealth | None) -> tuple[str, ...]:
    """The models a backend serves: as configured, else as it last listed them itself."""
    if backend.models:
        return backend.models
    return health.models if health is not None else ()


def build_table(backends: tuple[BackendConfig, ...], health: Mapping[str, BackendHealth]) -> RoutingTable:
    """The routing table for this configuration and health snapshot (pure)."""
    routes: dict[str, list[Route]] = {}
    known: set[str] = set()
    for b in backends:
        h = health.get(b.name)
        models = backend_models(b, h)
        known.update(models)
        if h is None or not h.routable:
            continue
        for m in models:
            routes.setdefault(m, []).append(Route(b.name, b.url, b.weight))
    return RoutingTable({m: tuple(r) for m, r in routes.items()}, frozenset(known))


def smooth_wrr(current: Mapping[str, int], routes: tuple[Route, ...]) -> tuple[Route, dict[str, int]]:
    """One step of smooth weighted round-robin (as nginx): returns the pick and the new state.

    Each candidate gains its weight; the largest total wins and pays back the sum of
    weights. Weights 3:1 give A A B A, spread out rather than in bursts; ties go to the
    earlier backend in configuration order, which makes the order deterministic.
    """
    if not routes:
        raise ValueError("no candidates")
    total = sum(r.weight for r in routes)
    state = {r.name: current.get(r.name, 0) + r.weight for r in routes}
    best = max(routes, key=lambda r: (state[r.name], -routes.index(r)))
    state[best.name] -= total
    return best, state


class Balancer:
    """Thread-safe weighted round-robin positions, one rotation per model."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[str, dict[str, int]] = {}

    def pick(self, model: str, routes: tuple[Route, ...], exclude: frozenset[str] = frozenset()) -> Route | None:
        """The next backend for `model` among `routes` minus `exclude`; None if none is left."""
        live = tuple(r for r in routes if r.name not in exclude)
        if not live:
            return None
        with self._lock:
            current = self._state.get(model, {})
            route, stepped = smooth_wrr(current, live)
            # Excluded backends (failed to connect just now) keep their credit; backends that
            # left the candidate list drop out, so one that comes back starts fresh.
            self._state[model] = {r.name: stepped.get(r.name, current.get(r.name, 0)) for r in routes}
        return route
