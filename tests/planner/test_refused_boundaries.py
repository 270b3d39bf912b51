"""Boundaries the engine refuses (Gemma 4's KV-shared layers stay with their sources, AFM's KV-reuse
layers with the layer whose K/V they read) are never
planned: the balancer cuts elsewhere and a manual split that cuts there is refused."""

from __future__ import annotations

from pathlib import Path

from orchestrator.engine.wire import named_directory_bytes
from orchestrator.families.decoder_config import read_config_file
from orchestrator.families.support import shared_kv_cuts
from orchestrator.models.describe import describe_model
from orchestrator.planner import Plan, PlanSettings, Refusal, RefusalCode, plan_cluster
from orchestrator.testmodels.families import build_family_model
from tests.support.builders import GB, facts_for
from tests.support.planner_inputs import llama

SHARED = llama().model_copy(update={"refused_boundaries": tuple(range(12, 30))})  # stages may start at 1..11 only


def _starts(plan: Plan) -> list[int]:
    return [s.first_layer for s in plan.stages]


def test_the_description_carries_the_refused_boundaries(tmp_path: Path) -> None:
    model = build_family_model(tmp_path / "g4", "gemma4")
    described = describe_model(model)
    assert described.refused_boundaries == (3, 4, 5)
    assert set(described.refused_boundaries) == set(shared_kv_cuts(read_config_file(model)))
    afm = build_family_model(tmp_path / "afm7", "afm7")  # its KV-reuse layers 4, 5 stay with layer 3
    assert describe_model(afm).refused_boundaries == (4, 5) == tuple(sorted(shared_kv_cuts(read_config_file(afm))))
    plain = describe_model(build_family_model(tmp_path / "llama", "llama"))
    assert plain.refused_boundaries == ()


def test_the_balancer_never_cuts_at_a_refused_boundary() -> None:
    settings = PlanSettings(context_length=1024, max_concurrent_sequences=1)
    free = plan_cluster(llama(), facts_for(8 * GB, 8 * GB), settings)
    assert isinstance(free, Plan) and _starts(free)[1] >= 12  # unconstrained, it cuts in the middle
    plan = plan_cluster(SHARED, facts_for(8 * GB, 8 * GB), settings)
    assert isinstance(plan, Plan), plan
    assert _starts(plan)[1] == 11  # the closest to balanced that is allowed
    three = plan_cluster(SHARED, facts_for(8 * GB, 8 * GB, 8 * GB), settings)
    assert isinstance(three, Plan) and all(s not in SHARED.refused_boundaries for s in _starts(three))


def test_a_manual_split_at_a_refused_boundary_is_refused() -> None:
    settings = PlanSettings(context_length=1024, max_concurrent_sequences=1, manual_split=((0, 14), (15, 29)))
    result = plan_cluster(SHARED, facts_for(8 * GB, 8 * GB), settings)
    assert isinstance(result, Refusal) and set(result.codes) == {RefusalCode.INVALID_SPLIT}
    assert "stage 1 starts at layer 15, which would separate KV-shared layers" in result.reasons[0].message
    ok = settings.model_copy(update={"manual_split": ((0, 10), (11, 29))})
    assert isinstance(plan_cluster(SHARED, facts_for(8 * GB, 8 * GB), ok), Plan)


def test_the_planned_wire_bytes_are_the_frames_a_stage_sends(tmp_path: Path) -> None:
    """Per boundary, the planner's bytes per token equal the decode frame the first stage encodes
    (NAMED frames for Gemma 4 and 3n, Hunyuan, RWKV-7, Talkie, Kimi-K3 and DeepSeek-V4.1, whose rows average
    eight decode steps; the one-tensor frame for Llama)."""
    from e2e.bench_wire import measured_rows

    rows = measured_rows(tmp_path)
    assert {f for f, _, _, _ in rows} == {"llama", "gemma4_text", "gemma3n", "hunyuan", "rwkv7", "talkie", "kimi_k3",
                                          "deepseek_v41"}
    assert [(f, b, p) for f, b, p, m in rows if p != m] == []
    by = {(f, b): p for f, b, p, _ in rows}
    assert by["llama", 1] == 36 + 64 * 4  # the one-tensor frame: header + hidden state
    assert by["hunyuan", 1] > by["hunyuan", 2] == by["llama", 1]  # K/V projections only inside a pair
    assert by["gemma4_text", 1] > by["gemma4_text", 2]  # one layer fewer of per-layer inputs downstream
    assert by["talkie", 1] == by["talkie", 3] > by["llama", 1] + 64 * 4  # the embedding beside the hidden state
    # one more block of attention residuals [64 floats] beyond each block start (layers 0, 2, 4)
    assert by["kimi_k3", 1] == by["kimi_k3", 2] < by["kimi_k3", 3] == by["kimi_k3", 4] < by["kimi_k3", 5]
    assert by["gemma3n", 1] > by["gemma4_text", 1] + 3 * 64 * 4  # four AltUp streams, not one hidden state
    # the streams and pre-mix alone before layer 1; the shared parts the later layers read beyond
    streams = named_directory_bytes({"h": (1,) * 4, "pre_mix": (1,) * 3}) + 4 * 64 * 4 + 4 * 4
    assert by["deepseek_v41", 1] == 36 + streams
    assert min(by["deepseek_v41", b] for b in (2, 3, 4, 5)) > by["deepseek_v41", 1]


def test_the_plan_times_the_widest_boundary() -> None:
    from orchestrator.planner.memory import plan_wire_bytes, wire_bytes_per_token

    wide = llama().model_copy(update={"boundary_bytes": tuple(1000 + b for b in range(1, 30))})
    assert wire_bytes_per_token(wide, 3) == 1003
    assert plan_wire_bytes(wide, ((0, 9), (10, 19), (20, 29))) == 1020
    assert plan_wire_bytes(llama(), ((0, 14), (15, 29))) == 576 * llama().dtype_bytes
