"""The cluster secrets of live sessions, kept so that a replaced stage can join its cluster.

A launch makes a fresh secret per session and hands it to the agents (never to a command
line); replacing one process later needs the same one, also after a dashboard restart. One
JSON file, owner-only, beside the control-plane state; never in the state itself, so it
can never reach a browser or /api/state.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from orchestrator.atomic_write import write_atomically

FILENAME = "secrets.json"


class SecretStore:
    """Session id -> cluster secret, persisted atomically (mode 0600). Thread-safe."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / FILENAME
        self._lock = threading.Lock()
        try:
            self._secrets: dict[str, str] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self._secrets = {}

    def get(self, session_id: str) -> str | None:
        """The session's secret, or None."""
        with self._lock:
            return self._secrets.get(session_id)

    def put(self, session_id: str, secret: str) -> None:
        """Remember a session's secret."""
        with self._lock:
            self._secrets[session_id] = secret
            self._save()

    def keep_only(self, session_ids: set[str]) -> None:
        """Forget the secrets of sessions that ended."""
        with self._lock:
            if set(self._secrets) - session_ids:
                self._secrets = {k: v for k, v in self._secrets.items() if k in session_ids}
                self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomically(self.path, json.dumps(self._secrets))
