"""The router's HTTP front: the standard library's threaded server, one thread per connection.

Why not Flask: the router's job is to relay a backend's bytes as they arrive, including
server-sent events in chunked encoding; with `BaseHTTPRequestHandler` the proxy writes to
the client socket directly (no WSGI buffering or iterator plumbing, no reloader importing
the module twice and starting the health thread twice), exactly like the coordinator's API.

Routes: `GET /health`, `GET /v1/models`, `GET /v1/models/{id}`, `GET /metrics`, and every
`POST /v1/...` is proxied to a backend chosen by the request's "model".
"""

from __future__ import annotations

import json
from http.server import ThreadingHTTPServer
from urllib.parse import unquote

from ..httpjson import JsonHandler
from ..logs import EventLogger
from .errors import RouterError
from .proxy import BackendFailed, forward
from .service import RouterService

MAX_BODY = 32 * 1024 * 1024


class RouterHandler(JsonHandler):
    """HTTP/1.1 with keep-alive; `self.server.service` is the RouterService."""

    server_version = "pipeserve-router"

    @property
    def service(self) -> RouterService:
        return self.server.service  # type: ignore[attr-defined]

    @property
    def event_log(self) -> EventLogger:
        return self.service.log

    def _json(self, status: int, body: dict) -> None:
        self.send_json(status, body)

    def _error(self, exc: RouterError) -> None:
        self.service.metrics.count_request("-", exc.status)
        self._json(exc.status, exc.body())

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        path = self.path.split("?")[0]
        if path == "/health":
            self._json(200, self.service.health_doc())
        elif path == "/v1/models":
            self._json(200, self.service.models_doc())
        elif path.startswith("/v1/models/"):
            model = unquote(path[len("/v1/models/"):])
            entry = next((m for m in self.service.models_doc()["data"] if m["id"] == model), None)
            if entry is None:
                self._error(self.service.no_route_error(model))
            else:
                self._json(200, entry)
        elif path == "/metrics":
            self.send_metrics(self.service.metrics.render(self.service.checker.snapshot()))
        else:
            self._error(RouterError(404, f"no route GET {path}", code="not_found"))

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?")[0]
        try:
            if not path.startswith("/v1/"):
                raise RouterError(404, f"no route POST {path}", code="not_found")
            body = self._read_body()
            model = _model_of(body)
        except RouterError as exc:
            self.close_connection = True  # the body may be unread; do not reuse the connection
            self._error(exc)
            return
        try:
            backend, status = forward(self.service, self, self.path, body, model)
            self.service.metrics.count_request(backend, status)
        except RouterError as exc:
            self._error(exc)
        except BackendFailed as exc:
            # Part of the answer was written already; the connection is closed after it.
            self.service.log.warning("proxy.broken_off", model=model, reason=exc)
            self.service.metrics.count_request("-", 502)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client left; closing the backend connection cancels its work

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise RouterError(411, "send the request body with a Content-Length")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise RouterError(411, "Content-Length required") from None
        if not 0 <= length <= MAX_BODY:
            raise RouterError(413, f"request body over {MAX_BODY} bytes")
        return self.rfile.read(length)


def _model_of(body: bytes) -> str:
    """The "model" of a JSON request body (the backend validates everything else)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RouterError(400, f"request body is not valid JSON: {exc}") from None
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, str) or not model:
        raise RouterError(400, "the request needs a \"model\" (see GET /v1/models)", param="model")
    return model


def make_server(service: RouterService, host: str, port: int) -> ThreadingHTTPServer:
    """A threaded HTTP server bound to (host, port) serving the router."""
    server = ThreadingHTTPServer((host, port), RouterHandler)
    server.daemon_threads = True
    server.service = service  # type: ignore[attr-defined]
    return server
