"""Router counters in the Prometheus text format (`GET /metrics`)."""

from __future__ import annotations

import threading
from typing import Mapping

from .health import BackendHealth


def _esc(value: str) -> str:
    """A Prometheus label value: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class RouterMetrics:
    """Requests by backend and status, fail-overs, config reloads; guarded by one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str], int] = {}
        self._failovers = 0
        self._reloads: dict[str, int] = {"ok": 0, "invalid": 0}

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

    def render(self, health: Mapping[str, BackendHealth]) -> str:
        """The exposition text, with the current health of every backend."""
        with self._lock:
            lines = [
                "# HELP pipeserve_router_requests_total Proxied requests by backend and status.",
                "# TYPE pipeserve_router_requests_total counter",
                *(f'pipeserve_router_requests_total{{backend="{_esc(b)}",status="{s}"}} {n}'
                  for (b, s), n in sorted(self._requests.items())),
                "# HELP pipeserve_router_failovers_total Requests retried on another backend after a connect failure.",
                "# TYPE pipeserve_router_failovers_total counter",
                f"pipeserve_router_failovers_total {self._failovers}",
                "# HELP pipeserve_router_config_reloads_total Config file changes, applied or rejected.",
                "# TYPE pipeserve_router_config_reloads_total counter",
                *(f'pipeserve_router_config_reloads_total{{result="{k}"}} {v}' for k, v in self._reloads.items()),
            ]
        lines += [
            "# HELP pipeserve_router_backend_healthy 1 when the backend is routable.",
            "# TYPE pipeserve_router_backend_healthy gauge",
            *(f'pipeserve_router_backend_healthy{{backend="{_esc(n)}",state="{h.state}"}} {int(h.routable)}'
              for n, h in sorted(health.items())),
        ]
        return "\n".join(lines) + "\n"
