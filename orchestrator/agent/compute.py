"""Timing a model's layers on this node, on request, cached per model and reused across models.

`python -m orchestrator.engine.profiling.layers` runs in a child process with the environment the
agent gives its stages (BLAS threads), one model at a time; its answer is kept in
`<state>/profiles/<model>.json` together with the model's config.json size and mtime and the
reuse key, so a replaced model (or a profile from an older engine) is timed again. The report
lists every cached profile.

Reuse (issue 41 item 3): the answer is also kept in `<state>/profiles/by-key/<key>.json` under
the reuse key (families/timing_key.py: family, layer shapes, dtype and quantization, and this
node's backend: mlx and its device, the BLAS, its threads, the CPUs, PROFILE_VERSION). A model
this node has not timed whose key matches is answered at once with that timing, marked
`reused_from` the model it was timed on; one whose any part differs is timed. Both survive a
restart of the agent (files under its state directory).

A timing the busy-machine rule doubts (agent/timing_doubt.py: the load, rounds that
disagree, batched steps faster than one row's) is taken again, up to `TRIES` times with a
pause between; one still doubted after that is kept with its doubt, which the plan card shows.
"""

from __future__ import annotations

import json
import os
import platform
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestrator import settings
from orchestrator.agent.inventory import Inventory
from orchestrator.agent.perf_schemas import ComputeProfile, ProfileStatus
from orchestrator.agent.timing_doubt import profile_doubt
from orchestrator.atomic_write import write_atomically
from orchestrator.engine import blas
from orchestrator.families.decoder_config import ModelConfigError, read_config_file
from orchestrator.families.layer_kinds import tensor_headers
from orchestrator.families.timing_key import timing_key, timing_parts
from orchestrator.logs import EventLogger
from orchestrator.proc.child import parent_death_signal

TIMEOUT_S = 600.0
# Part of every cached profile's stamp: a profile taken by an older engine/profiling/layers.py (before
# it timed the per-step path, engine/profiling/step.py, steps of 2 and 4 rows, and the head
# behind the other layers; 5: each process's path ends at its own send, the engine's leaner path;
# 6: a stage frames its output before the step's evaluation; 7: a few layers that stand for all
# are timed, behind a read of the others' bytes, not every layer) is stale and is timed again.
PROFILE_VERSION = 7
TRIES = settings.TIMING_TRIES.default  # timings of one model while the busy-machine rule doubts them
RETRY_PAUSE_S = 10.0  # between them: a burst of other work may have passed
# ... but only while the prediction waiting on them would still be ready within this: a try starts
# no later than this after the first began (a timing that itself takes longer is taken once). On a
# loaded machine a model's timing took minutes, so 3 tries made a plan wait 3x that for figures the
# card shows doubted all the same (issue 41 item 3: the prediction ready in under 30 s).
RETRY_WINDOW_S = 30.0


class ProfileFailed(Exception):
    """The timing process failed; the message is its last line of error output."""


YIELDED = "stopped: a stage started on this node (timing beside it would compete with serving)"
STOP_POLL_S = 0.5  # how often a running timing asks whether it must yield


