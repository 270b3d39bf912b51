"""The agent's own state: node identity, the pairing token, credentials and file tickets.

Lives in the state directory (0700; files 0600). Secrets are never stored: the pairing
token and every credential are kept as SHA-256 digests only (they are 192- to 256-bit
random strings, so an unsalted digest cannot be brute-forced), and compared in constant
time. Pairing: the control plane presents the token printed at first start and receives a
fresh credential; the token stays valid for further pairings (a reinstalled dashboard, a
second admin) until `--reset-pairing` replaces it and revokes every credential.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.atomic_write import write_atomically
from orchestrator.proc import SYSTEM_CLOCK, Clock

MAX_CREDENTIALS = 32  # a bounded file: past it a pairing drops only a stale credential, else it is refused
MAX_TICKETS = 256
# A credential used within this is in use: no pairing ever drops it. Generous, because the control
# plane may be stopped for days (a dashboard machine that was off) and must find its nodes paired.
IN_USE_S = 30 * 86400.0
# A fresh credential not used yet is spared this long: the control plane pairs, then calls at once.
NEW_GRACE_S = 60.0
# Last use is stored to this precision, so a busy credential does not rewrite auth.json per request.
USE_STAMP_S = 3600.0


class CredentialsFull(Exception):
    """A pairing refused: every credential slot holds one in use (or freshly minted)."""


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def private_dir(path: Path) -> Path:
    """Create `path` (and parents) and make it 0700."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None


def _last_activity(cred: dict[str, Any]) -> float:
    return max(float(cred.get("created") or 0), float(cred.get("used") or 0))


def _stale(cred: dict[str, Any], now: float) -> bool:
    """Whether a pairing may drop this credential: idle past IN_USE_S, or never used past the grace."""
    if cred.get("used"):
        return now - float(cred["used"]) > IN_USE_S
    return now - float(cred.get("created") or 0) > NEW_GRACE_S


@dataclass(frozen=True)
class Caller:
    """Who is calling: a paired control plane (credential) or a peer holding a file ticket."""

    kind: str  # "credential" | "ticket"
    id: str
    model_id: str | None = None  # for tickets: the one model it may read


class AgentState:
    """Identity and credentials in `state_dir`; thread-safe."""

    def __init__(self, state_dir: Path, clock: Clock = SYSTEM_CLOCK) -> None:
        self.dir = private_dir(Path(state_dir))
        self._clock = clock  # ticket expiry: a test moves a fake clock instead of sleeping
        self._lock = threading.Lock()
        self._identity_path = self.dir / "identity.json"
        self._auth_path = self.dir / "auth.json"
        self._tickets: dict[str, tuple[str, float]] = {}  # digest -> (model id, monotonic expiry)
        identity = _read_json(self._identity_path)
        if identity is None or not isinstance(identity.get("fingerprint"), str):
            # 128 random bits: stable across restarts because it is stored, unique per state dir.
            identity = {"fingerprint": secrets.token_hex(16), "created": time.time()}
            write_atomically(self._identity_path, json.dumps(identity))
        self.fingerprint: str = identity["fingerprint"]
        self._auth = _read_json(self._auth_path) or {}
        self.new_pairing_token: str | None = None
        if not self._auth.get("token_sha256"):
            self.new_pairing_token = self._reset_locked()

    def _save(self) -> None:
        write_atomically(self._auth_path, json.dumps(self._auth, indent=1))

    def _reset_locked(self) -> str:
        token = secrets.token_urlsafe(24)
        self._auth = {"token_sha256": _digest(token), "created": time.time(), "credentials": []}
        self._save()
        return token

    def reset_pairing(self) -> str:
        """A new pairing token (returned once, to print) and no valid credentials."""
        with self._lock:
            self._tickets.clear()
            token = self._reset_locked()
            self.new_pairing_token = token
            return token

    def pair(self, token: str, label: str = "") -> tuple[str, str] | None:
        """Exchange the pairing token for a new credential: (credential, credential id), or None
        for a wrong token. At the cap a stale credential makes room; when none is stale the
        pairing is refused with `CredentialsFull` and nothing changes."""
        with self._lock:
            if not hmac.compare_digest(_digest(token), self._auth.get("token_sha256", "")):
                return None
            creds = self._auth.setdefault("credentials", [])
            now = time.time()
            while len(creds) >= MAX_CREDENTIALS:
                stale = [c for c in creds if _stale(c, now)]
                if not stale:
                    raise CredentialsFull(
                        f"this agent already holds {len(creds)} credentials, all in use or just paired; "
                        "pairing is refused so that none of them is dropped: revoke one (POST /v1/unpair "
                        "with it) or run `pipeserve agent --reset-pairing`")
                # Never-used ones first (what a flood of pairings mints), then the longest idle.
                creds.remove(min(stale, key=lambda c: (bool(c.get("used")), _last_activity(c))))
            credential = secrets.token_urlsafe(32)
            cred_id = secrets.token_hex(4)
            creds.append({"id": cred_id, "sha256": _digest(credential), "label": label, "created": now})
            self._save()
            return credential, cred_id

    def unpair(self, cred_id: str) -> bool:
        """Revoke one credential; True when it existed."""
        with self._lock:
            creds = self._auth.get("credentials", [])
            kept = [c for c in creds if c["id"] != cred_id]
            if len(kept) == len(creds):
                return False
            self._auth["credentials"] = kept
            self._save()
            return True

    def caller(self, bearer: str) -> Caller | None:
        """The caller a bearer string identifies (credential or unexpired ticket), or None."""
        digest = _digest(bearer)
        with self._lock:
            found = None
            # Compare against every entry (no early exit) so timing says nothing about position.
            used = None
            for cred in self._auth.get("credentials", []):
                if hmac.compare_digest(digest, cred["sha256"]):
                    found, used = Caller("credential", cred["id"]), cred
            if found:
                now = time.time()
                if used is not None and now - float(used.get("used") or 0) >= USE_STAMP_S:
                    used["used"] = now  # last use, to the hour: a credential in use is never dropped
                    self._save()
                return found
            now = self._clock.monotonic()
            self._tickets = {d: v for d, v in self._tickets.items() if v[1] > now}
            ticket = self._tickets.get(digest)
            if ticket is not None:
                return Caller("ticket", digest[:8], ticket[0])
        return None

    def issue_ticket(self, model_id: str, ttl_s: float) -> str:
        """A bearer string that may read this model's files only, for `ttl_s` seconds (kept in memory)."""
        ticket = secrets.token_urlsafe(32)
        with self._lock:
            if len(self._tickets) >= MAX_TICKETS:
                oldest = min(self._tickets, key=lambda d: self._tickets[d][1])
                del self._tickets[oldest]
            self._tickets[_digest(ticket)] = (model_id, self._clock.monotonic() + ttl_s)
        return ticket
