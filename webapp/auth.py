"""Who may watch and who may act (DESIGN §6): an admin token, viewer links, CSRF.

The admin token is generated on first start, printed once, and stored only as a hash.
Admins mint viewer links (also stored hashed). A Flask session carries the role; every
state-changing request needs the admin role and the session's CSRF token; websockets
need a session.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import tempfile
import threading
import time
from functools import wraps
from pathlib import Path
from typing import Any, Callable

from flask import abort, request, session

FILENAME = "auth.json"
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class AuthStore:
    """The dashboard's credentials on disk (owner-only), behind a lock."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / FILENAME
        self._lock = threading.Lock()
        self._data: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".auth-")
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, json.dumps(self._data, indent=1).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)

    def secret_key(self) -> bytes:
        """The session-signing key (kept, so logins survive a restart)."""
        with self._lock:
            if "secret_key" not in self._data:
                self._data["secret_key"] = secrets.token_hex(32)
                self._save()
            return bytes.fromhex(self._data["secret_key"])

    def ensure_admin_token(self) -> str | None:
        """On first start: a new admin token (returned once, to print); afterwards None."""
        with self._lock:
            if self._data.get("admin_sha256"):
                return None
            token = secrets.token_urlsafe(24)
            self._data["admin_sha256"] = _digest(token)
            self._save()
            return token

    def reset_admin_token(self) -> str:
        """Replace a lost admin token."""
        with self._lock:
            token = secrets.token_urlsafe(24)
            self._data["admin_sha256"] = _digest(token)
            self._save()
            return token

    def role_for(self, token: str) -> str | None:
        """"admin", "viewer" or None for a presented token."""
        digest = _digest(token.strip())
        with self._lock:
            if hmac.compare_digest(digest, self._data.get("admin_sha256", "")):
                return "admin"
            if any(hmac.compare_digest(digest, v["sha256"]) for v in self._data.get("viewers", [])):
                return "viewer"
        return None

    def mint_viewer(self, label: str) -> tuple[str, str]:
        """A new viewer token: (id, token); only the hash is kept."""
        token, vid = secrets.token_urlsafe(24), secrets.token_hex(4)
        with self._lock:
            self._data.setdefault("viewers", []).append(
                {"id": vid, "sha256": _digest(token), "label": label[:64], "created": time.time()})
            self._save()
        return vid, token

    def viewers(self) -> list[dict[str, Any]]:
        """Viewer links (without secrets)."""
        with self._lock:
            return [{k: v[k] for k in ("id", "label", "created")} for v in self._data.get("viewers", [])]

    def revoke_viewer(self, vid: str) -> bool:
        """Remove a viewer link; True when it existed."""
        with self._lock:
            before = self._data.get("viewers", [])
            self._data["viewers"] = [v for v in before if v["id"] != vid]
            if len(before) == len(self._data["viewers"]):
                return False
            self._save()
            return True


def login(role: str) -> None:
    """Start a session with a fresh CSRF token."""
    session.clear()
    session["role"] = role
    session["csrf"] = secrets.token_urlsafe(24)
    session.permanent = True


def role() -> str | None:
    """The current session's role."""
    return session.get("role")


def csrf_token() -> str:
    """The session's CSRF token (for templates)."""
    return session.get("csrf", "")


def check_csrf() -> None:
    """Abort 403 unless the request carries the session's CSRF token (header or form field)."""
    sent = request.headers.get("X-CSRF-Token") or request.form.get("csrf_token", "")
    if not session.get("csrf") or not hmac.compare_digest(sent, session["csrf"]):
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
