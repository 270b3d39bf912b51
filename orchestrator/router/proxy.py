"""Forward one request to a backend and relay the answer unchanged, piece by piece.

The body bytes, status code and reason, and end-to-end headers pass through as the backend
sent them (errors included: a coordinator's 400 or 429 reaches the client as it was). Only
hop-by-hop framing is redone: a response without a length (server-sent events) is relayed
as chunked transfer encoding, one chunk per piece read, flushed at once, so tokens reach
the client as soon as the backend writes them.

A backend that refuses the connection cannot have seen the request, so the next healthy
backend for the model is tried; when none is left the router answers 503 with Retry-After.
Once the request has been sent it is never re-sent (a generation is not idempotent): a
backend that closes the connection before answering is 503 with Retry-After too (nothing
reached the client; the client decides), and one that breaks off mid-answer ends the
client's stream with an error event. A client that leaves first has its backend connection
shut down at once, even while the backend is still silent (a prefill): the coordinator sees
its client go and cancels the generation.
"""

from __future__ import annotations

import http.client
import json
from contextlib import closing
from http.server import BaseHTTPRequestHandler
from typing import NoReturn
from urllib.parse import urlsplit

from orchestrator.cache_scope import SCOPE_HEADER
from orchestrator.httpkit import OpenAIError, as_anthropic
from orchestrator.httpkit.upstream import ClientWatch, connect
from orchestrator.router.service import RouterService
from orchestrator.router.table import Route

CONNECT_TIMEOUT = 3.0  # a LAN backend that has not accepted in 3 s is down: fail over
READ_TIMEOUT = 600.0  # between two bytes of an answer; generation can be slow but not silent for this long
PIECE = 64 * 1024

# RFC 9110 §7.6.1 hop-by-hop headers, plus those the proxy sets itself.
# `expect` too: the router has read the whole body before it connects to a backend.
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "content-length", "expect"}
_OWN_RESPONSE = {"server", "date"}  # BaseHTTPRequestHandler.send_response writes its own


class ClientGone(Exception):
    """The client closed its connection before the answer was complete (its backend's name)."""


class BackendFailed(Exception):
    """The backend broke off after the request was sent: not retried."""


def _drop(headers: http.client.HTTPMessage) -> set[str]:
    named = {t.strip().lower() for v in headers.get_all("Connection", []) for t in v.split(",")}
    return _HOP | named


def upstream_headers(client: http.client.HTTPMessage, route: Route, client_ip: str, length: int,
                     scope: str | None = None) -> dict[str, str]:
    """Headers to send to the backend: the client's end-to-end headers, our Host and length, and
    the caller's prompt-cache `scope` — never one the client sent, so no client picks another's."""
    drop = _drop(client) | {SCOPE_HEADER.lower()}
    out = {k: v for k, v in client.items() if k.lower() not in drop}
    if scope:
        out[SCOPE_HEADER] = scope
    out["Host"] = urlsplit(route.url).netloc
    out["Content-Length"] = str(length)
    prior = client.get("X-Forwarded-For")
    out["X-Forwarded-For"] = f"{prior}, {client_ip}" if prior else client_ip
    return out


def ask(conn: http.client.HTTPConnection, route: Route, method: str, path: str, headers: dict[str, str],
        body: bytes) -> http.client.HTTPResponse:
    """Send the request on an open connection and read the response head."""
    try:
        assert conn.sock is not None
        conn.sock.settimeout(READ_TIMEOUT)
        conn.request(method, urlsplit(route.url).path + path, body=body, headers=headers)
        return conn.getresponse()
    except (OSError, http.client.HTTPException) as exc:
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


def is_anthropic(path: str) -> bool:
    """Whether a path is Anthropic's Messages API (its clients read errors in Anthropic's shape)."""
    return path.split("?")[0].rstrip("/") in ("/v1/messages", "/v1/messages/count_tokens")


def client_error(path: str, err: OpenAIError) -> OpenAIError:
    """`err` in the shape the client of `path` reads."""
    return as_anthropic(err) if is_anthropic(path) else err


