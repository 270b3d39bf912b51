"""JSON over the standard library's threaded HTTP server: routes, bounded bodies, errors.

A deliberately small toolkit (the agent must not pull in a web framework): routes are
regular expressions over the raw path, path parameters are percent-decoded *after*
matching (so an encoded "/" never changes which route matches), an `authorize` hook runs
before any body byte is read, and every failure is an OpenAI-style JSON error
`{"error": {"message", "type", "code"}}`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote

from pydantic import BaseModel, ValidationError

from ..logs import EventLogger

M = TypeVar("M", bound=BaseModel)

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error",
                411: "invalid_request_error", 413: "invalid_request_error", 416: "invalid_request_error",
                507: "insufficient_storage"}


DRAIN_LIMIT = 16 << 20  # oversized bodies up to this size are read and dropped before the 413


class HttpError(Exception):
    """An error answered as JSON with this status; `code` is a stable machine-readable word."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code

    def body(self) -> dict:
        """The OpenAI-style error document."""
        kind = _ERROR_TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "code": self.code}}


@dataclass
class Streamed:
    """A handler result that writes its own body (file downloads): `write(wfile)` after headers."""

    status: int
    headers: dict[str, str]
    write: Callable[[Any], None]


@dataclass
class Request:
    """One request as a route handler sees it."""

    handler: BaseHTTPRequestHandler
    method: str
    path: str
    params: dict[str, str]
    query: dict[str, str]
    max_body: int
    context: dict[str, Any] = field(default_factory=dict)  # what `authorize` learnt (e.g. the caller)
    consumed: bool = False

    def header(self, name: str) -> str | None:
        """A request header, or None."""
        return self.handler.headers.get(name)

    def body_bytes(self) -> bytes:
        """The body; more than `max_body` bytes is refused (413) without being kept in memory."""
        self.consumed = True
        text = self.header("Content-Length")
        if text is None:
            if self.header("Transfer-Encoding"):
                raise HttpError(411, "Content-Length required (chunked bodies are not accepted)")
            return b""
        try:
            length = int(text)
            if length < 0:
                raise ValueError
        except ValueError:
            raise HttpError(400, "invalid Content-Length") from None
        if length > self.max_body:
            if length <= DRAIN_LIMIT:
                # Read and drop it, so the client finishes sending and then reads our 413
                # instead of failing with a broken pipe halfway through its upload.
                remaining = length
                while remaining > 0:
                    chunk = self.handler.rfile.read(min(remaining, 1 << 16))
                    if not chunk:
                        break
                    remaining -= len(chunk)
                self.consumed = remaining == 0
            else:
                self.consumed = False  # unread: the connection must close after the answer
            raise HttpError(413, f"request body over {self.max_body} bytes", "body_too_large")
        return self.handler.rfile.read(length)

    def json(self, model: type[M]) -> M:
        """The body validated as `model`; 400 naming the first bad field otherwise."""
        raw = self.body_bytes()
        try:
            data = json.loads(raw) if raw.strip() else {}
        except (ValueError, UnicodeDecodeError) as exc:
            raise HttpError(400, f"request body is not valid JSON: {exc}", "invalid_json") from None
        if not isinstance(data, dict):
            raise HttpError(400, "request body must be a JSON object", "invalid_json")
        return validate(model, data)


def validate(model: type[M], data: Any) -> M:
    """`model.model_validate(data)`, with a pydantic error turned into a 400 naming the field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        message = str(first.get("msg", "invalid value"))
        raise HttpError(400, f"{where}: {message}" if where else message, "invalid_field") from None
    except ValueError as exc:  # a validator's own ValueError subclass escaping pydantic
        raise HttpError(400, str(exc), "invalid_field") from None


@dataclass
class Route:
    """`method` + full-match `pattern` → `handler(request)`; `access` is passed to `authorize`."""

    method: str
    pattern: re.Pattern[str]
    handler: Callable[[Request], Any]
    access: str


def route(method: str, pattern: str, handler: Callable[[Request], Any], access: str) -> Route:
    """Build a Route; `pattern` uses named groups for path parameters."""
    return Route(method, re.compile(pattern), handler, access)


class JsonServer(ThreadingHTTPServer):
    """A threaded server dispatching to routes; `authorize(request, access)` raises HttpError to refuse."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], routes: Iterable[Route],
                 authorize: Callable[[Request, str], None], log: EventLogger, max_body: int,
                 name: str = "pipeserve-agent") -> None:
        self.routes = list(routes)
        self.authorize = authorize
        self.log = log
        self.max_body = max_body
        self.server_name_header = name
        super().__init__(address, JsonHandler)


class JsonHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 handler for a JsonServer."""

    protocol_version = "HTTP/1.1"
    timeout = 120  # seconds: a stalled or idle keep-alive client does not hold a thread forever
    server: JsonServer

    def version_string(self) -> str:  # no Python version in the Server header
        return self.server.server_name_header

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # Progress polling would flood the log: keep failures and state-changing calls only.
        status = int(code) if str(code).isdigit() else 0
        if self.command != "GET" or status >= 400:
            self.server.log.info("http.request", method=self.command, path=self.path.split("?")[0], status=code)

    def log_message(self, fmt: str, *args: Any) -> None:
        self.server.log.info("http.message", text=fmt % args)

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def _find(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        allowed = []
        for r in self.server.routes:
            m = r.pattern.fullmatch(path)
            if m:
                if r.method == method:
                    return r, {k: unquote(v, errors="strict") for k, v in m.groupdict().items()}
                allowed.append(r.method)
        if allowed:
            raise HttpError(405, f"{method} not allowed on {path} (use {', '.join(sorted(set(allowed)))})")
        raise HttpError(404, f"no route {method} {path}", "not_found")

    def _dispatch(self, method: str) -> None:
        raw_path, _, raw_query = self.path.partition("?")
        request = Request(self, method, raw_path, {}, {}, self.server.max_body)
        try:
            try:
                request.query = dict(parse_qsl(raw_query, keep_blank_values=True, errors="strict"))
                found, request.params = self._find(method, raw_path)
            except UnicodeDecodeError:
                raise HttpError(400, "path or query is not valid UTF-8 after percent-decoding") from None
            self.server.authorize(request, found.access)
            result = found.handler(request)
            if isinstance(result, Streamed):
                self._streamed(result)
                return
            status, body = result if isinstance(result, tuple) else (200, result)
            self._json(status, body, request)
        except HttpError as exc:
            self._json(exc.status, exc.body(), request)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:  # a bug answers 500 with a body instead of dropping the connection
            self.server.log.error("http.internal_error", exc_info=True, method=method, path=raw_path)
            self._json(500, HttpError(500, "internal error; see the agent log").body(), request)

    def _json(self, status: int, body: Any, request: Request) -> None:
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json")
        data = json.dumps(body).encode()
        if not request.consumed and (self.headers.get("Content-Length", "0") not in ("", "0")
                                     or self.headers.get("Transfer-Encoding")):
            # The body was never read (refused before reading): it would be parsed as the next
            # request on this connection, so close it.
            self.close_connection = True
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            if self.close_connection:
                self.send_header("Connection", "close")
            if status == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="pipeserve-agent"')
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _streamed(self, result: Streamed) -> None:
        self.send_response(result.status)
        for key, value in result.headers.items():
            self.send_header(key, value)
        self.end_headers()
        try:
            result.write(self)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
