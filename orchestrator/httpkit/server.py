"""A threaded HTTP server that bounds what one client can hold: connections, time, bytes.

* **Connections**: at most `max_connections` at once. A connection still waiting for its
  request head is *idle*. When the server is full, a newcomer waits (`triage.py`, one poll
  loop, no thread) until it sends its first bytes — a silent one is closed after
  `header_timeout`, as it would be in a slot, so a flood does not churn — and then
  takes the slot of the oldest idle connection (which is closed), so idle or trickling sockets
  can never keep a client that sends its request at once from being served. When every slot is
  serving a request, up to `reserve` more connections are accepted *on probation*: only a
  request carrying the control plane's token (`CONTROL_HEADER`, compared in constant time) is
  served there, any other is answered `429`. Past that, one more is answered `429` with
  `Retry-After` and closed (by a small, bounded set of refusal threads; past those, closed at
  once), so sockets can never exhaust the process's descriptors.
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

import hmac
import itertools
import json
import resource
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import ThreadingHTTPServer
from typing import Any, TypeVar

from orchestrator import settings
from orchestrator.httpkit.errors import RETRY_AFTER_S, overloaded
from orchestrator.httpkit.handler import App, Handler
from orchestrator.httpkit.triage import Triage
from orchestrator.logs import EventLogger

RESERVED_SLOTS = 16  # connections past max_connections that only the control plane may use
EVICTION_SCAN = 16  # idle connections looked at for a victim per accept (oldest first)
TRIAGE_LIMIT = 1024  # newcomers of a full server waiting for their first bytes (one poll loop), at most
REFUSERS = 64  # threads that may be answering "429, come back later" at once
REFUSE_LINGER_S = 1.0  # how long a refused client may take to send its request before we close


def _descriptor_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 4096 if soft == resource.RLIM_INFINITY else soft


def default_max_connections() -> int:
    """Half the descriptor limit (a proxied connection holds two), at most 1024."""
    return max(16, min(1024, (_descriptor_limit() - 64) // 2))


@dataclass(frozen=True)
class Limits:
    """What one server allows; see the module docstring."""

    max_connections: int = field(default_factory=default_max_connections)
    header_timeout: float = 10.0
    idle_timeout: float = 30.0
    body_timeout: float = 60.0
    write_timeout: float = 120.0
    backlog: int = 1024
    reserve: int = RESERVED_SLOTS

    def with_env(self, environ: dict[str, str] | None = None) -> "Limits":
        """These limits with `PIPESERVE_HTTP_MAX_CONNECTIONS`, `_HEADER_TIMEOUT`, `_IDLE_TIMEOUT`,
        `_BODY_TIMEOUT` and `_WRITE_TIMEOUT` applied where set (ValueError names a bad one)."""
        changes: dict[str, Any] = {}
        for name, setting in (("max_connections", settings.HTTP_MAX_CONNECTIONS),
                              ("header_timeout", settings.HTTP_HEADER_TIMEOUT),
                              ("idle_timeout", settings.HTTP_IDLE_TIMEOUT),
                              ("body_timeout", settings.HTTP_BODY_TIMEOUT),
                              ("write_timeout", settings.HTTP_WRITE_TIMEOUT)):
            value = setting.read(environ)  # SettingError (a ValueError) names a bad one
            if value is not None:
                changes[name] = value
        return replace(self, **changes)


class Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with bounded connections and timeouts, serving `app`'s routes."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], app: App, log: EventLogger, limits: Limits | None = None,
                 name: str = "pipeserve", quiet_reads: bool = False, control_token: str | None = None) -> None:
        self.app = app
        self.log = log
        self.limits = limits or Limits()
        self.name = name
        self.quiet_reads = quiet_reads  # log successful GETs? (an agent is polled for progress)
        self.control_token = control_token  # None: no request is the control plane's
        self.request_queue_size = self.limits.backlog
        self._lock = threading.Lock()
        self._active = 0
        self._refusing = 0
        self._idle: dict[socket.socket, float] = {}  # connections awaiting a request head -> since, oldest first
        self._probation: set[socket.socket] = set()  # accepted in the reserve: control requests only
        self.refused = 0
        self.evicted = 0
        # As many waiting as the descriptors left beside the slots allow: a flood larger than
        # slots + triage only pushes its own sockets out (each of its reconnects costs one).
        spare = _descriptor_limit() - 2 * self.limits.max_connections - 64
        self._triage = Triage(self._admit, limit=max(256, min(TRIAGE_LIMIT, spare)), wait_s=self.limits.header_timeout)
        super().__init__(address, Handler)

    def server_close(self) -> None:
        super().server_close()
        self._triage.close()

    def is_control(self, token: str | None) -> bool:
        """Whether a request's `CONTROL_HEADER` value is this server's control token."""
        return bool(self.control_token and token and hmac.compare_digest(token.strip(), self.control_token))

    def waiting(self, sock: socket.socket) -> None:
        """The connection is waiting for a request head: it may be evicted for a newcomer."""
        with self._lock:
            self._idle.pop(sock, None)
            self._idle[sock] = time.monotonic()

    def working(self, sock: socket.socket) -> None:
        """The connection has a request (or is closing): it keeps its slot."""
        with self._lock:
            self._idle.pop(sock, None)
            self._probation.discard(sock)

    def on_probation(self, sock: socket.socket) -> bool:
        """Whether the connection was accepted in the reserve (only control requests are served)."""
        with self._lock:
            return sock in self._probation

    @property
    def active_connections(self) -> int:
        """Connections being served now."""
        return self._active

    @property
    def busy_connections(self) -> int:
        """Connections with a request being answered now (not waiting, idle, for their next one)."""
        with self._lock:
            return self._active - len(self._idle)

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
            free = self._active < self.limits.max_connections
            if free:
                self._active += 1
                self._idle[request] = time.monotonic()
        if free:
            self._start(request, client_address)
        else:  # full: it must send something before it may take anyone's slot
            self._triage.add(request, client_address)

    def _admit(self, request: socket.socket, client_address: Any) -> None:
        """A newcomer to a full server has sent its first bytes (the triage thread): it takes the
        slot of the oldest idle connection, else a reserved slot on probation, else 429."""
        victim = None
        with self._lock:
            cap = self.limits.max_connections + self.limits.reserve
            admitted = True
            if self._active < self.limits.max_connections:
                pass  # a slot came free meanwhile
            elif self._active < cap + self.limits.reserve and (victim := self._victim()) is not None:
                del self._idle[victim]  # its thread leaves at once; the extra reserve covers the overlap
                self._probation.discard(victim)
                self.evicted += 1
            elif self._active < cap:
                self._probation.add(request)
            else:
                admitted = False
            if admitted:
                self._active += 1
                self._idle[request] = time.monotonic()
        if victim is not None:
            self._evict(victim)
        if admitted:
            self._start(request, client_address)
        else:
            self._refuse(request)

    def _start(self, request: socket.socket, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread could be started: the slot is not in use
            with self._lock:
                self._active -= 1
                self._idle.pop(request, None)
                self._probation.discard(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._active -= 1
                self._idle.pop(request, None)
                self._probation.discard(request)

    def _victim(self) -> socket.socket | None:
        """The oldest idle connection with nothing waiting to be read: one whose request (or
        close) just arrived is about to be handled by its thread, and keeps its slot. Called
        under the lock; one poll with no wait (a socket's own recv would wait its timeout)."""
        scan = list(itertools.islice(self._idle, EVICTION_SCAN))
        poller = select.poll()
        for sock in scan:
            try:
                poller.register(sock, select.POLLIN)
            except (OSError, ValueError):
                continue  # closed meanwhile: its thread is leaving
        ready = {fd for fd, _ in poller.poll(0)}
        return next((sock for sock in scan if sock.fileno() >= 0 and sock.fileno() not in ready), None)

    def _evict(self, sock: socket.socket) -> None:
        """End an idle connection: its thread's read returns and it leaves (its slot is the newcomer's)."""
        if self.evicted == 1 or self.evicted % 1000 == 0:
            self.log.warning("http.idle_evicted", limit=self.limits.max_connections, evicted=self.evicted)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

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



S = TypeVar("S")


def bound(make: Callable[[], S], log: EventLogger, address: str) -> S | int:
    """The server `make` binds, or the process's exit status, logged: 2 for a bad PIPESERVE_HTTP_*
    setting, 3 for an address that cannot be bound (the coordinator's and the router's one rule)."""
    try:
        return make()
    except ValueError as exc:  # a bad PIPESERVE_HTTP_* setting
        log.error("config.invalid", reason=exc)
        return 2
    except OSError as exc:
        log.error("http.bind_failed", address=address, reason=exc)
        return 3