def _error_event(path: str, err: OpenAIError) -> bytes:
    """A stream's last event, saying why it ends, as the path's client reads it: Anthropic's
    `error` event; OpenAI's `{"error": ...}` (the openai client raises on it), for the Responses
    API also named `error` with its documented fields (code, message, param)."""
    if is_anthropic(path):
        return b"event: error\ndata: " + json.dumps(as_anthropic(err).body()).encode() + b"\n\n"
    if path.startswith("/v1/responses"):
        body = {"type": "error", "code": err.code, "message": err.message, "param": None, **err.body()}
        return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"
    return b"data: " + json.dumps(err.body()).encode() + b"\n\n"


def _broken_off(handler: BaseHTTPRequestHandler, exc: Exception, sse: bool) -> NoReturn:
    """The backend broke off mid-answer: end what the client has, then raise BackendFailed.

    A stream gets an error event in its API's shape (the clients raise on it instead of
    waiting); anything else can only be cut short, with the connection closed.
    """
    handler.close_connection = True
    reason = f"{type(exc).__name__}: {exc}"
    if sse:
        data = _error_event(handler.path, OpenAIError(502, f"the backend broke off the stream: {reason}",
                                                      "server_error", code="bad_gateway"))
        handler.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        handler.wfile.flush()
    raise BackendFailed(reason)


def forward(service: RouterService, handler: BaseHTTPRequestHandler, path: str, body: bytes,
            model: str, key: str | None = None, scope: str | None = None) -> tuple[str, int]:
    """Send a request for `model` to a healthy backend and relay the answer.

    `key`: the request's affinity key (prefix-aware routing), or None; `scope`: the caller's
    prompt-cache scope (orchestrator/cache_scope.py), or None.

    Returns (backend name, status). Raises OpenAIError for 404 / 503 answered by the router
    itself (before anything was written), BackendFailed after a partial answer, and ClientGone
    when the client left first (the backend's connection is shut down at once: it cancels).
    """
    tried: set[str] = set()
    failures: list[str] = []
    while True:
        route = service.pick(model, frozenset(tried), key)
        if route is None:
            if not tried:
                raise service.no_route_error(model)
            # None of them can have seen the request: "come back soon" (a coordinator being
            # replaced is back within seconds), never a 5xx that reads as a broken gateway.
            raise OpenAIError(503, f"Could not connect to any backend serving '{model}': {'; '.join(failures)}",
                              "service_unavailable", code="backend_unavailable")
        headers = upstream_headers(handler.headers, route, handler.client_address[0], len(body), scope)
        try:
            conn = connect(route.url, CONNECT_TIMEOUT)
        except OSError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            tried.add(route.name)
            failures.append(f"{route.name}: {reason}")
            service.report_connect_failure(route, reason)
            continue
        # From here on the client may leave at any time: a prefill or a stall writes nothing
        # the client's absence would show on, so a watch tells the backend at once.
        with closing(conn), ClientWatch(handler.connection, conn.sock) as watch:
            try:
                resp = ask(conn, route, handler.command, path, headers, body)
            except BackendFailed as exc:
                if watch.gone:
                    raise ClientGone(route.name) from None
                # Nothing reached the client yet: the backend closed or reset the connection before
                # answering (a coordinator killed or restarting). 503 with Retry-After, not 502.
                service.log.warning("proxy.backend_failed", backend=route.name, reason=exc)
                service.report_connect_failure(route, str(exc))
                raise OpenAIError(503, f"Backend '{route.name}' closed the connection before answering ({exc}); "
                                       "retry shortly", "service_unavailable", code="backend_unavailable") from None
            if resp.status == 503:  # relayed unchanged (Retry-After included), and no more traffic until ready
                service.report_unavailable(route, resp.status)
            try:
                relay(handler, resp)
            except (BackendFailed, OSError):
                if watch.gone:
                    raise ClientGone(route.name) from None
                raise
            if watch.gone:  # the watch cut the body short: it read as an end
                raise ClientGone(route.name)
        return route.name, resp.status
