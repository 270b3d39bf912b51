"""Request-level protections (issue 9): security headers, same-origin websockets, safe
redirects after login, and a bounded number of live websockets per session.

Everything here is per app (installed by `install`), never module state.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator
from urllib.parse import urlsplit

from flask import Flask, Response, abort, request

WS_PATHS = ("/ws", "/ws/events")
WS_PER_SESSION = 8  # a browser tab holds one; more than 8 open tabs of one session is a runaway script
WS_PER_USER = 64  # one viewer link (or the admin token) over all its sessions: a link cannot take them all
WS_TOTAL = 1000  # all sessions together: bounds the worker's memory whatever the number of logins

# 'self' only for scripts (the vendored htmx and our two files; no inline script, no eval).
# Style *attributes* stay allowed because the memory and progress bars set their widths inline;
# they cannot run script, and <style> elements are still limited to our own stylesheet.
CSP = "; ".join([
    "default-src 'none'", "script-src 'self'", "style-src 'self'", "style-src-elem 'self'",
    "style-src-attr 'unsafe-inline'", "img-src 'self' data:", "font-src 'self'", "connect-src 'self'",
    "form-action 'self'", "frame-ancestors 'none'", "base-uri 'none'", "object-src 'none'",
])
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # viewer links carry their token in the path: never send a URL of ours anywhere
    "Referrer-Policy": "no-referrer",
}


def safe_next(target: str | None, default: str) -> str:
    """`target` if it is a path on this site, else `default` (no open redirect).

    Refused: anything with a scheme or host, protocol-relative `//host`, backslashes (browsers
    read `/\\host` as `//host`) and control characters or whitespace (browsers drop tabs and
    newlines, so `/\\t/host` would become `//host`).
    """
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in target):
        return default
    parts = urlsplit(target)
    return default if parts.scheme or parts.netloc else target


def same_origin(origin: str | None, host: str) -> bool:
    """Whether a browser's Origin header names this dashboard (as the Host header names it).

    The host and port must match exactly; the scheme may be http or https, because a
    TLS-terminating proxy in front (docs/security.md) makes the browser's scheme differ from
    ours, and no other site can be served from this very host and port.
    No Origin at all is a program, not a browser page (browsers always send it on websockets),
    and programs must authenticate anyway.
    """
    if origin is None:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and bool(parts.netloc) and \
        parts.netloc.lower() == host.lower() and not parts.path.strip("/")


class LiveSlots:
    """Counts open websockets per session and in all; refuses beyond the caps."""

    def __init__(self, per_session: int = WS_PER_SESSION, per_user: int = WS_PER_USER,
                 total: int = WS_TOTAL) -> None:
        self.per_session, self.per_user, self.total = per_session, per_user, total
        self._lock = threading.Lock()
        self._sessions: dict[str, int] = {}
        self._users: dict[str, int] = {}
        self._open = 0

    @contextmanager
    def hold(self, session: str, user: str) -> Iterator[str | None]:
        """Yield None with a slot held for `session` of `user`, or the refusal message."""
        with self._lock:
            if self._open >= self.total:
                refusal: str | None = f"too many live connections to this dashboard ({self.total}): try again later"
            elif self._users.get(user, 0) >= self.per_user:
                whose = "viewer link" if user.startswith("viewer:") else "admin token"
                refusal = f"too many live connections for this {whose} ({self.per_user}): close some dashboard tabs"
            elif self._sessions.get(session, 0) >= self.per_session:
                refusal = (f"too many live connections for this session ({self.per_session}): "
                           "close other dashboard tabs")
            else:
                refusal = None
                self._open += 1
                self._sessions[session] = self._sessions.get(session, 0) + 1
                self._users[user] = self._users.get(user, 0) + 1
        try:
            yield refusal
        finally:
            if refusal is None:
                with self._lock:
                    self._open -= 1
                    for counts, key in ((self._sessions, session), (self._users, user)):
                        counts[key] -= 1
                        if not counts[key]:
                            del counts[key]

    def count(self) -> int:
        """Open websockets now."""
        with self._lock:
            return self._open


def install(app: Flask) -> None:
    """Add the headers to every response and refuse cross-origin websocket handshakes."""
    app.extensions["pipeserve-live-slots"] = LiveSlots()

    @app.before_request
    def websocket_origin() -> None:
        if request.path in WS_PATHS and not same_origin(request.headers.get("Origin"), request.host):
            abort(403, description="websocket from another origin refused")

    @app.after_request
    def security_headers(response: Response) -> Response:
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        return response


def live_slots(app: Flask) -> LiveSlots:
    """The app's websocket counter."""
    return app.extensions["pipeserve-live-slots"]
