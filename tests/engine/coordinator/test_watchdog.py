"""The coordinator's watchdog (pure bookkeeping): a wedge is no progress while work waits; slow is not stuck."""

from __future__ import annotations

from orchestrator.engine.coordinator.watchdog import SLOW_FACTOR, Watchdog


def progress(steps: int, busy: float = 0.0, queued: int = 0, layers: int = 0, slowest_ms: float = 0.0) -> dict:
    return {"steps": steps, "busy_s": busy, "queued": queued, "layers": layers, "slowest_ms": slowest_ms,
            "request": 7, "chunk": [0, 512], "batch": 1}


def test_a_step_without_progress_past_the_timeout_is_a_wedge_a_shorter_one_is_not():
    w = Watchdog(2, timeout=5.0)
    w.observe(0, progress(3, busy=4.9), 10.0)
    assert w.wedged(0, 10.0) == ""
    w.observe(0, progress(3, busy=5.5), 10.6)
    why = w.wedged(0, 10.6)
    assert "5.5 s inside one step" in why and "512 token(s)" in why


def test_a_slow_stage_gets_an_allowance_that_follows_its_step_times():
    # 3 s per step on a loaded machine (the stage judged wedged in the field): 12 s before a verdict
    w = Watchdog(1, timeout=5.0)
    w.observe(0, progress(40, busy=0.1, slowest_ms=3000.0), 0.0)
    assert w.allowance(0) == SLOW_FACTOR * 3.0
    w.observe(0, progress(40, busy=8.1, slowest_ms=3000.0), 8.0)
    assert w.wedged(0, 8.0) == ""  # past the stall timeout, inside its allowance: slow, not stuck
    w.observe(0, progress(40, busy=12.6, slowest_ms=3000.0), 12.5)
    assert "its allowance is 12.0 s" in w.wedged(0, 12.5)


def test_layers_done_inside_one_long_step_are_progress():
    w = Watchdog(1, timeout=5.0)
    for k in range(1, 8):  # a prefill chunk evaluated layer by layer, one layer every 3 s
        w.observe(0, progress(3, busy=3.0 * k, layers=k), 3.0 * k)
        assert w.wedged(0, 3.0 * k + 1) == ""
    w.observe(0, progress(3, busy=30.0, layers=7), 30.0)
    assert "inside one step" in w.wedged(0, 30.0)  # the layers stopped moving 9 s ago


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


def test_a_wedged_stage_that_moves_again_has_recovered():
    w = Watchdog(1, timeout=2.0)
    w.observe(0, progress(5, busy=3.0), 10.0)
    assert w.wedged(0, 10.0)
    assert not w.recovered(0)
    w.observe(0, progress(5, busy=4.0), 11.0)
    assert not w.recovered(0)  # still inside the same step
    w.observe(0, progress(6, queued=1), 12.0)
    assert w.recovered(0)
    assert not w.recovered(0)  # said once


def test_a_wedged_stage_whose_work_is_gone_has_recovered():
    w = Watchdog(1, timeout=2.0)
    w.observe(0, progress(5, queued=3), 0.0)
    w.observe(0, progress(5, queued=3), 3.0)
    assert w.wedged(0, 3.0)
    w.observe(0, progress(5), 4.0)
    assert w.recovered(0)


def test_an_overdue_canary_names_a_stage_that_did_not_move():
    w = Watchdog(3, timeout=5.0)
    for i in range(3):
        w.observe(i, progress(10), 0.0)
    w.canary_sent(1.0)
    w.observe(0, progress(11), 1.5)
    assert w.canary_overdue(15.0) is None  # within the three stages' allowances together
    index, why = w.canary_overdue(16.5)
    assert index == 1 and "canary" in why
    w.canary_returned()
    assert w.canary_overdue(100.0) is None


def test_a_canary_through_slow_stages_that_all_moved_is_not_blamed_on_any():
    # the false wedge seen in the field: stage-1 at 3 s per step, the last stage blamed by default
    w = Watchdog(2, timeout=5.0)
    for i in range(2):
        w.observe(i, progress(10, slowest_ms=3000.0), 0.0)
    w.canary_sent(1.0)
    w.observe(0, progress(11, slowest_ms=3000.0), 4.0)
    w.observe(1, progress(11, busy=2.0, slowest_ms=3000.0), 30.0)
    assert w.canary_overdue(30.0) is None


def test_a_new_connection_forgets_the_old_process():
    w = Watchdog(1, timeout=1.0)
    w.observe(0, progress(1, busy=9.0), 0.0)
    w.forget(0)
    assert w.wedged(0, 5.0) == "" and w.last_progress(0) == {}
