"""Which disk-tier files the index may offer after a restart (pure)."""

from __future__ import annotations

import pytest

from orchestrator.engine.coordinator.disk_adoption import Adoptable, DiskAdoption


def test_only_files_every_stage_holds_for_the_same_tokens_most_recent_first_within_budget():
    a = DiskAdoption(2, budget_bytes=100)
    stage0 = [["k1", [1, 2], "system", 40], ["k2", [1, 2, 3], "assistant", 40], ["k3", [9], "assistant", 10],
              ["k4", [7, 7], "user", 50], ["k5", [5], "assistant", 10]]
    stage1 = [["k5", [5], "assistant", 10], ["k4", [7, 7], "user", 10], ["k3", [8], "assistant", 10],
              ["k2", [1, 2, 3], "assistant", 40], ["k1", [1, 2], "system", 40]]
    assert a.offer(1, stage1) is None  # stage 0 has not answered yet
    got = a.offer(0, stage0)
    # k3: other tokens on stage 1; k4: would put stage 0 past its budget (40 + 40 + 50 > 100).
    assert got == [Adoptable("k1", (1, 2), "system"), Adoptable("k2", (1, 2, 3), "assistant"),
                   Adoptable("k5", (5,), "assistant")]


def test_a_file_one_stage_lacks_is_never_offered_and_bad_lists_are_refused():
    a = DiskAdoption(2, budget_bytes=1 << 30)
    a.offer(0, [["k1", [1], "assistant", 1]])
    assert a.offer(1, []) == []
    with pytest.raises(ValueError):
        a.offer(2, [])
    with pytest.raises(ValueError):
        a.offer(0, "not a list")
    with pytest.raises(ValueError):
        a.offer(0, [["k1", ["x"], "assistant", 1]])
