"""The router's HTTP front: pipeserve's HTTP toolkit (`orchestrator.httpkit`), one thread per connection.

Why not Flask: the router's job is to relay a backend's bytes as they arrive, including
server-sent events in chunked encoding; with `BaseHTTPRequestHandler` the proxy writes to
the client socket directly (no WSGI buffering or iterator plumbing, no reloader importing
the module twice and starting the health thread twice), exactly like the coordinator's API.

Routes: `GET /health`, `GET /v1/models`, `GET /v1/models/{id}`, `GET /metrics`, and every
`POST /v1/...` is proxied to a backend chosen by the request's "model".
"""

from __future__ import annotations

from typing import Any

from orchestrator.cache_scope import caller_of, caller_scope
from orchestrator.httpkit import App, Limits, OpenAIError, Raw, Request, Server, parse_json, route
from orchestrator.router.affinity import affinity_key
from orchestrator.router.proxy import BackendFailed, ClientGone, client_error, forward
from orchestrator.router.service import RouterService

MAX_BODY = 32 * 1024 * 1024


def _model_of(doc: Any) -> str:
    """The "model" of a parsed JSON request body (the backend validates everything else)."""
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, str) or not model:
        raise OpenAIError(400, "the request needs a \"model\" (see GET /v1/models)", param="model")
    return model


def _scope_of(service: RouterService, request: Request) -> str | None:
    """The caller's prompt-cache scope (`SCOPE_HEADER`'s value) when cache scopes are on and the
    caller is known (else None: the default scope)."""
    settings = service.config.cache_scope
    caller = caller_of(request.handler.headers, settings.header) if settings.enabled else None
    return caller_scope(caller) if caller else None


def _key_of(service: RouterService, request: Request, doc: Any, model: str, scope: str | None) -> str | None:
    """The request's affinity key when prefix-aware routing is on (else None)."""
    settings = service.config.prefix_affinity
    if not settings.enabled:
        return None
    return affinity_key(request.path, doc, model, request.handler.headers.get(settings.header),
                        settings.prefix_chars, scope or "")


def build_app(service: RouterService) -> App:
    """The router's routes; answers are counted by backend ("-": the router's own errors)."""

    def model(request: Request) -> dict:
        entry = next((m for m in service.models_doc()["data"] if m["id"] == request.params["model"]), None)
        if entry is None:
            raise service.no_route_error(request.params["model"])
        return entry

    def proxy(request: Request) -> None:
        try:
            body = request.body_bytes()
            doc = parse_json(body)
            name = _model_of(doc)
            scope = _scope_of(service, request)
            backend, status = forward(service, request.handler, request.handler.path, body, name,
                                      _key_of(service, request, doc, name, scope), scope)
        except OpenAIError as exc:  # the router's own answer, in the shape the path's client reads
            raise client_error(request.path, exc) from None
        except BackendFailed as exc:
            # Part of the answer was written already; the connection is closed after it.
            service.log.warning("proxy.broken_off", model=name, reason=exc)
            request.context["status"] = 502
            return None
        except ClientGone as exc:
            # Nothing more can be written; 499 is the common log word for "the client closed first".
            service.log.info("proxy.client_gone", model=name, backend=str(exc))
            request.handler.close_connection = True
            request.context.update(backend=str(exc), status=499)
            return None
        request.context.update(backend=backend, status=status)
        return None

    def observe(request: Request, status: int) -> None:
        backend = request.context.get("backend")
        if backend is not None or 400 <= status < 499 or status >= 500:
            service.metrics.count_request(backend or "-", status)

    routes = [
        route("GET", "/health", lambda _: service.health_doc()),
        route("GET", "/v1/models", lambda _: service.models_doc()),
        route("GET", "/v1/models/(?P<model>.+)", model),
        route("GET", "/metrics", lambda _: Raw(service.metrics.render(service.checker.snapshot()).encode(),
                                               "text/plain; version=0.0.4")),
        route("POST", "/v1/.*", proxy),
    ]
    return App.of(routes, MAX_BODY, observe=observe, log_hint="see the router log")


def make_server(service: RouterService, host: str, port: int, limits: Limits | None = None) -> Server:
    """A threaded HTTP server bound to (host, port) serving the router (limits: defaults + env)."""
    return Server((host, port), build_app(service), service.log, limits or Limits().with_env())
