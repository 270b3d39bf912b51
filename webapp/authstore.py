"""The dashboard's credentials and server-side sessions in `auth.json` (owner-only).

Two processes write this file: the running dashboard (logins, logouts, viewer links) and
`pipeserve dashboard --reset-admin-token`. So every read first notices a change on disk (a
stat per call), and every write is read-modify-write under an exclusive `flock`: a reset
takes effect in the running dashboard at once, and the dashboard's next write can never put
the old admin hash back.

Sessions live here, not only in the signed cookie: the cookie carries a random session id,
and a request is authenticated only while that id is in the file. Logging out, revoking a
viewer link and resetting the admin token delete ids, so a replayed cookie is worthless.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from orchestrator.atomic_write import write_atomically

FILENAME = "auth.json"
SESSION_LIFETIME_S = 7 * 24 * 3600
# Live sessions per owner (the admin token; each viewer link): the owner's oldest is dropped
# beyond it, so logins cannot grow the file without bound and no one's logins can end
# another's session (1,000 visits of a viewer link once logged the admin out).
MAX_ADMIN_SESSIONS = 100
MAX_VIEWER_SESSIONS = 64  # per viewer link


def _owner(role: str, viewer: str | None) -> str:
    """Whose a session is: "admin" or "viewer:<link id>" (sessions are capped per owner)."""
    return "admin" if role == "admin" else f"viewer:{viewer}"


def digest(token: str) -> str:
    """The stored form of a token (tokens are random, so a plain hash suffices)."""
    return hashlib.sha256(token.encode()).hexdigest()


class AuthStore:
    """Admin token, viewer links and sessions, shared safely between processes."""

    def __init__(self, state_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(state_dir) / FILENAME
        self._lockfile = Path(state_dir) / ".auth.lock"
        self._clock = clock
        self._lock = threading.Lock()
        self._data: dict[str, Any] = {}
        self._stamp: tuple | None = None
        with self._lock:
            self._refresh()

    # --- the file ---------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Re-read the file when it changed on disk (caller holds self._lock)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._data, self._stamp = {}, None
            return
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._data = json.loads(self.path.read_text() or "{}")
            self._stamp = stamp

    @contextmanager
    def _writing(self) -> Iterator[dict[str, Any]]:
        """The freshest data, to change in place; saved atomically on exit, under flock."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self._lock, os.fdopen(os.open(self._lockfile, os.O_RDWR | os.O_CREAT, 0o600)) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            self._stamp = None  # always re-read under the file lock: another process may just have written
            self._refresh()
            yield self._data
            self._save()

    def _save(self) -> None:
        write_atomically(self.path, json.dumps(self._data, indent=1))
        self._stamp = None
        self._refresh()

    def _read(self) -> dict[str, Any]:
        """The current data (caller holds self._lock)."""
        self._refresh()
        return self._data

    # --- tokens -----------------------------------------------------------------------------

    def secret_key(self) -> bytes:
        """The cookie-signing key (kept, so logins survive a restart)."""
        with self._lock:
            key = self._read().get("secret_key")
        if key:
            return bytes.fromhex(key)
        with self._writing() as data:
            data.setdefault("secret_key", secrets.token_hex(32))
            return bytes.fromhex(data["secret_key"])

    def ensure_admin_token(self) -> str | None:
        """On first start: a new admin token (returned once, to print); afterwards None."""
        with self._writing() as data:
            if data.get("admin_sha256"):
                return None
            token = secrets.token_urlsafe(24)
            data["admin_sha256"] = digest(token)
            return token

    def reset_admin_token(self) -> str:
        """Replace a lost or leaked admin token; every session ends (viewers reopen their links)."""
        with self._writing() as data:
            token = secrets.token_urlsafe(24)
            data["admin_sha256"] = digest(token)
            data["sessions"] = {}
            return token

    def identify(self, token: str) -> tuple[str, str | None] | None:
        """("admin", None), ("viewer", viewer id) or None for a presented token."""
        d = digest(token.strip())
        with self._lock:
            data = self._read()
            if hmac.compare_digest(d, data.get("admin_sha256", "")):
                return "admin", None
            for v in data.get("viewers", []):
                if hmac.compare_digest(d, v["sha256"]):
                    return "viewer", v["id"]
        return None

    def role_for(self, token: str) -> str | None:
        """"admin", "viewer" or None for a presented token."""
        who = self.identify(token)
        return who[0] if who else None

    def mint_viewer(self, label: str) -> tuple[str, str]:
        """A new viewer token: (id, token); only the hash is kept."""
        token, vid = secrets.token_urlsafe(24), secrets.token_hex(4)
        with self._writing() as data:
            data.setdefault("viewers", []).append(
                {"id": vid, "sha256": digest(token), "label": label[:64], "created": self._clock()})
        return vid, token

    def viewers(self) -> list[dict[str, Any]]:
        """Viewer links (without secrets)."""
        with self._lock:
            return [{k: v[k] for k in ("id", "label", "created")} for v in self._read().get("viewers", [])]

    def revoke_viewer(self, vid: str) -> bool:
        """Remove a viewer link and end its sessions; True when it existed."""
        with self._writing() as data:
            before = data.get("viewers", [])
            data["viewers"] = [v for v in before if v["id"] != vid]
            data["sessions"] = {sid: s for sid, s in data.get("sessions", {}).items() if s.get("viewer") != vid}
            return len(before) != len(data["viewers"])

    # --- sessions ---------------------------------------------------------------------------

    def open_session(self, role: str, viewer: str | None = None) -> str:
        """A new server-side session id for a role (and the viewer link it came from)."""
        sid, now = secrets.token_urlsafe(24), self._clock()
        owner = _owner(role, viewer)
        cap = MAX_ADMIN_SESSIONS if role == "admin" else MAX_VIEWER_SESSIONS
        with self._writing() as data:
            live = {k: s for k, s in data.get("sessions", {}).items() if s["expires"] > now}
            mine = sorted((k for k, s in live.items() if _owner(s["role"], s.get("viewer")) == owner),
                          key=lambda k: live[k]["expires"])
            for k in mine[:max(0, len(mine) - cap + 1)]:  # only this owner's oldest make room
                del live[k]
            live[sid] = {"role": role, "viewer": viewer, "expires": now + SESSION_LIFETIME_S}
            data["sessions"] = live
        return sid

    def session_role(self, sid: str | None) -> str | None:
        """The role of a live session id; None when unknown, ended or expired."""
        if not sid:
            return None
        with self._lock:
            s = self._read().get("sessions", {}).get(sid)
        return s["role"] if s and s["expires"] > self._clock() else None

    def session_owner(self, sid: str | None) -> str | None:
        """Who a live session belongs to: "admin" or "viewer:<link id>"; None when not live."""
        if not sid:
            return None
        with self._lock:
            s = self._read().get("sessions", {}).get(sid)
        if not s or s["expires"] <= self._clock():
            return None
        return _owner(s["role"], s.get("viewer"))

    def close_session(self, sid: str | None) -> None:
        """End a session (log out)."""
        if not sid:
            return
        with self._writing() as data:
            data.get("sessions", {}).pop(sid, None)
