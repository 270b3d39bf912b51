"""A small HTTP server that plays a (malicious) peer agent for download tests.

Each file path maps to a behaviour; the server records every request it got (path and
Authorization header) and how many body bytes it managed to send, so a test can tell what
the downloading agent asked for and what it swallowed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.support.stub_http import StubHandler, StubServer

Behaviour = Callable[["FakePeerHandler"], None]


@dataclass
class FakePeer:
    """`behaviours` maps a request path to what the server does; unknown paths get 404."""

    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: StubServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def start(self) -> "FakePeer":
        peer = self

        class Handler(FakePeerHandler):
            fake = peer

        self.server = StubServer(Handler).start()
        return self

    def close(self) -> None:
        self.stop.set()
        if self.server is not None:
            self.server.close()

    def paths(self) -> list[str]:
        with self.lock:
            return [p for p, _ in self.requests]


class FakePeerHandler(StubHandler):
    """Dispatches GETs to the FakePeer's behaviours."""

    fake: FakePeer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        with self.fake.lock:
            self.fake.requests.append((self.path, self.headers.get("Authorization")))
        behaviour = self.fake.behaviours.get(self.path.split("?")[0])
        if behaviour is None:
            self.reply(404, b'{"error": {"message": "no such file"}}')
            return
        try:
            behaviour(self)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the agent hung up on us: exactly what a capped download should do

    def reply(self, status: int, body: bytes, headers: dict[str, str] | None = None,
              content_type: str | None = None) -> None:
        """One whole answer, its body counted as sent (`send`)."""
        self.send_response(status)
        extra = {"Content-Type": content_type} if content_type else {}
        for k, v in {"Content-Length": str(len(body)), **extra, **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        self.send(body)

    def send(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()
        with self.fake.lock:
            self.fake.sent += len(data)


def serve(body: bytes) -> Behaviour:
    """An honest file (Range supported)."""

    def run(h: FakePeerHandler) -> None:
        rng = h.headers.get("Range")
        if rng:
            start = int(rng.split("=")[1].split("-")[0])
            h.reply(206, body[start:], {"Content-Range": f"bytes {start}-{len(body) - 1}/{len(body)}"})
        else:
            h.reply(200, body)

    return run


def flood(total: int, declare_length: bool) -> Behaviour:
    """A peer that sends `total` bytes whatever the file's size; with or without saying so in Content-Length."""

    def run(h: FakePeerHandler) -> None:
        h.send_response(200)
        if declare_length:
            h.send_header("Content-Length", str(total))
        else:
            h.send_header("Connection", "close")  # no length: the body ends when the connection does
        h.end_headers()
        block = b"x" * (1 << 20)
        left = total
        while left > 0 and not h.fake.stop.is_set():
            h.send(block[:left])
            left -= len(block)
        h.close_connection = True

    return run


def trickle(declared: int, interval: float = 0.2) -> Behaviour:
    """A peer that announces `declared` bytes and then sends one byte per `interval` (a download in progress)."""

    def run(h: FakePeerHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(declared))
        h.end_headers()
        while not h.fake.stop.is_set():
            h.send(b"x")
            time.sleep(interval)
        h.close_connection = True

    return run


def redirect(location: str) -> Behaviour:
    """A 302 to `location`."""
    return lambda h: h.reply(302, b"", {"Location": location})


def status(code: int, body: bytes) -> Behaviour:
    """An error answer with an arbitrary body."""
    return lambda h: h.reply(code, body, {"Content-Type": "text/html"})


def short_whole(body: bytes, keep: int) -> Behaviour:
    """A peer that answers every GET, a resume's `Range` included, with `200` and the whole file's
    length, sends only its first `keep` bytes and hangs up: each resume restarts the file."""

    def run(h: FakePeerHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.send(body[:keep])
        h.close_connection = True

    return run
