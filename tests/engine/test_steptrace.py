"""The step trace: off unless PIPESERVE_STEP_TRACE names a file; marks appended in whole batches; and in a
real pipeline every process marks its steps, on one clock, in the order a token travels."""

from __future__ import annotations

import requests

from orchestrator import settings
from orchestrator.engine import steptrace
from orchestrator.engine.local_pipeline import LocalPipeline
from orchestrator.engine.steptrace import FLUSH_EVERY, StepTrace


def test_off_unless_a_file_is_named(monkeypatch):
    monkeypatch.delenv(settings.STEP_TRACE.name, raising=False)
    assert StepTrace.of("stage-0") is None


def test_marks_are_appended_in_batches_and_read_in_time_order(tmp_path, monkeypatch):
    path = tmp_path / "steps.trace"
    monkeypatch.setenv(settings.STEP_TRACE.name, str(path))
    a, b = StepTrace.of("stage-0"), StepTrace.of("stage-1")
    a.mark("input")
    b.mark("input")
    assert not path.exists()  # held in memory: no file operation per step
    for _ in range(FLUSH_EVERY - 1):
        a.mark("evaluated")
    assert len(path.read_text().splitlines()) == FLUSH_EVERY  # the batch, whole lines
    b.flush()
    marks = steptrace.read(path)
    assert [m[0] for m in marks] == sorted(m[0] for m in marks)
    assert marks[0][1:] == ("stage-0", "input") and ("stage-1", "input") in [m[1:] for m in marks[:3]]


def test_a_running_pipeline_marks_every_step_in_the_order_a_token_travels(tmp_path, model_factory):
    path = tmp_path / "steps.trace"
    p = LocalPipeline(tmp_path / "c", model_factory(), [(0, 1), (2, 3)], threads=1,
                      env={settings.STEP_TRACE.name: str(path)}, model_name="m").start()
    try:
        for _ in range(3):  # enough steps that every process flushed a batch of marks
            requests.post(p.base_url + "/v1/completions", json={"model": "m", "prompt": [1, 2, 3], "max_tokens": 40,
                                                                "temperature": 0}, timeout=120).raise_for_status()
    finally:
        p.stop()
    marks = steptrace.read(path)
    order = [("stage-0", "input"), ("stage-0", "evaluated"), ("stage-0", "sent"), ("stage-1", "input"),
             ("stage-1", "evaluated"), ("stage-1", "sent"), ("coordinator", "results"), ("coordinator", "sent")]
    events = [m[1:] for m in marks]
    assert set(order) <= set(events)
    assert {("stage-0", "read"), ("stage-1", "read")} <= set(events)  # each stage's upstream reader
    # a decode step: what causes what comes in that order (a "sent" is marked once the send returned, so
    # the next process may read the frames before it)...
    start = events.index(("stage-0", "input"), len(events) // 2)
    causal = [("stage-0", "input"), ("stage-0", "evaluated"), ("stage-1", "read"), ("stage-1", "input"),
              ("stage-1", "evaluated"), ("coordinator", "results"), ("stage-0", "read"), ("stage-0", "input")]
    assert [e for e in events[start:] if e in causal][:len(causal)] == causal
    # ...and every process marks its own events of a step in order (from its first of them: the step
    # before may still be marking its "sent")
    for who, own in (("stage-0", ["input", "evaluated", "sent"]), ("stage-1", ["read", "input", "evaluated", "sent"]),
                     ("coordinator", ["results", "sent"])):
        seen = [e for w, e in events[start:] if w == who and e in own]
        assert seen[seen.index(own[0]):][:len(own)] == own
