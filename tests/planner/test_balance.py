"""Balancing: by bytes with the embedding and head counted, weighted by free memory."""

from __future__ import annotations

import itertools
import math

import pytest

from orchestrator.planner import (
    Plan,
    PlanSettings,
    StageCosts,
    balanced_split,
    fullest_split,
    min_max_split,
    plan_cluster,
)
from tests.support.builders import GB, facts_for
from tests.support.planner_inputs import llama, uniform

SETTINGS = PlanSettings(context_length=2048, max_concurrent_sequences=2)


@pytest.mark.parametrize("tied,dtype", [(True, "float32"), (False, "float32"), (True, "bfloat16")])
def test_equal_nodes_give_the_last_stage_fewer_layers(tied: bool, dtype: str) -> None:
    """SmolLM2-like: the head (vocab x hidden, ~8 layers' worth) is read in full every token,
    the embedding only one row, so the last stage takes fewer layers (an even split made
    SmolLM2's last stage 1.6x slower)."""
    plan = plan_cluster(llama(tied=tied, dtype=dtype), facts_for(8 * GB, 8 * GB), SETTINGS)
    assert isinstance(plan, Plan)
    assert plan.split == ((0, 18), (19, 29))
    first, last = plan.stages
    assert last.num_layers < first.num_layers
    assert abs(first.token_bytes - last.token_bytes) <= llama(dtype=dtype).layer_bytes[0]  # within one layer


def test_an_even_split_would_be_worse() -> None:
    costs = StageCosts(llama(), SETTINGS)
    even = max(costs.token_bytes(0, 15), costs.token_bytes(15, 30))
    chosen = max(costs.token_bytes(0, 19), costs.token_bytes(19, 30))
    assert chosen < even / 1.15


@pytest.mark.parametrize("free,expected", [
    ((16 * GB, 8 * GB), ((0, 24), (25, 29))),
    ((8 * GB, 16 * GB), ((0, 11), (12, 29))),
])
def test_unequal_memory_shifts_layers(free: tuple[int, int], expected) -> None:
    """A node with twice the free memory gets about twice the bytes."""
    plan = plan_cluster(llama(), facts_for(*free), SETTINGS)
    assert isinstance(plan, Plan) and plan.split == expected
    big, small = sorted(plan.stages, key=lambda s: -s.free_bytes)
    assert 1.6 < big.token_bytes / small.token_bytes < 2.4


def test_more_memory_never_means_fewer_layers() -> None:
    layers = []
    for ratio in (0.25, 0.5, 1, 2, 4, 8):
        plan = plan_cluster(llama(), facts_for(int(ratio * 8 * GB), 8 * GB), SETTINGS)
        assert isinstance(plan, Plan)
        layers.append(plan.stages[0].num_layers)
    assert layers == sorted(layers) and layers[0] < layers[-1]


def test_three_nodes() -> None:
    plan = plan_cluster(llama(), facts_for(8 * GB, 8 * GB, 8 * GB), SETTINGS)
    assert isinstance(plan, Plan) and plan.split == ((0, 11), (12, 24), (25, 29))


def test_headroom_before_balance() -> None:
    """When the balanced split would fill node 0 past the tight-fit fraction, layers move to
    node 1 as long as that keeps every node under it."""
    costs = StageCosts(llama(), SETTINGS)
    free = math.ceil(costs.total_bytes(0, 16, runs_coordinator=True) / SETTINGS.tight_fit_fraction) + 1
    plan = plan_cluster(llama(), facts_for(free, free), SETTINGS)
    assert isinstance(plan, Plan) and plan.split == ((0, 15), (16, 29))
    assert all(s.fit_fraction <= SETTINGS.tight_fit_fraction for s in plan.stages)


def test_fullest_split_minimizes_the_fullest_node() -> None:
    costs = StageCosts(uniform(4, 1000), PlanSettings(context_length=8, stage_overhead_bytes=0,
                                                      coordinator_overhead_bytes=0, max_concurrent_sequences=1))
    # KV: 2 x 1 x 1 x 4 bytes x 256 tokens = 2048 per layer, so a layer needs 3048 in all.
    assert fullest_split(costs, [3048, 3 * 3048]) == ((0, 0), (1, 3))
    assert balanced_split(costs, [3047, 3 * 3048]) is None


def test_min_max_split_edges() -> None:
    assert min_max_split(3, 4, lambda k, a, b: 1.0) is None  # more stages than layers
    assert min_max_split(3, 2, lambda k, a, b: math.inf) is None
    assert min_max_split(1, 1, lambda k, a, b: 1.0) == ((0, 0),)
    assert min_max_split(5, 5, lambda k, a, b: float(b - a)) == tuple((i, i) for i in range(5))


def brute_force(num_layers: int, num_stages: int, cost) -> float:
    best = math.inf
    for cuts in itertools.combinations(range(1, num_layers), num_stages - 1):
        bounds = (0, *cuts, num_layers)
        best = min(best, max(cost(k, bounds[k], bounds[k + 1]) for k in range(num_stages)))
    return best


def test_dynamic_programme_matches_brute_force_on_many_shapes() -> None:
    """The early exit keeps the optimum exact (property test in test_properties too)."""
    for layers in range(2, 9):
        model = uniform(layers, 0, embedding=500, head=700, vocab=10,
                        name="x").model_copy(update={"layer_bytes": tuple(100 + 37 * (i % 4) for i in range(layers))})
        costs = StageCosts(model, PlanSettings(context_length=8, max_concurrent_sequences=1))
        for stages in range(2, min(layers, 4) + 1):
            for free in itertools.product((1 * GB, 2 * GB, 3 * GB), repeat=stages):
                def cost(k: int, a: int, b: int, costs: StageCosts = costs, free: tuple[int, ...] = free) -> float:
                    return costs.token_bytes(a, b) / free[k]
                split = min_max_split(layers, stages, cost)
                assert split is not None
                got = max(cost(k, a, b + 1) for k, (a, b) in enumerate(split))
                assert got == pytest.approx(brute_force(layers, stages, cost))


def test_large_models_cost_one_dynamic_programme_not_a_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """400 layers on 8 nodes, both objectives: the planner looks at stage costs no more often than
    one dynamic programme over (stage, start, end) could, stages x layers² / 2 times (its early
    exits make it far fewer); a search over the C(399, 7) ~ 10^14 splits would need more. Counted
    evaluations, not seconds: a loaded machine changes nothing."""
    model = llama(layers=400, hidden=4096, intermediate=11008, heads=32, kv_heads=8, vocab=128_000, dtype="bfloat16")
    looked = [0]
    total_bytes = StageCosts.total_bytes

    def counted(self: StageCosts, *args: object, **kwargs: object) -> int:
        looked[0] += 1
        return total_bytes(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(StageCosts, "total_bytes", counted)
    bound = 8 * 400 * 400 // 2
    plan = plan_cluster(model, facts_for(*[(40 + 5 * i) * GB for i in range(8)]), SETTINGS)
    assert isinstance(plan, Plan) and len(plan.stages) == 8
    assert 0 < looked[0] <= bound, looked
    looked[0] = 0
    assert fullest_split(StageCosts(model, SETTINGS), [GB] * 8) is not None
    assert 0 < looked[0] <= bound, looked
