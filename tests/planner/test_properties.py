"""Properties over random models, nodes and settings: the shape of every plan, determinism,
and optimality of the split."""

from __future__ import annotations

import itertools
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.planner import Plan, PlanSettings, Refusal, RefusalCode, StageCosts, balanced_split, plan_cluster
from tests.support.builders import facts
from tests.support.planner_inputs import uniform


@st.composite
def inputs(draw: st.DrawFn, max_layers: int = 48, max_nodes: int = 8):
    layers = draw(st.integers(1, max_layers))
    model = uniform(1, vocab=draw(st.integers(1, 1000)), tied=draw(st.booleans()),
                    kv_heads=draw(st.integers(1, 8)), head_dim=draw(st.sampled_from([8, 64, 128]))).model_copy(
        update={"num_layers": layers,
                "layer_bytes": tuple(draw(st.lists(st.integers(1, 10**9), min_size=layers, max_size=layers))),
                "embedding_bytes": draw(st.integers(0, 10**9)), "head_bytes": draw(st.integers(0, 10**9)),
                "norm_bytes": draw(st.integers(0, 10**4))})
    count = draw(st.integers(2, max_nodes))
    plan_settings = PlanSettings(context_length=draw(st.integers(8, 32768)),
                                 max_concurrent_sequences=draw(st.integers(1, 16)))
    # Free memory around what an even share of the model needs: from far too little to plenty.
    share = StageCosts(model, plan_settings).cluster_bytes(count) / count
    scales = draw(st.lists(st.floats(0.3, 4.0), min_size=count, max_size=count))
    return model, [facts(i, int(share * f)) for i, f in enumerate(scales)], plan_settings


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs())
def test_every_plan_is_contiguous_covering_and_fits(case) -> None:
    model, selected, plan_settings = case
    result = plan_cluster(model, selected, plan_settings)
    assert result == plan_cluster(model, selected, plan_settings)  # deterministic
    if isinstance(result, Refusal):
        assert result.reasons
        if model.num_layers < len(selected):
            assert RefusalCode.TOO_MANY_NODES in result.codes
        return
    assert isinstance(result, Plan)
    assert [s.node_id for s in result.stages] == [n.id for n in selected]  # stage k on node k
    expected = 0
    for s in result.stages:
        assert s.first_layer == expected and s.last_layer >= s.first_layer  # contiguous, >= 1 layer
        expected = s.last_layer + 1
        assert s.fits and s.total_bytes == s.weight_bytes + s.kv_cache_bytes + s.overhead_bytes
    assert expected == model.num_layers  # covers every layer
    assert result.stages[0].holds_embedding and result.stages[-1].holds_head
    assert result.stages[-1].holds_embedding == model.tied_embeddings


@settings(max_examples=200, deadline=None)
@given(inputs(max_layers=9, max_nodes=4))
def test_balanced_split_is_optimal(case) -> None:
    """Against exhaustive search over every set of cut points: same feasibility, same objective."""
    model, selected, plan_settings = case
    if model.num_layers < len(selected):
        return
    costs = StageCosts(model, plan_settings)
    free = [n.free_bytes for n in selected]

    def cost(k: int, a: int, b: int) -> float:
        if costs.total_bytes(a, b, runs_coordinator=k == 0) > free[k]:
            return math.inf
        return costs.token_bytes(a, b) / max(1, free[k])

    best = math.inf
    for cuts in itertools.combinations(range(1, model.num_layers), len(selected) - 1):
        bounds = (0, *cuts, model.num_layers)
        best = min(best, max(cost(k, bounds[k], bounds[k + 1]) for k in range(len(selected))))
    split = balanced_split(costs, free)
    if best == math.inf:
        assert split is None
    else:
        assert split is not None
        assert max(cost(k, a, b + 1) for k, (a, b) in enumerate(split)) == best
