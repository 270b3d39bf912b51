"""What a copy has already tried, kept beside its resume record so that a restart does not forget it.

A copy's partial files survive a restart of its job or of the agent (`transfer`: the same
request resumes them). Its failure counts must survive with them, or a hostile peer keeps the
job alive forever: each restart would grant a file another refetch after a mismatch (or a
block of it another one), and a followed download that never completes would get a fresh
deadline. `<work>/attempts.json` holds all three; it goes when the work directory does
(installed, discarded, another request).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from orchestrator.atomic_write import write_atomically


class Attempts:
    """The persisted counts of one copy (thread-safe: receivers and hashers share it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            saved = json.loads(path.read_text())
            refetched = {str(k): int(v) for k, v in dict(saved.get("refetched", {})).items()}
            blocks = {str(f): {int(k): int(n) for k, n in dict(per).items()}
                      for f, per in dict(saved.get("block_mismatches", {})).items()}
            started = saved.get("follow_started")
            self._follow_started = float(started) if started is not None else None
        except (OSError, ValueError, TypeError, AttributeError):
            refetched, blocks, self._follow_started = {}, {}, None  # none yet, or unreadable: count from now
        self._refetched = refetched
        self._blocks: dict[str, dict[int, int]] = blocks

    def refetched(self, rel: str) -> int:
        """How many times `rel` was fetched again after a mismatch, in every run of this copy."""
        with self._lock:
            return self._refetched.get(rel, 0)

    def count_refetch(self, rel: str) -> int:
        """Record one more refetch of `rel` (before it starts: a crash must not lose it); the new count."""
        with self._lock:
            self._refetched[rel] = self._refetched.get(rel, 0) + 1
            self._save()
            return self._refetched[rel]

    def count_block_mismatch(self, rel: str, block: int) -> int:
        """Record one more mismatch of block `block` of `rel` (before its refetch starts); the count in
        every run of this copy."""
        with self._lock:
            per = self._blocks.setdefault(rel, {})
            per[block] = per.get(block, 0) + 1
            self._save()
            return per[block]

    def follow_started(self, now: float) -> float:
        """When this copy first started following its peer (wall time, `now` if never before)."""
        with self._lock:
            if self._follow_started is None:
                self._follow_started = now
                self._save()
            return self._follow_started

    def _save(self) -> None:
        try:
            write_atomically(self.path, json.dumps({"refetched": self._refetched, "block_mismatches": self._blocks,
                                                    "follow_started": self._follow_started}))
        except FileNotFoundError:
            pass  # the work directory is gone (the job was discarded meanwhile): nothing to resume
