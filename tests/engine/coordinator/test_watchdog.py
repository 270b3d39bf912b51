"""The coordinator's watchdog (pure bookkeeping): when is a stage wedged?"""

from __future__ import annotations

from orchestrator.engine.coordinator.watchdog import Watchdog


def progress(steps: int, busy: float = 0.0, queued: int = 0) -> dict:
    return {"steps": steps, "busy_s": busy, "queued": queued, "request": 7, "chunk": [0, 512], "batch": 1}


def test_a_long_step_is_a_wedge_a_shorter_one_is_not():
    w = Watchdog(2, timeout=5.0)
    w.observe(0, progress(3, busy=4.9), 10.0)
    assert w.wedged(0, 10.0) == ""
    w.observe(0, progress(3, busy=5.5), 10.5)
    assert "5.5 s inside one step" in w.wedged(0, 10.5) and "512 token(s)" in w.wedged(0, 10.5)


def test_queued_work_without_a_step_is_a_wedge_only_after_the_timeout():
    w = Watchdog(1, timeout=5.0)
    w.observe(0, progress(3), 0.0)
    w.observe(0, progress(3, queued=2), 100.0)  # idle for long, then work arrives: not stalled yet
    assert w.wedged(0, 100.5) == ""
    w.observe(0, progress(4, queued=2), 103.0)  # a step completed: the wait starts over
    w.observe(0, progress(4, queued=2), 107.0)
    assert w.wedged(0, 107.0) == ""
    w.observe(0, progress(4, queued=3), 108.5)
    assert "queued and no step completed for 5.5 s" in w.wedged(0, 108.5)
    w.observe(0, progress(4, queued=0), 109.0)
    assert w.wedged(0, 109.0) == ""


def test_an_overdue_canary_names_the_first_stage_that_did_not_step():
    w = Watchdog(3, timeout=5.0)
    for i in range(3):
        w.observe(i, progress(10), 0.0)
    w.canary_sent(1.0)
    w.observe(0, progress(11), 1.5)
    assert w.canary_overdue(5.0) is None
    index, why = w.canary_overdue(6.5)
    assert index == 1 and "canary" in why
    w.canary_returned()
    assert w.canary_overdue(100.0) is None


def test_a_new_connection_forgets_the_old_process():
    w = Watchdog(1, timeout=1.0)
    w.observe(0, progress(1, busy=9.0), 0.0)
    w.forget(0)
    assert w.wedged(0, 5.0) == "" and w.last_progress(0) == {}