def run_profile_process(model_dir: Path, out: Path, command: list[str] | None = None,
                        stop: Callable[[], bool] = lambda: False) -> dict:
    """Time the model's layers in a child process with the stages' environment; its JSON. The
    child ends with its agent (a parent-death signal): a timing that outlived its stopped agent
    was found twice, still using CPU beside the stages. It yields when `stop()` turns true (a
    stage started on this node): killed, ProfileFailed(YIELDED). `command` replaces the timing
    program (tests)."""
    argv = command or [sys.executable, "-m", "orchestrator.engine.profiling.layers", "--model", str(model_dir),
                       "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=settings.process_environment(), preexec_fn=parent_death_signal)
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            _, err = proc.communicate(timeout=STOP_POLL_S)
            break
        except subprocess.TimeoutExpired:
            late = time.monotonic() > deadline
            if late or stop():
                proc.kill()
                proc.communicate()
                if late:
                    raise
                raise ProfileFailed(YIELDED) from None
    if proc.returncode != 0:
        raise ProfileFailed((err.strip().splitlines() or [f"exit status {proc.returncode}"])[-1])
    return json.loads(out.read_text())


class ComputeProfiler:
    """Cached compute profiles and the one timing run in progress."""

    def __init__(self, inventory: Inventory, state_dir: Path, log: EventLogger, *,
                 run: Callable[[Path, Path], dict] | None = None,
                 load: Callable[[], tuple[float, int]] | None = None,
                 sleep: Callable[[float], None] = time.sleep, tries: int | None = None,
                 serving: Callable[[], bool] = lambda: False,
                 backend: Callable[[], dict[str, Any]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`run`, `load` ((1-minute load, CPUs)) and `sleep` are the I/O edge, injectable; `tries` the
        most timings of one model while they are doubted (PIPESERVE_TIMING_TRIES). `serving`: whether
        this node runs an engine process now — timing never starts beside one, and yields to one
        that starts (issue 38 item 4). `backend`: what computes the timings here (`timing_backend`),
        part of the reuse key, asked once; `clock` the retry window's (injectable)."""
        self._tries = tries or settings.TIMING_TRIES.read()
        self._inventory = inventory
        self._serving = serving
        self._timed = run or partial(run_profile_process, stop=serving)
        self._load = load or (lambda: (_load_average(), os.cpu_count() or 0))
        self._sleep = sleep
        self._clock = clock
        self._dir = Path(state_dir) / "profiles"
        self._dir.mkdir(parents=True, exist_ok=True)
        self._log = log
        self._lock = threading.Lock()
        self._running: str | None = None
        self._failed: dict[str, str] = {}
        self._backend = backend or timing_backend
        self._backend_parts: dict[str, Any] | None = None
        # model -> (config.json size and mtime, reuse key parts): the headers are read once a version
        self._parts: dict[str, tuple[tuple[int, float], dict[str, Any] | None]] = {}

    def _reuse_parts(self, model_id: str) -> dict[str, Any] | None:
        """The model's reuse key parts on this node (None: its config or headers cannot be read)."""
        model_dir = self._inventory.model_dir(model_id)
        st = (model_dir / "config.json").stat()
        known = self._parts.get(model_id)
        if known is not None and known[0] == (st.st_size, st.st_mtime):
            return known[1]
        if self._backend_parts is None:
            self._backend_parts = {**self._backend(), "profile_version": PROFILE_VERSION}
        try:
            parts = timing_parts(read_config_file(model_dir), tensor_headers(model_dir), self._backend_parts)
        except (OSError, ValueError, KeyError, struct.error, ModelConfigError):
            parts = None
        self._parts[model_id] = ((st.st_size, st.st_mtime), parts)
        return parts

    def _stamp(self, model_id: str) -> list[Any]:
        st = (self._inventory.model_dir(model_id) / "config.json").stat()
        parts = self._reuse_parts(model_id)
        return [st.st_size, st.st_mtime, PROFILE_VERSION, timing_key(parts) if parts else ""]

    def _shared_path(self, key: str) -> Path:
        return self._dir / "by-key" / f"{key}.json"

    def cached(self, model_id: str) -> ComputeProfile | None:
        """The cached profile, when the model has not changed since it was timed, or the timing of
        another model with the same reuse key (`reused_from` says which)."""
        try:
            stamp = self._stamp(model_id)
            data = json.loads((self._dir / f"{model_id}.json").read_text())
            if data.get("stamp") == stamp:
                return ComputeProfile.model_validate({**data["profile"], "model_id": model_id})
        except (OSError, ValueError, KeyError, LookupError):
            pass
        return self._reused(model_id)

    def _reused(self, model_id: str) -> ComputeProfile | None:
        """The timing kept under the model's reuse key, for the model (None: none kept)."""
        try:
            key = self._stamp(model_id)[3]
            data = json.loads(self._shared_path(key).read_text()) if key else None
            if not data or data.get("key") != key:
                return None
            source = str(data["model_id"])
            return ComputeProfile.model_validate({**data["profile"], "model_id": model_id,
                                                  "reused_from": "" if source == model_id else source})
        except (OSError, ValueError, KeyError, LookupError):
            return None

    def status(self, model_id: str) -> ProfileStatus:
        """Done (with the profile), running, failed (why) or absent."""
        self._inventory.model_dir(model_id)  # 404 for a model this node does not have
        # Under the lock: a run keeps its profile and stops running in one step (_run), so a
        # status is never between the two ("absent" for a model just timed, or "done" while the
        # node still answers "busy").
        with self._lock:
            found = self.cached(model_id)
            if found is not None:
                if found.reused_from and not (self._dir / f"{model_id}.json").exists():
                    self._keep_reused(model_id, found)
                return ProfileStatus(model_id=model_id, state="done", profile=found)
            if self._running == model_id:
                return ProfileStatus(model_id=model_id, state="running")
            if model_id in self._failed:
                return ProfileStatus(model_id=model_id, state="failed", error=self._failed[model_id])
        return ProfileStatus(model_id=model_id, state="absent")

    def _keep_reused(self, model_id: str, found: ComputeProfile) -> None:
        """Keep a reused timing as the model's own (the report lists it), once."""
        self._log.info("compute.reused", model=model_id, timed_on=found.reused_from)
        write_atomically(self._dir / f"{model_id}.json", json.dumps(
            {"stamp": self._stamp(model_id), "profile": found.model_dump(exclude={"model_id"})}))

    def start(self, model_id: str, force: bool = False) -> ProfileStatus:
        """Time the model in the background unless it is cached (or `force`) or a run is going."""
        current = self.status(model_id)
        if current.state == "running" or (current.state == "done" and not force):
            return current
        if self._serving():
            return ProfileStatus(model_id=model_id, state="failed",
                                 error="not timed: this node serves a stage now (timing beside it would compete with "
                                       "serving)")
        with self._lock:
            if self._running is not None:
                return ProfileStatus(model_id=model_id, state="failed",
                                     error=f"busy timing {self._running}; ask again when it is done")
            self._running = model_id
            self._failed.pop(model_id, None)
        threading.Thread(target=self._run, args=(model_id,), daemon=True, name="agent-profile").start()
        return ProfileStatus(model_id=model_id, state="running")

    def _run(self, model_id: str) -> None:
        error, profile = None, None
        try:
            profile = self._time_until_trusted(model_id)
        except ProfileFailed as exc:
            error = str(exc)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        # Kept and no longer running in one step under the lock: a caller that sees "done" may
        # start the next timing at once, never answered "busy" by the run that just ended.
        with self._lock:
            try:
                if profile is not None:
                    self._keep(model_id, profile)
            except (OSError, ValueError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            self._running = None
            if error:
                self._failed[model_id] = error
                self._log.warning("compute.profile_failed", model=model_id, reason=error)

    def _keep(self, model_id: str, profile: dict) -> None:
        """Write a fresh timing as the model's own and as its reuse key's (first, so "done"
        means both are kept)."""
        stamp = self._stamp(model_id)
        if stamp[3]:
            self._shared_path(stamp[3]).parent.mkdir(exist_ok=True)
            write_atomically(self._shared_path(stamp[3]), json.dumps(
                {"key": stamp[3], "parts": self._reuse_parts(model_id), "model_id": model_id,
                 "profile": profile}))
        write_atomically(self._dir / f"{model_id}.json", json.dumps({"stamp": stamp, "profile": profile}))
        self._log.info("compute.profiled", model=model_id, layer_ms=profile.get("layer_ms_b1_solo"),
                       tries=profile["tries"], doubt=profile["doubt"] or None)

    def _time_until_trusted(self, model_id: str) -> dict:
        """Time the model; again (up to `tries`, a pause between) while the busy-machine rule
        doubts the result. The last timing, with how busy the machine was when it started (the
        dashboard says so beside the prediction), its doubt ("" when none) and the tries. No try
        starts later than RETRY_WINDOW_S after the first began."""
        attempt = 0
        began = self._clock()
        while True:
            attempt += 1
            load, cpus = self._load()
            with tempfile.TemporaryDirectory(dir=self._dir) as tmp:
                found = self._timed(self._inventory.model_dir(model_id), Path(tmp) / "profile.json")
            profile = {**found, "load": load, "cpus": cpus}
            doubt = profile_doubt(profile)
            late = self._clock() + RETRY_PAUSE_S - began > RETRY_WINDOW_S
            if not doubt or attempt >= self._tries or late:
                return {**profile, "doubt": doubt, "tries": attempt}
            self._log.info("compute.profile_doubted", model=model_id, attempt=attempt, doubt=doubt)
            self._sleep(RETRY_PAUSE_S)
            if self._serving():  # a stage started meanwhile: the last timing stands, doubted
                return {**profile, "doubt": doubt, "tries": attempt}

    def profiles(self) -> list[ComputeProfile]:
        """Every cached, current profile (for the report)."""
        out = []
        for path in sorted(self._dir.glob("*.json")):
            try:
                found = self.cached(path.stem)
            except Exception:  # noqa: BLE001 (a model that went away: its profile is stale, skip it)
                found = None
            if found is not None:
                out.append(found)
        return out


def timing_backend() -> dict[str, Any]:
    """What computes this node's timings, as far as the agent can tell without loading mlx: mlx's
    wheels (their versions say the backend: mlx-cpu, mlx-cuda-13, mlx-metal), the BLAS the stages
    load (PIPESERVE_BLAS and the OpenBLAS libraries installed, engine/blas.py), their threads
    (PIPESERVE_STAGE_THREADS, PIPESERVE_SOLO_THREADS), the CPUs and the machine."""
    wheels = {}
    for dist in ("mlx", "mlx-cpu", "mlx-metal", "mlx-cuda", "mlx-cuda-12", "mlx-cuda-13"):
        try:
            wheels[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return {"mlx": wheels, "blas": [settings.BLAS.read(), *map(str, blas.candidates())],
            "threads": [settings.STAGE_THREADS.read(), settings.SOLO_THREADS.read()],
            "cpus": os.cpu_count() or 0, "machine": platform.machine(), "processor": _cpu_model()}


def _cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo; platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _load_average() -> float:
    """The machine's 1-minute load average (0 where the platform has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return 0.0
