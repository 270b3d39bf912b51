"""The busy-machine rule (agent/timing_doubt.py): when a timing of the layers is doubted."""

from __future__ import annotations

import pytest

from orchestrator.agent.timing_doubt import profile_doubt, timing_doubt


@pytest.mark.parametrize("b1, rows, spread, load, cpus, says", [
    (1.0, [(2, 1.3), (4, 1.6), (8, 2.5)], 0.05, 0.4, 2, []),  # a quiet machine
    (1.0, [(8, 2.5)], 0.0, 1.5, 2, []),  # load at the limit's share (0.75 x 2) is not busy yet
    (1.0, [(8, 2.5)], 0.0, 1.6, 2, ["load 1.6 on 2 CPUs"]),
    (1.0, [(8, 2.5)], 0.0, 5.0, 0, []),  # CPUs unknown: no load verdict
    (1.0, [(8, 2.5)], 0.25, 0.0, 2, []),  # rounds 25 % apart: noise
    (1.0, [(8, 2.5)], 0.4, 0.0, 2, ["40 % apart"]),
    (1.0, [(2, 0.81)], 0.0, 0.0, 2, []),  # a batched step within the slack of one row's
    (2.4, [(2, 1.9), (4, 1.2), (8, 3.0)], 0.0, 0.0, 2, ["a step of 4 rows timed faster (1.20 ms a layer) than one "
                                                        "of 1 row (2.40 ms)"]),
    (2.4, [(4, 1.2)], 0.5, 3.0, 2, ["load 3.0", "50 % apart", "4 rows timed faster"]),
])
def test_the_busy_machine_rule(b1, rows, spread, load, cpus, says):
    doubt = timing_doubt(layer_ms_b1=b1, rows=rows, spread=spread, load=load, cpus=cpus)
    if not says:
        assert doubt == ""
    for part in says:
        assert part in doubt, doubt
    assert doubt.count(";") == max(0, len(says) - 1)


def test_a_profile_is_judged_by_the_same_rule_with_its_batch_step():
    profile = {"batch": 8, "layer_ms_b1": 3.0, "layer_ms_bB": 1.0, "layer_ms_rows": [[2, 3.1], [4, 3.2]],
               "load": 0.1, "cpus": 2}
    assert "a step of 8 rows timed faster" in profile_doubt(profile)
    assert profile_doubt({**profile, "layer_ms_bB": 4.0}) == ""
