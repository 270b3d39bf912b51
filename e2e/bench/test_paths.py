"""The traced pipeline's spans (e2e/bench/paths.py --pipeline), on a made-up trace."""

from __future__ import annotations

from e2e.bench.paths import rows_of, spans


def test_spans_pair_each_start_with_the_next_end():
    marks = [(0.000, "stage-0", "evaluated"), (0.0004, "stage-1", "input"), (0.040, "stage-1", "evaluated"),
             (0.090, "stage-0", "evaluated"), (0.0906, "stage-1", "input"), (0.2, "stage-1", "input")]
    assert [round(x, 3) for x in spans(marks, ("stage-0", "evaluated"), ("stage-1", "input"))] == [0.4, 0.6]
    assert spans(marks, ("stage-1", "input"), ("stage-1", "input"), longest_ms=100) == [
        (0.0906 - 0.0004) * 1000]  # a gap past longest_ms is not one step's


def test_rows_name_every_stage_and_boundary():
    marks = [(0.0, "stage-0", "input"), (0.030, "stage-0", "evaluated"), (0.0302, "stage-0", "sent"),
             (0.0303, "stage-1", "read"), (0.0305, "stage-1", "input"),
             (0.060, "stage-1", "evaluated"), (0.0602, "stage-1", "sent"), (0.0604, "coordinator", "results"),
             (0.0606, "coordinator", "sent"), (0.0609, "stage-0", "input")]
    rows = dict(rows_of(marks, 2))
    assert [round(x, 1) for x in rows["boundary 0 → 1: evaluated → next stage's input ready"]] == [0.5]
    assert [round(x, 1) for x in rows["  of which stage 0: evaluated → sent"]] == [0.2]
    assert [round(x, 1) for x in rows["  of which evaluated → stage 1's reader has the frames"]] == [0.3]
    assert [round(x, 1) for x in rows["coordinator: RESULT → next step sent"]] == [0.2]
    assert [round(x, 1) for x in rows["token interval (stage 0's input to its next)"]] == [60.9]
