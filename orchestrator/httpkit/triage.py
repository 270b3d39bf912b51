"""Where a connection waits when the server is full: until it sends something, for a second at most.

A full server cannot tell at accept time a client that is about to send its request from a
socket that will never send anything (the flood). Giving the slot of an idle connection to a
newcomer that has not sent anything yet lets a flood evict itself — and the control plane's
connection with it. So a newcomer to a full server waits here, in one poll loop (one thread,
no thread per socket), until its first bytes arrive: then it is handed to `admit` (which
evicts an idle connection for it, or puts it on probation, or refuses it with 429). A
newcomer silent for `wait_s` is closed; past `limit` waiting, the one waiting longest with
nothing sent is.
A client that sends its request at once is here for microseconds, however large the flood.
"""

from __future__ import annotations

import itertools
import select
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

Admit = Callable[[socket.socket, Any], None]
SCAN = 32  # waiting sockets looked at (oldest first) for a silent one to push out when full


class Triage:
    """Newcomers of a full server, waiting for their first bytes (thread-safe; one daemon thread)."""

    def __init__(self, admit: Admit, limit: int = 1024, wait_s: float = 1.0) -> None:
        self._admit = admit
        self.limit = limit
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._waiting: OrderedDict[socket.socket, tuple[Any, float]] = OrderedDict()  # sock -> (address, since)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._closed = False
        self.dropped = 0  # newcomers closed silent (waited too long, or pushed out by newer ones)
        threading.Thread(target=self._loop, name="http-triage", daemon=True).start()

    def add(self, sock: socket.socket, address: Any) -> None:
        """Wait for `sock`'s first bytes, then admit it."""
        pushed = None
        with self._lock:
            if len(self._waiting) >= self.limit:
                pushed = self._silent_oldest()
                del self._waiting[pushed]
                self._unregister(pushed)
            self._waiting[sock] = (address, time.monotonic())
            try:
                self._selector.register(sock, selectors.EVENT_READ)
            except (OSError, ValueError):
                del self._waiting[sock]
                pushed = pushed or sock
        if pushed is not None:
            self._drop(pushed)
        try:
            self._wake_w.send(b"\0")
        except OSError:  # the wake-up pipe is full: the loop is awake anyway
            pass

    def _silent_oldest(self) -> socket.socket:
        """The oldest waiting socket with nothing to read (under the lock): one whose request just
        arrived, not yet seen by the loop on a busy machine, must not be pushed out for the flood's
        newcomers (the control plane's look was reset so under load)."""
        scan = list(itertools.islice(self._waiting, SCAN))
        poller = select.poll()
        for sock in scan:
            try:
                poller.register(sock, select.POLLIN)
            except (OSError, ValueError):
                return sock
        ready = {fd for fd, _ in poller.poll(0)}
        return next((sock for sock in scan if sock.fileno() not in ready), scan[0])

    def close(self) -> None:
        """Stop the loop and close every waiting socket."""
        with self._lock:
            self._closed = True
            waiting = list(self._waiting)
            self._waiting.clear()
        for sock in waiting:
            self._drop(sock)
        self._wake_w.send(b"\0")

    def _unregister(self, sock: socket.socket) -> None:
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError, OSError):
            pass

    def _drop(self, sock: socket.socket) -> None:
        self.dropped += 1
        try:
            sock.close()
        except OSError:
            pass

    def _loop(self) -> None:
        while not self._closed:
            for key, _ in self._selector.select(timeout=0.1):
                if key.fileobj is self._wake_r:
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except BlockingIOError:
                        pass
                    continue
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                with self._lock:
                    entry = self._waiting.pop(sock, None)
                    self._unregister(sock)
                if entry is not None:
                    self._admit(sock, entry[0])
            expired = []
            with self._lock:
                deadline = time.monotonic() - self.wait_s
                while self._waiting:
                    sock, (_, since) = next(iter(self._waiting.items()))
                    if since > deadline:
                        break
                    del self._waiting[sock]
                    self._unregister(sock)
                    expired.append(sock)
            for sock in expired:
                self._drop(sock)
