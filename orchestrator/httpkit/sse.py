"""Server-sent events over chunked transfer encoding, written as they are produced."""

from __future__ import annotations

import json
from typing import Any


class EventStream:
    """`send(obj, event=None)` writes one `data:` event (JSON, or raw bytes such as b"[DONE]"), named by
    an `event:` line when given (Anthropic's and the Responses API's streams name every event);
    `end()` finishes.

    The response head goes out with the first event, so a route can still answer a plain
    JSON error while nothing has been sent (`started` says which).
    """

    def __init__(self, handler: Any) -> None:
        self.handler = handler
        self.started = False

    def start(self, status: int = 200) -> None:
        """Send the response head (once)."""
        if self.started:
            return
        h = self.handler
        h.send_response(status)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Cache-Control", "no-cache")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        self.started = True

    def send(self, obj: Any, event: str | None = None) -> None:
        """One event, flushed at once."""
        self.start()
        data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
        if event is not None:
            data = b"event: " + event.encode() + b"\n" + data
        self.handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.handler.wfile.flush()

    def comment(self, text: str = "keep-alive") -> None:
        """A comment line: nothing a client parses, bytes that keep it and any proxy from timing out
        (an answer paused while a lost stage is replaced)."""
        self.start()
        data = b": " + text.encode() + b"\n\n"
        self.handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.handler.wfile.flush()

    def keepalive(self) -> None:
        """While an answer is paused: a comment (the chat path's sinks all have this method)."""
        self.comment()

    def end(self) -> None:
        """The terminating chunk."""
        self.start()
        self.handler.wfile.write(b"0\r\n\r\n")
        self.handler.wfile.flush()
