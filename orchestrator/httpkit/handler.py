"""Routes, requests and the one dispatcher of pipeserve's HTTP servers.

Routes are regular expressions over the raw path; path parameters are percent-decoded
*after* matching (an encoded "/" never changes which route matches). An `authorize` hook
runs before any body byte is read. Every failure leaves through `Handler._dispatch`: an
`OpenAIError` is answered as itself, malformed JSON (too deeply nested included) as 400, a
bug as 500 with its traceback in the log, a client that left as nothing (status 499).
"""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from socketserver import _SocketWriter  # type: ignore[attr-defined]  # the stdlib's own unbuffered writer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote

from pydantic import BaseModel

from orchestrator.httpkit.errors import RETRY_AFTER_S, OpenAIError, overloaded
from orchestrator.httpkit.request import Raw, Request, Streamed

if TYPE_CHECKING:
    from orchestrator.httpkit.server import Server

CONTROL_HEADER = "X-Pipeserve-Control"  # the control plane's token: served in the server's reserved slots

LINGER_BYTES = 16 << 20  # after refusing a body, up to this much of it is read and dropped...
LINGER_S = 2.0  # ...for at most this long, so the client can finish sending and then read our answer


@dataclass
class Route:
    """`method` + full-match `pattern` → `handler(request)`; `access` is passed to `authorize`."""

    method: str
    pattern: re.Pattern[str]
    handler: Callable[["Request"], Any]
    access: str = "public"


def route(method: str, pattern: str, handler: Callable[["Request"], Any], access: str = "public") -> Route:
    """Build a Route; `pattern` uses named groups for path parameters."""
    return Route(method, re.compile(pattern), handler, access)


@dataclass
class App:
    """What a server serves.

    `authorize(request, access)` raises OpenAIError to refuse; `observe(request, status)`
    sees every dispatched request's final status (metrics); `empty_body_ok` lets a request
    without Content-Length have an empty body (an empty JSON body then reads as {}).
    """

    routes: list[Route]
    max_body: int
    authorize: Callable[["Request", str], None] | None = None
    observe: Callable[["Request", int], None] | None = None
    empty_body_ok: bool = False
    log_hint: str = "see the server log"

    @classmethod
    def of(cls, routes: Iterable[Route], max_body: int, **kwargs: Any) -> "App":
        """An App over `routes`."""
        return cls(list(routes), max_body, **kwargs)


class DeadlineReader(socket.SocketIO):
    """The raw reader under a handler's `rfile`: each read waits at most until `deadline`.

    A per-read socket timeout alone lets a client trickle one byte per timeout forever; a
    deadline bounds the whole head (or body) whatever the pace.
    """

    def __init__(self, sock: socket.socket, per_read: float, write_timeout: float) -> None:
        super().__init__(sock, "rb")
        self.sock = sock
        self.per_read = per_read
        self.write_timeout = write_timeout
        self.deadline: float | None = None

    def readinto(self, b: Any) -> int | None:
        wait = self.per_read
        if self.deadline is not None:
            wait = min(wait, self.deadline - time.monotonic())
            if wait <= 0:
                raise TimeoutError("the client was too slow")
        self.sock.settimeout(wait)
        try:
            return super().readinto(b)
        finally:
            self.sock.settimeout(self.write_timeout)


class Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive, dispatching to `server.app`'s routes."""

    protocol_version = "HTTP/1.1"
    server: "Server"

    def setup(self) -> None:
        limits = self.server.limits
        self.connection = self.request
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connection.settimeout(limits.write_timeout)
        self.reader = DeadlineReader(self.connection, limits.idle_timeout, limits.write_timeout)
        self.reader.deadline = time.monotonic() + limits.header_timeout  # the first head, from the accept
        self.rfile = io.BufferedReader(self.reader, 65536)
        self.wfile = _SocketWriter(self.connection)
        self.served = 0
        self.control = False  # has this connection carried the control plane's token?

    def handle_one_request(self) -> None:
        limits = self.server.limits
        if self.served:
            # Keep-alive: the next request may take idle_timeout to start, then header_timeout to arrive.
            self.reader.deadline = time.monotonic() + limits.idle_timeout
            if not self.control:
                self.server.waiting(self.connection)  # idle again: a newcomer may take the slot
            try:
                if not self.rfile.peek(1):
                    self.close_connection = True
                    return
            except OSError:  # timed out or reset
                self.close_connection = True
                return
            self.reader.deadline = time.monotonic() + limits.header_timeout
        self.served += 1
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self.reader.deadline = None  # the head is in; the body has its own deadline
        server = self.server
        probation = server.on_probation(self.connection)
        server.working(self.connection)
        if not ok:
            return False
        self.control = self.control or server.is_control(self.headers.get(CONTROL_HEADER))
        if probation and not self.control:
            # Accepted in the slots kept for the control plane: anyone else is told to come back.
            self.close_connection = True
            err = overloaded(f"this server is at its limit of {server.limits.max_connections} connections; "
                             f"retry in {RETRY_AFTER_S} s", "too_many_connections")
            try:
                self.send_json(err.status, err.body(), err.headers)
            except OSError:
                pass
            return False
        return True

    def read_body(self, length: int) -> bytes | None:
        """Read `length` body bytes within body_timeout; None if the body ended early."""
        self.reader.deadline = time.monotonic() + self.server.limits.body_timeout
        try:
            parts, left = [], length
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 16))
                if not chunk:
                    return None
                left -= len(chunk)
                parts.append(chunk)
            return b"".join(parts)
        except TimeoutError:
            self.close_connection = True
            raise OpenAIError(408, f"the request body did not arrive within {self.server.limits.body_timeout:g} s",
                              code="body_timeout") from None
        finally:
            self.reader.deadline = None

    def version_string(self) -> str:  # no Python version in the Server header
        return self.server.name

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        status = int(code) if str(code).isdigit() else 0
        path, client = (getattr(self, "path", "") or "").split("?")[0], self.client_address[0]
        if status >= 400:  # a flood of bad requests is collapsed per status and client (log_limits)
            self.server.log.throttled("http.request", key=f"{status} {client}", level=logging.INFO,
                                      method=self.command, path=path[:200], status=code, client=client)
        elif not self.server.quiet_reads or self.command != "GET":
            self.server.log.info("http.request", method=self.command, path=path, status=code, client=client)

    def log_message(self, fmt: str, *args: Any) -> None:
        client = self.client_address[0]
        self.server.log.throttled("http.message", key=client, level=logging.INFO, text=(fmt % args)[:200],
                                  client=client)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Errors http.server raises itself (bad request line, headers too long, timeouts): JSON too."""
        self.close_connection = True
        err = OpenAIError(code, message or explain or "malformed request")
        try:
            self.send_json(code, err.body(), err.headers)
        except OSError:
            pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _find(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        allowed = []
        for r in self.server.app.routes:
            m = r.pattern.fullmatch(path)
            if m:
                if r.method == method:
                    return r, {k: unquote(v, errors="strict") for k, v in m.groupdict().items()}
                allowed.append(r.method)
        if allowed:
            raise OpenAIError(405, f"{method} not allowed on {path} (use {', '.join(sorted(set(allowed)))})")
        raise OpenAIError(404, f"no route {method} {path}", code="not_found")

    def _dispatch(self, method: str) -> None:
        app = self.server.app
        raw_path, _, raw_query = self.path.partition("?")
        request = Request(self, method, raw_path)
        status = 500
        try:
            status = self._answer(app, request, raw_query)
        finally:
            if self.close_connection and not request.consumed:
                self._linger()
            if app.observe is not None:
                app.observe(request, status)

    def _linger(self) -> None:
        """Closing with unread input resets the connection, and the client may lose our answer
        while still uploading: stop sending, then read and drop its input for a bounded time."""
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.reader.deadline = time.monotonic() + LINGER_S
            left = LINGER_BYTES
            while left > 0 and (chunk := self.rfile.read1(min(left, 1 << 16))):
                left -= len(chunk)
        except OSError:  # timed out, reset: the connection is closed next anyway
            pass
    def _answer(self, app: App, request: Request, raw_query: str) -> int:
        """Run the route; returns the status answered (499: the client left first)."""
        try:
            try:
                request.query = dict(parse_qsl(raw_query, keep_blank_values=True, errors="strict"))
                found, request.params = self._find(request.method, request.path)
            except UnicodeDecodeError:
                raise OpenAIError(400, "path or query is not valid UTF-8 after percent-decoding") from None
            if app.authorize is not None:
                app.authorize(request, found.access)
            result = found.handler(request)
            if result is None:  # the route answered itself (a stream, a proxied response)
                return int(request.context.get("status", 200))
            if isinstance(result, Streamed):
                self._streamed(result)
                return result.status
            if isinstance(result, Raw):
                self.send_body(result.status, result.data, result.content_type)
                return result.status
            status, body = result if isinstance(result, tuple) else (200, result)
            self._json(request, status, body)
            return status
        except OpenAIError as exc:
            self._json(request, exc.status, exc.body(), exc.headers)
            return exc.status
        except RecursionError:  # input nested deeper than any parser or validator will follow
            err = OpenAIError(400, "request nested too deeply", code="invalid_json")
            self._json(request, 400, err.body())
            return 400
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
            return 499
        except Exception:  # a bug answers 500 with a body instead of dropping the connection
            self.server.log.error("http.internal_error", exc_info=True, method=request.method, path=request.path)
            self._json(request, 500, OpenAIError(500, f"internal error; {app.log_hint}", "server_error").body())
            return 500

    def _json(self, request: Request, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json")
        if not request.consumed and (self.headers.get("Content-Length", "0").strip() not in ("", "0")
                                     or self.headers.get("Transfer-Encoding")):
            # The body was not (wholly) read: it would be parsed as the next request. Close instead.
            self.close_connection = True
        try:
            self.send_json(status, body, headers)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True

    def send_body(self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        """A complete response with a known length."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        """A JSON response."""
        self.send_body(status, json.dumps(body).encode(), "application/json", headers)

    def _streamed(self, result: Streamed) -> None:
        self.send_response(result.status)
        for key, value in result.headers.items():
            self.send_header(key, value)
        self.end_headers()
        try:
            result.write(self)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
