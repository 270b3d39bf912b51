"""The agent times a model's layers again while the busy-machine rule doubts them (agent/compute.py),
with the timing process, the machine's load and the pause injected at the I/O edge."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.agent import compute
from orchestrator.logs import EventLogger
from tests.support.engine_jobs import ModelsFolder

QUIET = {"batch": 8, "layer_ms_b1_solo": 1.0, "layer_ms_b1": 1.0, "layer_ms_bB": 2.5, "prefill_ms_per_token": 0.1,
         "layer_ms_rows": [[2, 1.2], [4, 1.6]], "spread": 0.05}
INCONSISTENT = {**QUIET, "layer_ms_b1": 3.0}  # one row slowed by something else: 3x a step of 2 rows


def _profiler(tmp_path: Path, timings: list[dict], loads: list[float]):
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.json").write_text("{}")
    runs, pauses = [], []

    def run(model_dir: Path, out: Path) -> dict:
        assert model_dir == tmp_path / "models" / "m" and out.parent.is_dir()
        runs.append(model_dir)
        return timings[min(len(runs), len(timings)) - 1]

    def load() -> tuple[float, int]:
        return loads[min(len(runs), len(loads) - 1)], 2

    p = compute.ComputeProfiler(ModelsFolder(tmp_path / "models"), tmp_path / "state", EventLogger("test"), run=run,
                                load=load, sleep=pauses.append, tries=compute.TRIES)
    return p, runs, pauses


def _timed(p: compute.ComputeProfiler):
    assert p.start("m").state == "running"
    deadline = time.monotonic() + 10
    while (status := p.status("m")).state == "running":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert status.state == "done", status.error
    return status.profile


def test_a_quiet_machine_is_timed_once(tmp_path):
    p, runs, pauses = _profiler(tmp_path, [QUIET], [0.3])
    profile = _timed(p)
    assert (len(runs), pauses, profile.tries, profile.doubt) == (1, [], 1, "")


def test_a_busy_machine_is_timed_again_until_it_is_quiet(tmp_path):
    p, runs, pauses = _profiler(tmp_path, [INCONSISTENT, QUIET], [3.5, 0.2])
    profile = _timed(p)
    assert len(runs) == 2 and pauses == [compute.RETRY_PAUSE_S]
    assert (profile.tries, profile.doubt, profile.load, profile.layer_ms_b1) == (2, "", 0.2, 1.0)


def test_a_machine_busy_through_every_try_keeps_its_doubt(tmp_path):
    p, runs, pauses = _profiler(tmp_path, [INCONSISTENT], [3.5])
    profile = _timed(p)
    assert len(runs) == compute.TRIES and pauses == [compute.RETRY_PAUSE_S] * (compute.TRIES - 1)
    assert profile.tries == compute.TRIES
    assert "load 3.5 on 2 CPUs" in profile.doubt and "a step of 2 rows timed faster" in profile.doubt
    assert p.cached("m") == profile  # kept, with its doubt, for the report and the plan card


def test_a_failed_timing_is_not_retried(tmp_path):
    p, runs, pauses = _profiler(tmp_path, [QUIET], [0.3])

    def fail(model_dir: Path, out: Path) -> dict:
        runs.append(model_dir)
        raise compute.ProfileFailed("Illegal instruction")

    p._timed = fail
    assert p.start("m").state == "running"
    deadline = time.monotonic() + 10
    while (status := p.status("m")).state == "running":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert (status.state, status.error, len(runs), pauses) == ("failed", "Illegal instruction", 1, [])



@pytest.mark.parametrize("seconds, tries", [
    (4.0, 3),   # the third try starts 4 + 10 + 4 + 10 = 28 s after the first: within the window
    (6.0, 2),   # it would start at 32 s: the second timing stands, doubted
    (40.0, 1),  # a loaded machine's long timing: a second would make the prediction wait 90 s
])
def test_no_try_starts_past_the_retry_window(tmp_path, seconds, tries):
    p, runs, pauses = _profiler(tmp_path, [INCONSISTENT, INCONSISTENT, QUIET], [3.5, 3.5, 0.2])
    p._clock = lambda: seconds * len(runs) + sum(pauses)  # the fake timings and pauses take no real time
    profile = _timed(p)
    assert len(runs) == profile.tries == tries
    assert bool(profile.doubt) == (tries < 3)  # the third timing is the quiet one
