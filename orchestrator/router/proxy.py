"""Forward one request to a backend and relay the answer unchanged, piece by piece.

The body bytes, status code and reason, and end-to-end headers pass through as the backend
sent them (errors included: a coordinator's 400 or 429 reaches the client as it was). Only
hop-by-hop framing is redone: a response without a length (server-sent events) is relayed
as chunked transfer encoding, one chunk per piece read, flushed at once, so tokens reach
the client as soon as the backend writes them.

A backend that refuses the connection cannot have seen the request, so the next healthy
backend for the model is tried; once the request has been sent it is never re-sent (a
generation is not idempotent) and a failure answers 502.
"""

from __future__ import annotations

import http.client
import json
from http.server import BaseHTTPRequestHandler
from typing import NoReturn
from urllib.parse import urlsplit

from ..httpkit import OpenAIError
from .service import RouterService
from .table import Route

CONNECT_TIMEOUT = 3.0  # a LAN backend that has not accepted in 3 s is down: fail over
READ_TIMEOUT = 600.0  # between two bytes of an answer; generation can be slow but not silent for this long
PIECE = 64 * 1024

# RFC 9110 §7.6.1 hop-by-hop headers, plus those the proxy sets itself.
# `expect` too: the router has read the whole body before it connects to a backend.
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "content-length", "expect"}
_OWN_RESPONSE = {"server", "date"}  # BaseHTTPRequestHandler.send_response writes its own


class BackendUnreachable(Exception):
    """The TCP connection to the backend could not be opened: safe to try another backend."""


class BackendFailed(Exception):
    """The backend broke off after the request was sent: not retried."""


def _drop(headers: http.client.HTTPMessage) -> set[str]:
    named = {t.strip().lower() for v in headers.get_all("Connection", []) for t in v.split(",")}
    return _HOP | named


def upstream_headers(client: http.client.HTTPMessage, route: Route, client_ip: str, length: int) -> dict[str, str]:
    """Headers to send to the backend: the client's end-to-end headers, our Host and length."""
    drop = _drop(client)
    out = {k: v for k, v in client.items() if k.lower() not in drop}
    out["Host"] = urlsplit(route.url).netloc
    out["Content-Length"] = str(length)
    prior = client.get("X-Forwarded-For")
    out["X-Forwarded-For"] = f"{prior}, {client_ip}" if prior else client_ip
    return out


def open_upstream(route: Route, method: str, path: str, headers: dict[str, str],
                  body: bytes) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Connect, send the request and read the response head."""
    parts = urlsplit(route.url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=CONNECT_TIMEOUT)
    try:
        conn.connect()
    except OSError as exc:
        conn.close()
        raise BackendUnreachable(f"{type(exc).__name__}: {exc}") from None
    try:
        assert conn.sock is not None
        conn.sock.settimeout(READ_TIMEOUT)
        conn.request(method, parts.path + path, body=body, headers=headers)
        return conn, conn.getresponse()
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        raise BackendFailed(f"{type(exc).__name__}: {exc}") from None


def relay(handler: BaseHTTPRequestHandler, resp: http.client.HTTPResponse) -> None:
    """Write the backend's response to the client as it arrives."""
    status = resp.status
    drop = _drop(resp.headers) | _OWN_RESPONSE
    handler.send_response(status, resp.reason)
    for k, v in resp.headers.items():
        if k.lower() not in drop:
            handler.send_header(k, v)
    bodyless = status in (204, 304) or 100 <= status < 200 or handler.command == "HEAD"
    length = resp.getheader("Content-Length") if not resp.chunked else None
    # An HTTP/1.0 client knows no chunked encoding: it gets the raw bytes and the close.
    chunked = not bodyless and length is None and handler.request_version != "HTTP/1.0"
    if bodyless:
        handler.send_header("Content-Length", "0")
    elif chunked:
        handler.send_header("Transfer-Encoding", "chunked")
    elif length is not None:
        handler.send_header("Content-Length", str(length))
    else:
        handler.close_connection = True
    handler.end_headers()
    if bodyless:
        return
    out = handler.wfile
    sse = (resp.getheader("Content-Type") or "").startswith("text/event-stream")
    while True:
        try:
            piece = resp.read1(PIECE)
        except (OSError, http.client.HTTPException) as exc:
            _broken_off(handler, exc, chunked and sse)
        if not piece:
            break
        # A client that went away raises here (BrokenPipeError) and ends the handler, which
        # closes the backend connection: the coordinator then cancels the generation.
        out.write(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
        out.flush()
    if chunked:
        out.write(b"0\r\n\r\n")
        out.flush()


def _broken_off(handler: BaseHTTPRequestHandler, exc: Exception, sse: bool) -> NoReturn:
    """The backend broke off mid-answer: end what the client has, then raise BackendFailed.

    A stream gets an OpenAI error event (the openai client raises on it instead of waiting);
    anything else can only be cut short, with the connection closed.
    """
    handler.close_connection = True
    reason = f"{type(exc).__name__}: {exc}"
    if sse:
        event = json.dumps(OpenAIError(502, f"the backend broke off the stream: {reason}", "server_error").body())
        data = b"data: " + event.encode() + b"\n\n"
        handler.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        handler.wfile.flush()
    raise BackendFailed(reason)


def forward(service: RouterService, handler: BaseHTTPRequestHandler, path: str, body: bytes,
            model: str) -> tuple[str, int]:
    """Send a request for `model` to a healthy backend and relay the answer.

    Returns (backend name, status). Raises OpenAIError for 404 / 503 / 502 answered by the
    router itself (before anything was written), and BackendFailed after a partial answer.
    """
    tried: set[str] = set()
    failures: list[str] = []
    while True:
        route = service.pick(model, frozenset(tried))
        if route is None:
            if not tried:
                raise service.no_route_error(model)
            raise OpenAIError(502, f"Could not connect to any backend serving '{model}': {'; '.join(failures)}",
                              "server_error", code="bad_gateway")
        headers = upstream_headers(handler.headers, route, handler.client_address[0], len(body))
        try:
            conn, resp = open_upstream(route, handler.command, path, headers, body)
        except BackendUnreachable as exc:
            tried.add(route.name)
            failures.append(f"{route.name}: {exc}")
            service.report_connect_failure(route, str(exc))
            continue
        except BackendFailed as exc:
            service.log.warning("proxy.backend_failed", backend=route.name, reason=exc)
            raise OpenAIError(502, f"Backend '{route.name}' failed: {exc}", "server_error",
                              code="bad_gateway") from None
        if resp.status == 503:  # relayed unchanged (Retry-After included), and no more traffic until ready
            service.report_unavailable(route, resp.status)
        try:
            relay(handler, resp)
        finally:
            conn.close()
        return route.name, resp.status
