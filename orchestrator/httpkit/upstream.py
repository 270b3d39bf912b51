"""Asking an upstream server on a client's behalf, and noticing when that client leaves.

A relay (the router in front of a coordinator, the dashboard's chat in front of the router)
learns that its client closed the connection only when a write to it fails, and it writes
only when the upstream sends something. A user who presses Stop during a long prefill (no
byte yet) or a stalled stream would keep the whole cluster working for nobody until the
next token, and a wedged stage's request until the watchdog's verdict. `ClientWatch` looks
at the client's socket from a thread of its own and, once the client has closed its side,
shuts the upstream socket down: the relay's blocked read returns at once, and the upstream
sees its own client go (the coordinator then cancels the generation).
"""

from __future__ import annotations

import http.client
import select
import socket
import threading
from typing import Self
from urllib.parse import urlsplit

WATCH_INTERVAL_S = 0.25  # how soon a closed client is noticed (and how often a pipelining one is looked at again)


def peer_closed(sock: socket.socket) -> bool:
    """True once the peer closed its side of `sock` (checked without blocking or consuming input)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except (OSError, ValueError):
        return True


def connect(url: str, timeout: float) -> http.client.HTTPConnection:
    """An open connection to `url`'s host (https where its scheme says); raises OSError if none."""
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.connect()
    except OSError:
        conn.close()
        raise
    return conn


class ClientWatch:
    """While open, shuts `upstream` down as soon as `client` has closed its connection.

    Use as a context manager around the whole exchange (request, head and relayed body);
    `gone` says afterwards whether the client left, so that a read cut short by the watch
    is not mistaken for an upstream failure.
    """

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self._client, self._upstream = client, upstream
        self._left, self._done = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="client-watch")

    @property
    def gone(self) -> bool:
        """Whether the client closed its connection while the watch was open."""
        return self._left.is_set()

    def _watch(self) -> None:
        while not self._done.is_set():
            try:
                readable, _, _ = select.select([self._client], [], [], WATCH_INTERVAL_S)
            except (OSError, ValueError):  # the client's socket was closed under us: the exchange is over
                return
            if not readable:
                continue
            if peer_closed(self._client):
                self._left.set()
                try:
                    self._upstream.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed: the exchange ended meanwhile
                return
            # Bytes of a pipelined next request: not a close; look again later, without spinning.
            self._done.wait(WATCH_INTERVAL_S)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=2 * WATCH_INTERVAL_S)
