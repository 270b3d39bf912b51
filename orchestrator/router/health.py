"""Backend health: a pure state machine plus one checker thread per router.

States: `starting` (never answered yet), `healthy` (routable), `warming` (answered 503: the
coordinator is up but its pipeline is not ready), `unhealthy`. Only `healthy` is routable.

- A backend becomes healthy after `healthy_threshold` consecutive successful probes.
- A healthy backend becomes unhealthy after `unhealthy_threshold` consecutive failures
  (it stays routable meanwhile: one lost probe must not drop a busy backend, and the proxy
  fails over on connection errors anyway).
- A 503 is not a failure but an explicit "not ready": the backend leaves rotation at once
  and counts its successes from zero again — a 503 answer to a proxied request too.
- Healthy backends are probed every `interval`; every other one at least every second, so a
  warming or new backend joins quickly (continuum-router re-checks a 503 every second).

The checker reads time from an injectable `Clock` (orchestrator/proc/clock.py): tests move a
`FakeClock` instead of sleeping through probe intervals.
"""

from __future__ import annotations

import http.client
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable
from urllib.parse import urlsplit

from orchestrator.logs import EventLogger
from orchestrator.proc.clock import SYSTEM_CLOCK, Clock
from orchestrator.router.config import BackendConfig, HealthChecks

RECHECK_NOT_HEALTHY = 1.0
MAX_PROBES = 8  # concurrent probes: a hung backend must not delay the others
MAX_PROBE_BODY = 1024 * 1024


