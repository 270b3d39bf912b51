"""A threaded HTTP server that bounds what one client can hold: connections, time, bytes.

* **Connections**: at most `max_connections` at once; one more is answered `429` with
  `Retry-After` and closed (by a small, bounded set of refusal threads; past those, closed
  at once), so idle sockets can never exhaust the process's descriptors.
* **Time**: a request head must arrive whole within `header_timeout` of its first byte
  (of the accept, for a connection's first request) however slowly it trickles; a
  keep-alive connection idle for `idle_timeout` is closed; a body must arrive within
  `body_timeout`; a client that stops reading for `write_timeout` is dropped.
* **Backlog**: `backlog` pending connections (the kernel caps it at somaxconn), so a burst
  of hundreds of clients waits to be accepted instead of being reset.
* A transient `accept()` failure (EMFILE, ENFILE, ENOBUFS, ECONNABORTED) is logged and
  retried after a short pause, never a busy loop.

Limits come from the constructor or from `PIPESERVE_HTTP_*` environment variables.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from http.server import ThreadingHTTPServer
from typing import Any

from ..logs import EventLogger
from .errors import RETRY_AFTER_S, overloaded
from .handler import App, Handler

REFUSERS = 64  # threads that may be answering "429, come back later" at once
REFUSE_LINGER_S = 1.0  # how long a refused client may take to send its request before we close


def default_max_connections() -> int:
    """Half the descriptor limit (a proxied connection holds two), at most 1024."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 4096
    return max(16, min(1024, (soft - 64) // 2))


@dataclass(frozen=True)
class Limits:
    """What one server allows; see the module docstring."""

    max_connections: int = field(default_factory=default_max_connections)
    header_timeout: float = 10.0
    idle_timeout: float = 30.0
    body_timeout: float = 60.0
    write_timeout: float = 120.0
    backlog: int = 1024

    def with_env(self, environ: dict[str, str] | None = None) -> "Limits":
        """These limits with `PIPESERVE_HTTP_MAX_CONNECTIONS`, `_HEADER_TIMEOUT`, `_IDLE_TIMEOUT`,
        `_BODY_TIMEOUT` and `_WRITE_TIMEOUT` applied where set (ValueError names a bad one)."""
        env = os.environ if environ is None else environ
        changes: dict[str, Any] = {}
        for name, cast in (("max_connections", int), ("header_timeout", float), ("idle_timeout", float),
                           ("body_timeout", float), ("write_timeout", float)):
            key = f"PIPESERVE_HTTP_{name.upper()}"
            if env.get(key):
                try:
                    value = cast(env[key])
                    if value <= 0:
                        raise ValueError
                except ValueError:
                    raise ValueError(f"{key} must be a positive number, not {env[key]!r}") from None
                changes[name] = value
        return replace(self, **changes)


class Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with bounded connections and timeouts, serving `app`'s routes."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], app: App, log: EventLogger, limits: Limits | None = None,
                 name: str = "pipeserve", quiet_reads: bool = False) -> None:
        self.app = app
        self.log = log
        self.limits = limits or Limits()
        self.name = name
        self.quiet_reads = quiet_reads  # log successful GETs? (an agent is polled for progress)
        self.request_queue_size = self.limits.backlog
        self._lock = threading.Lock()
        self._active = 0
        self._refusing = 0
        self.refused = 0
        super().__init__(address, Handler)

    @property
    def active_connections(self) -> int:
        """Connections being served now."""
        return self._active

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            # EMFILE and friends: the listener stays readable, so without a pause serve_forever
            # would spin; socketserver drops the error and keeps serving after it.
            self.log.warning("http.accept_failed", reason=exc)
            time.sleep(0.05)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            full = self._active >= self.limits.max_connections
            if not full:
                self._active += 1
        if full:
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread could be started: the slot is not in use
            with self._lock:
                self._active -= 1
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._active -= 1

    def _refuse(self, sock: socket.socket) -> None:
        with self._lock:
            self.refused += 1
            spare = self._refusing < REFUSERS
            if spare:
                self._refusing += 1
        if not spare:  # refusal threads are busy too: the cheapest refusal is a close
            self.shutdown_request(sock)
            return
        if self.refused == 1 or self.refused % 100 == 0:
            self.log.warning("http.connections_full", limit=self.limits.max_connections, refused=self.refused)
        threading.Thread(target=self._refusal, args=(sock,), daemon=True).start()

    def _refusal(self, sock: socket.socket) -> None:
        err = overloaded(f"this server is at its limit of {self.limits.max_connections} connections; "
                         f"retry in {RETRY_AFTER_S} s", "too_many_connections")
        body = json.dumps(err.body()).encode()
        head = (f"HTTP/1.1 429 Too Many Requests\r\nServer: {self.name}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: {RETRY_AFTER_S}\r\nConnection: close\r\n\r\n")
        try:
            sock.settimeout(REFUSE_LINGER_S)
            _read_head(sock)  # closing with an unread request would reset the connection, losing our answer
            sock.sendall(head.encode() + body)
            sock.shutdown(socket.SHUT_WR)
            _drain(sock)
        except OSError:
            pass
        finally:
            sock.close()
            with self._lock:
                self._refusing -= 1


def _read_head(sock: socket.socket, limit: int = 65536) -> None:
    """Read what the refused client sends first (up to its request head, or a silent second)."""
    got = b""
    deadline = time.monotonic() + REFUSE_LINGER_S
    try:
        while b"\r\n\r\n" not in got and len(got) < limit and time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                return
            got += chunk
    except TimeoutError:  # a silent client still gets its answer
        return


def _drain(sock: socket.socket) -> None:
    deadline = time.monotonic() + REFUSE_LINGER_S
    while time.monotonic() < deadline:
        if not sock.recv(65536):
            return

