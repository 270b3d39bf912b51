"""Memory arithmetic against numbers computed by hand."""

from __future__ import annotations

import pytest

from orchestrator.planner import Plan, PlanSettings, StageCosts, kv_cache_bytes, kv_tokens, plan_cluster
from tests.support.builders import GB, facts_for
from tests.support.planner_inputs import llama, uniform

# 4 layers of 1000 bytes, embedding 500 (vocab 10: 50 bytes a row), norm 10, head 300;
# KV: 2 (k, v) x 2 heads x 4 dims x 4 bytes = 64 bytes per token per layer.
TOY = dict(layer_bytes=1000, embedding=500, norm=10, head=300, vocab=10, kv_heads=2, head_dim=4)
SETTINGS = PlanSettings(context_length=512, max_concurrent_sequences=3, stage_overhead_bytes=100,
                        coordinator_overhead_bytes=50, manual_split=((0, 1), (2, 3)))
KV_2_LAYERS = 64 * 2 * 512 * 3  # 196,608


@pytest.mark.parametrize("context,tokens", [(8, 256), (256, 256), (257, 512), (512, 512), (4096, 4096), (4097, 4352)])
def test_kv_cache_rounds_up_to_mlx_lm_steps(context: int, tokens: int) -> None:
    assert kv_tokens(context) == tokens


def test_kv_cache_smollm2_by_hand() -> None:
    """SmolLM2-135M f32: 3 KV heads x 64 dims; 30 layers at 2048 tokens, one sequence: 90 MiB."""
    s = PlanSettings(context_length=2048, max_concurrent_sequences=1)
    assert kv_cache_bytes(llama(), s) == 2 * 30 * 3 * 64 * 4 * 2048 * 1 == 94_371_840
    assert kv_cache_bytes(llama(dtype="bfloat16"), s.model_copy(update={"max_concurrent_sequences": 4})) \
        == 2 * 30 * 3 * 64 * 2 * 2048 * 4


@pytest.mark.parametrize("tied,last_weights,last_tokens", [
    (False, 2000 + 10 + 300, 2000 + 10 + 300),  # layers, norm, lm_head
    (True, 2000 + 10 + 500, 2000 + 10 + 500),  # layers, norm, and the embedding again (it is the head)
])
def test_stage_rows_by_hand(tied: bool, last_weights: int, last_tokens: int) -> None:
    plan = plan_cluster(uniform(4, tied=tied, **TOY), facts_for(10**6, 10**6), SETTINGS)
    assert isinstance(plan, Plan), plan
    first, last = plan.stages
    assert (first.weight_bytes, first.kv_cache_bytes, first.overhead_bytes) == (2000 + 500, KV_2_LAYERS, 150)
    assert first.total_bytes == 2500 + 196_608 + 150 == 199_258
    assert first.token_bytes == 2000 + 50  # one embedding row per token
    assert first.fit_fraction == pytest.approx(199_258 / 10**6)
    assert (first.holds_embedding, first.holds_head, first.runs_coordinator) == (True, False, True)
    assert (last.weight_bytes, last.kv_cache_bytes, last.overhead_bytes) == (last_weights, KV_2_LAYERS, 100)
    assert last.total_bytes == last_weights + KV_2_LAYERS + 100
    assert last.token_bytes == last_tokens
    assert (last.holds_embedding, last.holds_head, last.runs_coordinator) == (tied, True, False)
    assert (last.free_bytes, last.layers, last.num_layers, last.fits) == (10**6, "2-3", 2, True)


def test_cluster_total_is_the_sum_of_any_split() -> None:
    """What a cluster needs in total does not depend on where the cuts are."""
    for tied in (False, True):
        costs = StageCosts(uniform(6, tied=tied, **TOY), SETTINGS)
        for cuts in ([(0, 3), (3, 6)], [(0, 1), (1, 6)], [(0, 2), (2, 4), (4, 6)]):
            total = sum(costs.total_bytes(a, b, runs_coordinator=k == 0) for k, (a, b) in enumerate(cuts))
            assert costs.cluster_bytes(len(cuts)) == total


def test_single_node_needs_the_embedding_once() -> None:
    costs = StageCosts(uniform(4, tied=True, **TOY), SETTINGS)
    assert costs.single_node_bytes() == 4000 + 500 + 10 + 64 * 4 * 512 * 3 + 150


def test_smollm2_plan_by_hand() -> None:
    """SmolLM2-like f32 on 2 x 8 GB: per layer 3,540,096 params = 14,160,384 bytes; embedding 113,246,208."""
    model = llama()
    assert model.layer_bytes[0] == 14_160_384 and model.embedding_bytes == 113_246_208
    s = PlanSettings(context_length=2048, max_concurrent_sequences=2)
    plan = plan_cluster(model, facts_for(8 * GB, 8 * GB), s)
    assert isinstance(plan, Plan)
    first, last = plan.stages
    kv_layer = 2 * 3 * 64 * 4 * 2048 * 2
    assert first.weight_bytes == first.num_layers * 14_160_384 + 113_246_208
    assert last.weight_bytes == last.num_layers * 14_160_384 + 113_246_208 + 576 * 4
    assert first.kv_cache_bytes == first.num_layers * kv_layer
    assert first.overhead_bytes == 2 * 128 * 1024**2 and last.overhead_bytes == 128 * 1024**2
