"""The one way a test runs a stand-in HTTP server: a peer, a hub, a router's admin API, a coordinator.

Stand-ins only at the true external seams (a hostile peer, the Hugging Face Hub, continuum-router's
admin API) or where a test needs a server to misbehave on cue. Each is a `StubServer` around its own
handler: a free loopback port, served from a daemon thread, closed (socket included) by `close()`.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class StubServer(ThreadingHTTPServer):
    """A threaded HTTP server (127.0.0.1 and a free port unless told); `start()` serves, `close()` closes."""

    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler], host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__((host, port), handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.server_address[1]}"

    def start(self) -> Self:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                                        name=f"stub-{type(self).__name__}")
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and close the listening socket (else a ResourceWarning, later, elsewhere)."""
        if self._thread is not None:
            self.shutdown()
            self._thread = None
        self.server_close()

    def __enter__(self) -> Self:
        return self if self._thread is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class StubHandler(BaseHTTPRequestHandler):
    """A handler that logs nothing and answers with `reply`."""

    def log_message(self, *args: object) -> None:
        pass

    def reply(self, status: int, body: bytes, headers: dict[str, str] | None = None,
              content_type: str | None = "application/json", reason: str | None = None) -> None:
        """One whole answer with its Content-Length (and a reason phrase of its own, if given)."""
        self.send_response(status, reason)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
