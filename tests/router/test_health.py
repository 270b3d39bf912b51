"""The health state machine (pure) and the checker's scheduling (in-process, fake prober)."""

from __future__ import annotations

import threading

from orchestrator import logs
from orchestrator.proc import wait_until
from orchestrator.proc.clock import FakeClock
from orchestrator.router.config import BackendConfig, HealthChecks
from orchestrator.router.health import (
    RECHECK_NOT_HEALTHY,
    BackendHealth,
    HealthChecker,
    ProbeResult,
    next_delay,
    observe,
)

S = HealthChecks(interval=10, unhealthy_threshold=3, healthy_threshold=2)
OK = ProbeResult(200, ("m",))
DOWN = ProbeResult(None, error="refused")
WARMING = ProbeResult(503, error="HTTP 503: pipeline is starting")


def _run(results, h=BackendHealth()):
    states = []
    for r in results:
        h = observe(h, r, S, 0.0)
        states.append(h.state)
    return h, states


def test_healthy_after_threshold_successes():
    h, states = _run([OK, OK, OK])
    assert states == ["starting", "healthy", "healthy"]
    assert h.models == ("m",) and h.routable


def test_unhealthy_after_threshold_failures_and_routable_until_then():
    h, _ = _run([OK, OK])
    h, states = _run([DOWN, DOWN, DOWN], h)
    assert states == ["healthy", "healthy", "unhealthy"]
    assert not h.routable and h.last_error == "refused"
    h, states = _run([OK, DOWN, OK, OK], h)  # a failure in between restarts the count
    assert states == ["unhealthy", "unhealthy", "unhealthy", "healthy"]


def test_503_leaves_rotation_at_once_and_needs_fresh_successes():
    h, _ = _run([OK, OK])
    h, states = _run([WARMING, OK, OK], h)
    assert states == ["warming", "warming", "healthy"]
    assert observe(BackendHealth(), WARMING, S, 0).state == "warming"


def test_recheck_delays():
    assert next_delay(BackendHealth("healthy", 2), S) == 10
    assert next_delay(BackendHealth("healthy", 0, 1), S) == 1.0  # a failing healthy one is looked at sooner
    for state in ("starting", "warming", "unhealthy"):
        assert next_delay(BackendHealth(state), S) == 1.0  # a 503 is re-checked every second
    assert next_delay(BackendHealth("warming"), HealthChecks(interval=0.2)) == 0.2


def test_checker_probes_new_backends_at_once_keeps_health_across_reload_and_drops_removed():
    calls: list[str] = []
    lock = threading.Lock()

    def prober(url: str, s: HealthChecks) -> ProbeResult:
        with lock:
            calls.append(url)
        return OK

    checker = HealthChecker(logs.get("test"), prober)
    settings = HealthChecks(interval=0.1, healthy_threshold=2)
    a = BackendConfig(name="a", url="http://a:1")
    checker.configure((a,), settings)
    checker.start()
    try:
        wait_until(lambda: checker.snapshot()["a"].state == "healthy", 3, 0.01, "backend a to be healthy")
        b = BackendConfig(name="b", url="http://b:1")
        checker.configure((a, b), settings)  # a reload that adds b
        assert checker.snapshot()["a"].state == "healthy"
        assert checker.snapshot()["b"].state == "starting"
        checker.configure((BackendConfig(name="b", url="http://b:2"),), settings)  # a removed, b's URL changed
        snap = checker.snapshot()
        assert set(snap) == {"b"} and snap["b"].state == "starting"
        with lock:
            calls.clear()
        wait_until(lambda: len(calls) >= 2, 5, 0.01, "b's new URL to be probed twice")
        with lock:
            assert set(calls) == {"http://b:2"}, calls  # the removed a and b's old URL are never probed again
    finally:
        checker.stop()


class WatchedClock(FakeClock):
    """A fake clock that counts how often it is read: the checker's loop reads it once a pass."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def monotonic(self) -> float:
        self.reads += 1
        return super().monotonic()

    def passes(self, n: int = 2) -> None:
        """Until the checker's loop has looked at the time `n` more times (n passes)."""
        seen = self.reads
        wait_until(lambda: self.reads >= seen + n, 5, 0.001, message=f"{n} passes of the checker's loop")


def test_disabled_checks_make_every_backend_routable_without_probing():
    # The prober runs on the checker's pool, which turns any exception into a failed probe:
    # it records its calls, and the test asserts on them in its own thread.
    calls: list[str] = []

    def prober(url: str, s: HealthChecks) -> ProbeResult:
        calls.append(url)
        return OK

    clock = WatchedClock()
    checker = HealthChecker(logs.get("test"), prober, clock)
    a = BackendConfig(name="a", url="http://a:1")
    checker.configure((a,), HealthChecks(enabled=False, interval=0.05))
    checker.start()
    try:
        assert checker.snapshot()["a"].routable
        clock.advance(3600)  # an hour of 0.05 s intervals: every probe would be long due
        clock.passes()
        assert calls == [] and checker.snapshot()["a"].routable
        checker.configure((a,), HealthChecks(enabled=True, interval=0.05))  # the same checker does probe when enabled
        wait_until(lambda: calls, 5, 0.01, "a probe once checks are enabled")
    finally:
        checker.stop()


def test_a_503_answer_to_a_proxied_request_takes_the_backend_out_before_its_next_probe():
    """A coordinator repairing its pipeline answers 503: the router stops routing to it at once
    (its own 503 + Retry-After follows), not only after the next probe, `interval` later; it is
    probed again a second later (RECHECK_NOT_HEALTHY), not after the healthy backend's 60 s."""
    results = [OK]
    probes: list[float] = []
    clock = WatchedClock()

    def prober(url: str, s: HealthChecks) -> ProbeResult:
        probes.append(clock.monotonic())
        return results[-1]

    checker = HealthChecker(logs.get("test"), prober, clock)
    a = BackendConfig(name="a", url="http://a:1")
    checker.configure((a,), HealthChecks(interval=60, healthy_threshold=1))
    checker.start()
    try:
        wait_until(lambda: checker.snapshot()["a"].routable, 3, 0.01, "backend a to be healthy")
        checker.report_unavailable("a", "http://a:1", "HTTP 503 to a proxied request")
        h = checker.snapshot()["a"]
        assert h.state == "warming" and not h.routable and h.last_status == 503, h
        clock.advance(RECHECK_NOT_HEALTHY - 0.01)
        clock.passes()
        assert probes == [0.0] and not checker.snapshot()["a"].routable  # not re-probed before its second
        clock.advance(0.01)
        wait_until(lambda: checker.snapshot()["a"].routable, 5, 0.01, "the re-probe a second later")
        assert probes == [0.0, RECHECK_NOT_HEALTHY]
    finally:
        checker.stop()
