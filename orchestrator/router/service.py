"""The router's state in one object: current config, health checker, balancer, metrics.

HTTP handlers, the config watcher and the health checker all go through it. The config is
an immutable object swapped whole under a lock; the routing table is rebuilt from it and a
health snapshot on every request (a handful of backends: microseconds), so a request never
sees a half-applied reload.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from orchestrator.httpkit import OpenAIError
from orchestrator.logs import EventLogger
from orchestrator.router.affinity import AffinityTable
from orchestrator.router.config import RouterConfig
from orchestrator.router.health import HealthChecker
from orchestrator.router.metrics import RouterMetrics
from orchestrator.router.table import Balancer, Route, RoutingTable, backend_models, build_table


class RouterService:
    """Owns what a request needs to be routed; thread-safe."""

    def __init__(self, config: RouterConfig, log: EventLogger, config_path: Path | None = None,
                 checker: HealthChecker | None = None) -> None:
        self.log = log
        self.config_path = config_path
        self.metrics = RouterMetrics()
        self.balancer = Balancer()
        self.affinity = AffinityTable(config.prefix_affinity.max_entries)
        self.checker = checker or HealthChecker(log)
        self._lock = threading.Lock()
        self._config = config
        self._loaded_at = time.time()
        self._config_error: str | None = None
        self.checker.configure(config.backends, config.health_checks)

    @property
    def config(self) -> RouterConfig:
        """The configuration in force."""
        with self._lock:
            return self._config

    def start(self) -> None:
        """Start health checking (never at construction: no thread starts as a side effect)."""
        self.checker.start()

    def stop(self) -> None:
        """Stop health checking."""
        self.checker.stop()

    def apply(self, config: RouterConfig) -> None:
        """Adopt a reloaded configuration."""
        with self._lock:
            old = self._config
            self._config = config
            self._loaded_at = time.time()
            self._config_error = None
        self.checker.configure(config.backends, config.health_checks)
        self.affinity.resize(config.prefix_affinity.max_entries)
        self.metrics.count_reload(True)
        new_names, old_names = {b.name for b in config.backends}, {b.name for b in old.backends}
        self.log.info("config.reloaded", backends=len(config.backends),
                      added=",".join(sorted(new_names - old_names)) or "-",
                      removed=",".join(sorted(old_names - new_names)) or "-")

    def reject(self, reason: str) -> None:
        """A changed config file is invalid: keep the previous one and say why (log + /health)."""
        with self._lock:
            self._config_error = reason
        self.metrics.count_reload(False)
        self.log.error("config.invalid", reason=reason, kept="previous configuration")

    def table(self) -> RoutingTable:
        """The routing table right now."""
        return build_table(self.config.backends, self.checker.snapshot())

    def pick(self, model: str, exclude: frozenset[str] = frozenset(), key: str | None = None) -> Route | None:
        """The backend for a request for `model`, or None when no healthy one is left.

        With an affinity key (prefix-aware routing on), the backend the key was last sent
        to while it is routable and not in `exclude`; otherwise the next one in weighted
        round-robin, remembered for the key (a conversation whose backend left the
        rotation stays with the one that now holds its prefix).
        """
        routes = self.table().candidates(model)
        sticky = self.affinity.get(key) if key is not None else None
        if key is not None:
            route = next((r for r in routes if r.name == sticky and r.name not in exclude), None)
            if route is not None:
                self.metrics.count_affinity("hit")
                return route
        route = self.balancer.pick(model, routes, exclude)
        if key is not None and route is not None:
            self.affinity.put(key, route.name)
            self.metrics.count_affinity("new" if sticky is None else "moved")
        return route

    def no_route_error(self, model: str) -> OpenAIError:
        """Why `model` cannot be routed: unknown (404) or no healthy backend (503)."""
        config, snap = self.config, self.checker.snapshot()
        table = build_table(config.backends, snap)
        if model not in table.known:
            available = ", ".join(table.models()) or "none"
            return OpenAIError(404, f"The model '{model}' does not exist (models available now: {available})",
                               code="model_not_found", param="model")
        states = [f"{b.name}: {snap[b.name].state if b.name in snap else 'starting'}"
                  + (f" ({snap[b.name].last_error})" if b.name in snap and snap[b.name].last_error else "")
                  for b in config.backends if model in backend_models(b, snap.get(b.name))]
        return OpenAIError(503, f"No healthy backend serves the model '{model}' right now; "
                                f"backends for it: {'; '.join(states)}", "service_unavailable",
                           code="no_healthy_backend")

    def report_connect_failure(self, route: Route, error: str) -> None:
        """The proxy could not connect to a backend."""
        self.metrics.count_failover()
        self.log.warning("proxy.connect_failed", backend=route.name, url=route.url, reason=error)
        self.checker.report_failure(route.name, route.url, error)

    def report_unavailable(self, route: Route, status: int) -> None:
        """A backend answered a proxied request with 503: out of rotation until it is ready again."""
        self.log.info("proxy.backend_unavailable", backend=route.name, status=status)
        self.checker.report_unavailable(route.name, route.url, f"HTTP {status} to a proxied request")

    def models_doc(self) -> dict:
        """GET /v1/models: the union of the healthy backends' models, OpenAI list format."""
        return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "pipeserve-router"}
                                           for m in self.table().models()]}

    def health_doc(self) -> dict:
        """GET /health: the router's config state and every backend's health."""
        with self._lock:
            config, loaded_at, error = self._config, self._loaded_at, self._config_error
        snap = self.checker.snapshot()
        backends = []
        for b in config.backends:
            h = snap.get(b.name)
            backends.append({
                "name": b.name, "url": b.url, "weight": b.weight,
                "models": list(backend_models(b, h)),
                "state": h.state if h else "starting", "routable": bool(h and h.routable),
                "consecutive_successes": h.successes if h else 0,
                "consecutive_failures": h.failures if h else 0,
                "last_status": h.last_status if h else None,
                "last_error": h.last_error if h else None,
                "last_check_age_s": round(time.time() - h.checked_at, 3) if h and h.checked_at else None,
            })
        healthy = sum(1 for b in backends if b["routable"])
        return {
            "status": "ok" if healthy else ("no_backends" if not backends else "no_healthy_backend"),
            "healthy_backends": healthy,
            "backends": backends,
            "health_checks": config.health_checks.model_dump(),
            "config": {"path": str(self.config_path) if self.config_path else None, "loaded_at": loaded_at,
                       "error": error},
        }