@dataclass(frozen=True)
class ProbeResult:
    """One probe: `status` is None when no HTTP answer came (refused, timeout, bad URL)."""

    status: int | None
    models: tuple[str, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


@dataclass(frozen=True)
class BackendHealth:
    """What is known about one backend; replaced, never mutated."""

    state: str = "starting"
    successes: int = 0  # consecutive
    failures: int = 0  # consecutive
    models: tuple[str, ...] = ()  # as the backend listed them on its last successful probe
    last_status: int | None = None
    last_error: str | None = None
    checked_at: float | None = None  # wall time (the clock's time()) of the last probe

    @property
    def routable(self) -> bool:
        return self.state == "healthy"


def observe(h: BackendHealth, r: ProbeResult, s: HealthChecks, now: float) -> BackendHealth:
    """The backend's health after one probe result (pure)."""
    if r.ok:
        successes = h.successes + 1
        state = "healthy" if h.state == "healthy" or successes >= s.healthy_threshold else h.state
        return BackendHealth(state, successes, 0, r.models, r.status, None, now)
    if r.status == 503:
        return BackendHealth("warming", 0, 0, h.models, 503, r.error, now)
    failures = h.failures + 1
    state = "unhealthy" if failures >= s.unhealthy_threshold else h.state
    return BackendHealth(state, 0, failures, h.models, r.status, r.error, now)


def next_delay(h: BackendHealth, s: HealthChecks) -> float:
    """Seconds until the next probe of this backend."""
    if h.state == "healthy" and h.failures == 0:
        return s.interval
    return min(s.interval, RECHECK_NOT_HEALTHY)


def probe(url: str, s: HealthChecks) -> ProbeResult:
    """GET the health endpoint of a backend and list the models it reports."""
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=s.timeout)
    try:
        conn.request("GET", parts.path + s.endpoint, headers={"Accept": "application/json"})
        resp = conn.getresponse()
        status, raw = resp.status, resp.read(MAX_PROBE_BODY)
    except (OSError, http.client.HTTPException) as exc:
        return ProbeResult(None, error=f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        doc = None
    if not 200 <= status < 300:
        message = doc["error"].get("message") if isinstance(doc, dict) and isinstance(doc.get("error"), dict) \
            else raw[:200].decode(errors="replace")
        return ProbeResult(status, error=f"HTTP {status}: {message}")
    # A health endpoint need not be /v1/models: a 2xx is enough, the model list is a bonus.
    data = doc.get("data") if isinstance(doc, dict) else None
    models = tuple(str(m["id"]) for m in data if isinstance(m, dict) and "id" in m) if isinstance(data, list) else ()
    return ProbeResult(status, models)


@dataclass
class _Entry:
    backend: BackendConfig
    health: BackendHealth
    due: float  # on the checker's clock.monotonic()
    generation: int  # bumps when the URL changes, so a stale probe result is dropped
    probing: bool = False


class HealthChecker:
    """Probes every configured backend on its own schedule; thread-safe snapshots.

    `configure()` is called at start and on every config reload; a backend whose name and
    URL are unchanged keeps its health (a reload must not flap the whole table). Every reading
    of time is `clock`'s.
    """

    def __init__(self, log: EventLogger, prober: Callable[[str, HealthChecks], ProbeResult] = probe,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._log = log
        self._probe = prober
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._entries: dict[str, _Entry] = {}
        self._settings = HealthChecks()
        self._generation = 0
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    def configure(self, backends: tuple[BackendConfig, ...], settings: HealthChecks) -> None:
        """Adopt a new backend list and settings; new backends are probed at once."""
        now = self._clock.monotonic()
        with self._lock:
            old = self._entries
            self._entries = {}
            for b in backends:
                prev = old.get(b.name)
                if prev is not None and prev.backend.url == b.url:
                    due = min(prev.due, now + next_delay(prev.health, settings))
                    self._entries[b.name] = _Entry(b, prev.health, due, prev.generation, prev.probing)
                else:
                    self._generation += 1
                    self._entries[b.name] = _Entry(b, BackendHealth(), now, self._generation)
            self._settings = settings
        for name in old.keys() - self._entries.keys():
            self._log.info("backend.removed", backend=name)
        self._wake.set()

    def snapshot(self) -> dict[str, BackendHealth]:
        """Health of every configured backend right now."""
        with self._lock:
            if not self._settings.enabled:
                # Without health checks every configured backend is taken as routable.
                return {n: replace(e.health, state="healthy") for n, e in self._entries.items()}
            return {n: e.health for n, e in self._entries.items()}

    def report_failure(self, name: str, url: str, error: str) -> None:
        """A proxied request could not connect: count it like a failed probe, re-probe soon."""
        self._record(name, url, None, ProbeResult(None, error=error), passive=True)

    def report_unavailable(self, name: str, url: str, error: str) -> None:
        """A proxied request was answered 503 (e.g. a coordinator repairing its pipeline): the
        backend leaves rotation now, as after a 503 probe, instead of at its next probe."""
        self._record(name, url, None, ProbeResult(503, error=error), passive=True)

    def start(self) -> None:
        """Start the scheduling thread and the probe pool."""
        self._pool = ThreadPoolExecutor(MAX_PROBES, thread_name_prefix="router-probe")
        self._thread = threading.Thread(target=self._loop, name="router-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop probing (probes already running finish in the background)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = self._clock.monotonic()
            with self._lock:
                enabled = self._settings.enabled
                due = [(n, e.backend.url, e.generation) for n, e in self._entries.items()
                       if enabled and not e.probing and e.due <= now]
                for n, _, _ in due:
                    self._entries[n].probing = True
                waits = [e.due - now for e in self._entries.values() if enabled and not e.probing]
                settings = self._settings
            for name, url, generation in due:
                assert self._pool is not None
                self._pool.submit(self._run_probe, name, url, generation, settings)
            # A fake clock moves only when a test moves it: look at it again soon, in real time.
            self._wake.wait(max(0.01, min(waits, default=1.0)) if self._clock is SYSTEM_CLOCK else 0.01)
            self._wake.clear()

    def _run_probe(self, name: str, url: str, generation: int, settings: HealthChecks) -> None:
        try:
            result = self._probe(url, settings)
        except Exception as exc:  # noqa: BLE001 (a probe bug must not stop the checks of this backend)
            result = ProbeResult(None, error=f"probe failed: {exc!r}")
        self._record(name, url, generation, result, passive=False)
        self._wake.set()

    def _record(self, name: str, url: str, generation: int | None, result: ProbeResult, passive: bool) -> None:
        if self._stop.is_set():
            return  # a probe that finished after stop(): the checker records and logs nothing more
        with self._lock:
            entry = self._entries.get(name)
            if entry is None or entry.backend.url != url or (generation is not None and entry.generation != generation):
                return  # removed or changed while the probe ran
            if not passive:
                entry.probing = False
            before = entry.health
            entry.health = observe(before, result, self._settings, self._clock.time())
            now = self._clock.monotonic()
            delay = next_delay(entry.health, self._settings)
            entry.due = min(entry.due, now + delay) if passive else now + delay
            after = entry.health
        if passive:
            self._wake.set()  # the loop may be sleeping until a healthy backend's far-off probe
        if after.state != before.state:
            fields: dict[str, object] = {"backend": name, "url": url, "was": before.state}
            if after.last_error:
                fields["reason"] = after.last_error
            if after.state == "healthy":
                self._log.info("backend.healthy", models=",".join(after.models) or "-", **fields)
            elif after.state == "warming":
                self._log.info("backend.warming", **fields)
            else:
                self._log.warning(f"backend.{after.state}", **fields)
