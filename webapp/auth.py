"""Who may watch and who may act (docs/security.md, "Dashboard"): an admin token, viewer links, CSRF.

The admin token is generated on first start, printed once, and stored only as a hash.
Admins mint viewer links (also stored hashed). The signed session cookie carries a random
session id, its role and its CSRF token; the id must still be live in the AuthStore
(`webapp.authstore`), so logging out, revoking a viewer link or resetting the admin token
ends the session at once, whatever cookie is replayed. Every state-changing request needs
the admin role and the session's CSRF token; websockets need a session.
"""

from __future__ import annotations

import hmac
import secrets
from functools import wraps
from typing import Any, Callable

from flask import abort, current_app, g, request, session

from webapp.authstore import AuthStore, digest

__all__ = ["AuthStore", "digest", "login", "logout", "role", "session_key", "csrf_token", "check_csrf",
           "admin_required", "login_required"]

SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


def _store() -> AuthStore:
    return current_app.extensions["pipeserve"].auth


def login(role: str, viewer: str | None = None) -> None:
    """Start a server-side session (ending the cookie's previous one) with a fresh CSRF token."""
    _store().close_session(session.get("sid"))
    session.clear()
    session["sid"] = _store().open_session(role, viewer)
    session["csrf"] = secrets.token_urlsafe(24)
    session.permanent = True
    g.pop("role", None)


def logout() -> None:
    """End the session on the server (a replayed cookie no longer works) and clear the cookie."""
    _store().close_session(session.get("sid"))
    session.clear()
    g.pop("role", None)


def role() -> str | None:
    """The current session's role: looked up on the server once per request."""
    if "role" not in g:
        g.role = _store().session_role(session.get("sid"))
    return g.role


def session_key() -> str | None:
    """The current session's id (what websocket limits and re-checks are keyed on)."""
    return session.get("sid") if role() else None


def csrf_token() -> str:
    """The session's CSRF token (for templates)."""
    return session.get("csrf", "")


def check_csrf() -> None:
    """Abort 403 unless the request carries the session's CSRF token (header or form field)."""
    sent = request.headers.get("X-CSRF-Token") or request.form.get("csrf_token", "")
    if role() is None or not session.get("csrf") or not hmac.compare_digest(sent.encode(), session["csrf"].encode()):
        abort(403, description="missing or wrong CSRF token: reload the page")


def admin_required(fn: Callable) -> Callable:
    """Only admins (with a valid CSRF token on state-changing methods)."""
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if role() is None:
            abort(401, description="log in first")
        if role() != "admin":
            abort(403, description="viewers can watch but not act: ask an admin")
        if request.method not in SAFE_METHODS:
            check_csrf()
        return fn(*args, **kwargs)
    return wrapper


def login_required(fn: Callable) -> Callable:
    """Any logged-in role."""
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if role() is None:
            abort(401, description="log in first")
        return fn(*args, **kwargs)
    return wrapper
