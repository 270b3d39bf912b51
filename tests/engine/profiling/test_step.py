"""The compute profile's per-step path (engine/profiling/step.py): timed through the real stage
and coordinator code, written into the profile, and read by the planner.

No assert on how long anything takes (the machine is shared and loaded): what is checked is
that every number is measured, through a path that really served the rows, and that a broken
path fails loudly instead of timing something else.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

from orchestrator.agent.perf_schemas import ComputeProfile
from orchestrator.engine.profiling import step as profile_step
from orchestrator.engine.stage.shard import ModelInfo
from orchestrator.planner.perf_inputs import LayerTiming

FIELDS = ("step_ms_b1", "step_ms_bB", "last_step_ms_b1", "last_step_ms_bB", "coordinator_ms_b1", "coordinator_ms_bB")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from orchestrator.testmodels.llama import make_test_model

    return make_test_model(tmp_path_factory.mktemp("m") / "tiny", layers=3, hidden=64, vocab=512)


def test_every_path_is_measured_at_1_and_b_rows(tiny):
    got = profile_step.step_overheads(ModelInfo.read(tiny), mx.float32, batch=4)
    assert set(got) == set(FIELDS)
    assert all(math.isfinite(v) and v > 0 for v in got.values()), got


@pytest.mark.parametrize("last", [False, True])
def test_the_stage_path_serves_every_row(tiny, last):
    # the timing only counts a step once the next hop holds `rows` FORWARD (or RESULT) frames
    assert profile_step.time_stage_path(ModelInfo.read(tiny), mx.float32, rows=3, last=last, steps=3) > 0


def test_a_stage_that_fails_its_step_is_an_error_not_a_time(tiny, monkeypatch):
    def broken(self, x, cache):
        raise RuntimeError("no head today")

    monkeypatch.setattr(profile_step._StandInModel, "forward", broken)
    with pytest.raises(profile_step.PathError, match="ERROR"):
        profile_step.time_stage_path(ModelInfo.read(tiny), mx.float32, rows=2, last=True, steps=2)


def test_a_stage_that_sends_nothing_is_an_error(tiny, monkeypatch):
    from orchestrator.engine.stage.stage import Stage

    monkeypatch.setattr(profile_step, "WAIT_S", 0.5)
    monkeypatch.setattr(Stage, "_send_down", lambda self, frames: None)
    with pytest.raises(profile_step.PathError, match="nothing arrived"):
        profile_step.time_stage_path(ModelInfo.read(tiny), mx.float32, rows=1, last=False, steps=2)


def test_the_profile_writes_the_paths_and_the_planner_reads_them(tiny, tmp_path):
    out = tmp_path / "p.json"
    subprocess.run([sys.executable, "-m", "orchestrator.engine.profiling.layers", "--model", str(tiny),
                    "--out", str(out),
                    "--batch", "8", "--prefill-chunk", "32"], check=True, timeout=300)
    data = json.loads(out.read_text())
    assert all(data[k] > 0 for k in FIELDS), data
    # decode steps of 2 and 4 rows are timed too (the layers and the head)
    assert [r for r, _ in data["layer_ms_rows"]] == [2, 4] and [r for r, _ in data["head_ms_rows"]] == [2, 4]
    timing = LayerTiming(**{k: v for k, v in data.items() if k not in ("threads", "at")})
    assert timing.step_overhead_ms(8, last=True) == pytest.approx(data["last_step_ms_bB"])
    assert timing.layer_ms(4) == pytest.approx(data["layer_ms_rows"][1][1])
    # the agent's wire model keeps them (control/perf.py builds the LayerTiming from it)
    wire = ComputeProfile.model_validate({**data, "model_id": "tiny"})
    assert all(getattr(wire, k) == data[k] for k in FIELDS)
    assert wire.layer_ms_rows == tuple(tuple(p) for p in data["layer_ms_rows"])


def test_the_head_is_timed_behind_the_other_layers(tiny):
    # engine/profile.time_stage runs `between` (the body's step) before every timed step of
    # the tail: back to back, a small tail stays in cache and looks cheaper than it serves
    from orchestrator.engine.profiling import layers as profile
    from orchestrator.engine.stage.shard import StageModel

    calls = []
    tail = StageModel(tiny, 2, 3)
    got = profile.time_stage(tail, 4, lambda solo: None, between=lambda: calls.append(1))
    assert set(got) == {"b1_solo", "b1", "b2", "bB"}  # 2 rows sits between 1 and the batch of 4
    assert len(calls) == profile.ROUNDS * len(got) * profile.REPEATS


@pytest.mark.parametrize("ms, most, expected", [
    (0.001, 4, 4),   # OpenBLAS: 4 layers' prefill rounds take well under the budget
    (2.0, 4, 1),     # the reference BLAS on a big layer: one layer, never zero
    (0.4, 4, 3),     # 0.4 ms/token x 8,192 tokens = 3.3 s a layer: three fit in 10 s
    (0.0, 4, 4),     # nothing measured: the default
])
def test_prefill_is_timed_on_as_many_layers_as_the_budget_allows(ms, most, expected):
    from orchestrator.engine.profiling import layers

    assert layers.prefill_layers(ms, 2048, most) == expected


@pytest.mark.parametrize("family", ["gemma4_text", "afm7"])
def test_a_family_that_refuses_some_cuts_is_timed_at_cuts_it_allows(family, tmp_path):
    """Gemma 4 and AFM keep their KV-shared layers on their source's stage (support.shared_kv_cuts):
    the profile's body and tail end and begin where a split may, instead of failing there."""
    from orchestrator.engine.profiling.layers import allowed_cut
    from orchestrator.engine.stage.shard import read_config
    from orchestrator.families import support
    from orchestrator.testmodels.families import build_family_model

    model = build_family_model(tmp_path / family, family)
    cuts = support.shared_kv_cuts(read_config(model))
    assert cuts and allowed_cut(5, cuts) == min(cuts) - 1 and allowed_cut(0, cuts) == 0
    out = tmp_path / "p.json"
    subprocess.run([sys.executable, "-m", "orchestrator.engine.profiling.layers", "--model", str(model),
                    "--out", str(out), "--batch", "4", "--prefill-chunk", "32"], check=True, timeout=300)
    data = json.loads(out.read_text())
    assert data["layer_ms_b1"] > 0 and data["head_ms_b1"] >= 0 and data["prefill_ms_per_token"] > 0, data
