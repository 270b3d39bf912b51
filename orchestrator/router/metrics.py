"""Router counters in the Prometheus text format (`GET /metrics`)."""

from __future__ import annotations

import threading
from typing import Mapping

from orchestrator.httpkit.prometheus import exposition, family, one
from orchestrator.router.health import BackendHealth


class RouterMetrics:
    """Requests by backend and status, fail-overs, config reloads; guarded by one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str], int] = {}
        self._failovers = 0
        self._reloads: dict[str, int] = {"ok": 0, "invalid": 0}
        self._affinity: dict[str, int] = {"hit": 0, "new": 0, "moved": 0}

    def count_request(self, backend: str, status: int) -> None:
        """One answered request; backend is "-" when the router answered itself."""
        with self._lock:
            key = (backend, str(status))
            self._requests[key] = self._requests.get(key, 0) + 1

    def count_failover(self) -> None:
        """A backend refused the connection and the request went to another one."""
        with self._lock:
            self._failovers += 1

    def count_reload(self, ok: bool) -> None:
        """A changed config file was applied (ok) or kept out (invalid)."""
        with self._lock:
            self._reloads["ok" if ok else "invalid"] += 1

    def count_affinity(self, result: str) -> None:
        """A keyed request went to its backend ("hit"), to a first one ("new"), or to another
        one because its backend was out of rotation ("moved")."""
        with self._lock:
            self._affinity[result] += 1

    def render(self, health: Mapping[str, BackendHealth]) -> str:
        """The exposition text, with the current health of every backend."""
        with self._lock:
            lines = [
                *family("pipeserve_router_requests_total", "counter", "Proxied requests by backend and status.",
                        [({"backend": b, "status": s}, n) for (b, s), n in sorted(self._requests.items())]),
                *one("pipeserve_router_failovers_total", "counter",
                     "Requests retried on another backend after a connect failure.", self._failovers),
                *family("pipeserve_router_config_reloads_total", "counter", "Config file changes, applied or rejected.",
                        [({"result": k}, v) for k, v in self._reloads.items()]),
                *family("pipeserve_router_affinity_total", "counter",
                        "Requests with an affinity key, by where they went.",
                        [({"result": k}, v) for k, v in self._affinity.items()]),
            ]
        lines += family("pipeserve_router_backend_healthy", "gauge", "1 when the backend is routable.",
                        [({"backend": n, "state": h.state}, int(h.routable)) for n, h in sorted(health.items())])
        return exposition(lines)
