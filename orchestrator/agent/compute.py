"""Timing a model's layers on this node, on request, cached per model.

`python -m orchestrator.engine.profile` runs in a child process with the environment the
agent gives its stages (BLAS threads), one model at a time; its answer is kept in
`<state>/profiles/<model>.json` together with the model's config.json size and mtime and the
profile's version, so a replaced model (or a profile from an older engine) is timed again.
The report lists every cached profile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from ..logs import EventLogger
from .inventory import Inventory
from .perf_schemas import ComputeProfile, ProfileStatus

TIMEOUT_S = 600.0
# Part of every cached profile's stamp: a profile taken by an older engine/profile.py (before
# it timed the per-step path, engine/profile_step.py, steps of 2 and 4 rows, and the head
# behind the other layers) is stale and is timed again.
PROFILE_VERSION = 4


class ComputeProfiler:
    """Cached compute profiles and the one timing run in progress."""

    def __init__(self, inventory: Inventory, state_dir: Path, log: EventLogger) -> None:
        self._inventory = inventory
        self._dir = Path(state_dir) / "profiles"
        self._dir.mkdir(parents=True, exist_ok=True)
        self._log = log
        self._lock = threading.Lock()
        self._running: str | None = None
        self._failed: dict[str, str] = {}

    def _stamp(self, model_id: str) -> list[float]:
        st = (self._inventory.model_dir(model_id) / "config.json").stat()
        return [st.st_size, st.st_mtime, PROFILE_VERSION]

    def cached(self, model_id: str) -> ComputeProfile | None:
        """The cached profile, when the model has not changed since it was timed."""
        path = self._dir / f"{model_id}.json"
        try:
            data = json.loads(path.read_text())
            if data.get("stamp") != self._stamp(model_id):
                return None
            return ComputeProfile.model_validate({**data["profile"], "model_id": model_id})
        except (OSError, ValueError, KeyError, LookupError):
            return None

    def status(self, model_id: str) -> ProfileStatus:
        """Done (with the profile), running, failed (why) or absent."""
        self._inventory.model_dir(model_id)  # 404 for a model this node does not have
        found = self.cached(model_id)
        with self._lock:
            if found is not None:
                return ProfileStatus(model_id=model_id, state="done", profile=found)
            if self._running == model_id:
                return ProfileStatus(model_id=model_id, state="running")
            if model_id in self._failed:
                return ProfileStatus(model_id=model_id, state="failed", error=self._failed[model_id])
        return ProfileStatus(model_id=model_id, state="absent")

    def start(self, model_id: str, force: bool = False) -> ProfileStatus:
        """Time the model in the background unless it is cached (or `force`) or a run is going."""
        current = self.status(model_id)
        if current.state == "running" or (current.state == "done" and not force):
            return current
        with self._lock:
            if self._running is not None:
                return ProfileStatus(model_id=model_id, state="failed",
                                     error=f"busy timing {self._running}; ask again when it is done")
            self._running = model_id
            self._failed.pop(model_id, None)
        threading.Thread(target=self._run, args=(model_id,), daemon=True, name="agent-profile").start()
        return ProfileStatus(model_id=model_id, state="running")

    def _run(self, model_id: str) -> None:
        error = None
        try:
            with tempfile.TemporaryDirectory(dir=self._dir) as tmp:
                out = Path(tmp) / "profile.json"
                proc = subprocess.run([sys.executable, "-m", "orchestrator.engine.profile", "--model",
                                       str(self._inventory.model_dir(model_id)), "--out", str(out)],
                                      capture_output=True, text=True, timeout=TIMEOUT_S, env=dict(os.environ))
                if proc.returncode != 0:
                    error = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
                else:
                    profile = json.loads(out.read_text())
                    (self._dir / f"{model_id}.json").write_text(json.dumps({"stamp": self._stamp(model_id),
                                                                            "profile": profile}))
                    self._log.info("compute.profiled", model=model_id, layer_ms=profile.get("layer_ms_b1_solo"))
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self._running = None
            if error:
                self._failed[model_id] = error
                self._log.warning("compute.profile_failed", model=model_id, reason=error)

    def profiles(self) -> list[ComputeProfile]:
        """Every cached, current profile (for the report)."""
        out = []
        for path in sorted(self._dir.glob("*.json")):
            try:
                found = self.cached(path.stem)
            except Exception:  # a model that went away: its profile is stale, skip it
                found = None
            if found is not None:
                out.append(found)
        return out
