"""What the standard-library HTTP servers of pipeserve share (coordinator, router).

Both speak HTTP/1.1 with keep-alive, answer JSON bodies and Prometheus text, and send
their access lines to the structured log instead of stderr.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any

from .logs import EventLogger


class JsonHandler(BaseHTTPRequestHandler):
    """Base handler: subclasses say where their structured log is (`event_log`)."""

    protocol_version = "HTTP/1.1"

    @property
    def event_log(self) -> EventLogger:
        """The process's structured logger."""
        raise NotImplementedError

    def log_message(self, fmt: str, *args: Any) -> None:  # access lines go to the structured log
        self.event_log.info("http.request", line=fmt % args)

    def send_body(self, status: int, data: bytes, content_type: str) -> None:
        """A complete response with a known length (the connection stays usable)."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_json(self, status: int, body: Any) -> None:
        """A JSON response."""
        self.send_body(status, json.dumps(body).encode(), "application/json")

    def send_metrics(self, text: str) -> None:
        """Prometheus exposition text."""
        self.send_body(200, text.encode(), "text/plain; version=0.0.4")
