"""Choosing a draft model in the launch form (pure: decide over the control-plane states): the plan
counts its weights and KV cache on the coordinator's node, the cluster TOML names it, and a draft
model that cannot draft for the served one, or is not where the coordinator runs, is refused in
words before anything starts."""

from __future__ import annotations

import tomllib

import pytest

from orchestrator.control.rules.commands import CommandRefused, LaunchCluster, PreviewPlan
from orchestrator.control.rules.decide import decide
from orchestrator.control.rules.state import Settings
from orchestrator.models.kv import LayerCache
from orchestrator.planner import Plan, PlanSettings, kv_cache_bytes
from tests.support.control_states import BASE, DRAFT, MODEL, PREPARED, SMALL, draft_info, with_models
from tests.support.planner_inputs import llama


def _plan(state, draft=None) -> Plan:
    result = decide(state, PreviewPlan(MODEL, ("n0", "n1"), measure=False, draft_model=draft)).events[0].plan.result
    assert isinstance(result, Plan), result
    return result


def test_the_coordinators_node_counts_the_draft_models_weights_and_kv_cache():
    state = with_models(BASE, draft_info())
    plain, drafted = _plan(state), _plan(state, DRAFT)
    expected = SMALL.total_bytes + kv_cache_bytes(SMALL, PlanSettings(context_length=4096, max_concurrent_sequences=4))
    assert drafted.settings.draft_model == DRAFT and drafted.settings.draft_model_bytes == expected
    for a, b in zip(plain.stages, drafted.stages):
        assert b.overhead_bytes - a.overhead_bytes == (expected if a.runs_coordinator else 0)


def test_the_launched_clusters_toml_names_the_draft_model():
    state = with_models(PREPARED, draft_info())
    decision = decide(state, LaunchCluster(MODEL, ("n0", "n1"), "s9", 1.0, draft_model=DRAFT))
    created = next(e for e in decision.events if e.kind == "session_created")
    cluster = tomllib.loads(created.session.config_toml)["cluster"]
    assert cluster["draft_model"] == DRAFT and cluster["speculative_tokens"] == 4
    without = decide(state, LaunchCluster(MODEL, ("n0", "n1"), "s8", 1.0))
    created = next(e for e in without.events if e.kind == "session_created")
    assert "draft_model" not in tomllib.loads(created.session.config_toml)["cluster"]


@pytest.mark.parametrize("state,draft,message", [
    (with_models(BASE, draft_info(llama(layers=4, vocab=32000, name=DRAFT))), DRAFT, "another tokenizer"),
    (with_models(BASE, draft_info(SMALL.model_copy(update={"layer_caches": (
        LayerCache(kind="sliding", token_bytes=64, window=8),) * 4}))), DRAFT, "sliding window or a recurrent state"),
    (with_models(BASE, draft_info()), MODEL, "not the model itself"),
    (with_models(BASE, draft_info()), "nowhere", "no registered node has a model 'nowhere'"),
    # the planner puts the coordinator beside stage 0 (node-a); the draft model is only on node-b
    (with_models(BASE, draft_info(), on=(1,)), DRAFT, "not on node-a, where the coordinator runs"),
])
def test_a_draft_model_that_cannot_draft_there_is_refused(state, draft, message):
    with pytest.raises(CommandRefused, match=message):
        decide(state, PreviewPlan(MODEL, ("n0", "n1"), measure=False, draft_model=draft))


def test_the_team_settings_need_drafts_per_pass_for_a_draft_model():
    state = with_models(BASE, draft_info(), drafts=0)
    assert state.settings == Settings(distributed_enabled=True)
    with pytest.raises(CommandRefused, match="speculative decoding is off"):
        decide(state, PreviewPlan(MODEL, ("n0", "n1"), measure=False, draft_model=DRAFT))
