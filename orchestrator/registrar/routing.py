"""Does the router route to a backend yet? Its own answer, read from its HTTP API.

A router entry written is not a backend routed to: the router first reloads its YAML (or
takes the admin API's change), then probes the new backend until `healthy_threshold` probes
answered. Until then a request for the model gets 503 "starting". The control plane asks
here before it calls a session Healthy (docs/router.md, "Registration ends when the router
routes").

`pipeserve router` answers `GET /health` with each backend's `state` and `routable`
(docs/router.md): the backend is found by name AND url, so an entry the router has not
reloaded yet (absent, or still at an old address) never counts. A router whose `/health`
lists no backends (another router) is asked `GET /v1/models` instead: it lists the models of
its healthy backends only, a weaker check (another backend serving the same model counts too).

`route_state` is pure; `ask_router` is the one function here that does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import requests

from orchestrator.router.config import normalize_url

ASK_TIMEOUT_S = 5.0  # one look; the caller's bounded wait asks again


@dataclass(frozen=True)
class RouteState:
    """What the router said of one backend: routable or not, its state word, and why."""

    routable: bool
    state: str  # the router's word (healthy, starting, warming, unhealthy), or absent / no answer
    detail: str = ""

    def describe(self) -> str:
        """The state in words, with the router's reason when it gave one."""
        return f"{self.state} ({self.detail})" if self.detail else self.state


def route_state(health: Any, name: str, url: str) -> RouteState | None:
    """The backend `name` at `url` as a `/health` document reports it (pure).

    None when the document lists no backends at all (not `pipeserve router`'s shape): the
    caller then asks `/v1/models` (`model_listed`)."""
    backends = health.get("backends") if isinstance(health, dict) else None
    if not isinstance(backends, list):
        return None
    entry = next((b for b in backends if isinstance(b, dict) and b.get("name") == name), None)
    if entry is None:
        return RouteState(False, "absent", "not in its configuration yet (reloading)")
    if _same_url(entry.get("url"), url) is False:
        return RouteState(False, "absent", f"it still has {entry.get('url')} under this name (reloading)")
    state = str(entry.get("state") or "unknown")
    error = entry.get("last_error")
    routable = entry.get("routable")
    return RouteState(bool(routable) if isinstance(routable, bool) else state == "healthy", state,
                      str(error) if error else "")


def model_listed(models: Any, model: str) -> RouteState:
    """Whether a `/v1/models` document lists `model` (pure): the fallback check."""
    data = models.get("data") if isinstance(models, dict) else None
    ids = {m.get("id") for m in data if isinstance(m, dict)} if isinstance(data, list) else set()
    if model in ids:
        return RouteState(True, "listed", f"{model} in its /v1/models")
    return RouteState(False, "not listed", f"{model} not in its /v1/models yet")


def _same_url(listed: Any, url: str) -> bool | None:
    """Whether the router's url for the backend is `url` (None: it gave none or one we cannot read)."""
    if not isinstance(listed, str):
        return None
    try:
        return normalize_url(listed) == normalize_url(url)
    except ValueError:
        return None


def ask_router(router_url: str, name: str, url: str, model: str, timeout: float = ASK_TIMEOUT_S,
               session: requests.Session | None = None) -> RouteState:
    """One look at the router (never raises: no answer is a state too, with its reason)."""
    base = router_url.rstrip("/")
    get = (session or requests).get
    try:
        r = get(base + "/health", timeout=timeout, headers={"Accept": "application/json"})
        found = route_state(_json(r), name, url) if r.status_code == 200 else None
        if found is not None:
            return found
        r = get(base + "/v1/models", timeout=timeout, headers={"Accept": "application/json"})
        if r.status_code != 200:
            return RouteState(False, "no answer", f"GET {base}/v1/models answered {r.status_code}")
        return model_listed(_json(r), model)
    except requests.RequestException as exc:
        return RouteState(False, "no answer", f"{type(exc).__name__}: {exc}")


def _json(r: requests.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return None
