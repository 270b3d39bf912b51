"""The GPU check's script runs end to end here, on the small shape (this machine has no GPU): a split
of three stage processes plus the coordinator, held to single-process mlx-lm's greedy tokens."""

from __future__ import annotations

import json
from pathlib import Path

from e2e import gpu_check


def test_the_split_ranges_cover_every_layer_once():
    assert gpu_check.splits_of(16, 3) == [(0, 4), (5, 10), (11, 15)]
    assert gpu_check.splits_of(6, 3) == [(0, 1), (2, 3), (4, 5)]


def test_the_small_check_runs_and_is_exact(tmp_path: Path, capsys):
    assert gpu_check.main(["--small", "--rounds", "1", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "| greedy tokens = mlx-lm" in out and "yes (24 tokens)" in out and "agent memory report" in out
    figures = json.loads((tmp_path / "r.json").read_text())
    assert figures["pipe_tokens"] == figures["ref_tokens"] and len(figures["ref_tokens"]) == 24
    assert figures["node"]["memory"]["kind"] in ("host", "cuda", "metal")
