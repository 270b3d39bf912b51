"""A plan becomes a cluster TOML that the engine's own loader accepts."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from orchestrator.engine.config import ClusterConfig, load_config
from orchestrator.planner import Plan, PlanSettings, plan_cluster, plan_to_cluster_config, plan_to_cluster_toml
from tests.support.builders import facts
from tests.support.planner_inputs import llama


def make_plan(count: int = 2, host: str | None = "127.0.0.1", **settings: object) -> Plan:
    plan = plan_cluster(llama(), [facts(i, host=host) for i in range(count)], PlanSettings(**settings))
    assert isinstance(plan, Plan)
    return plan


def test_plan_to_cluster_config_is_a_valid_pipeline() -> None:
    plan = make_plan(3, context_length=2048, max_concurrent_sequences=3, transport_backend="rdma")
    config = plan_to_cluster_config(plan, "smollm2-3stage", secret_file="secret")
    assert isinstance(config, ClusterConfig)
    assert config.cluster.pipeline_parallel_size == 3 and config.cluster.transport_backend == "rdma"
    assert (config.cluster.context_length, config.cluster.max_requests) == (2048, 3)
    assert config.cluster.secret_file == "secret"
    assert [s.id for s in config.stages] == ["stage-0", "stage-1", "stage-2"]
    assert [s.layers for s in config.stages] == [s.layers for s in plan.stages]
    assert [s.host_port[1] for s in config.stages] == [s.transport_port for s in plan.stages]
    coordinator = config.node("coordinator")
    assert coordinator.role == "hybrid" and coordinator.host_port == ("127.0.0.1", plan.coordinator.transport_port)
    assert config.num_layers == 30


def test_toml_text_round_trips(tmp_path: Path) -> None:
    plan = make_plan()
    text = plan_to_cluster_toml(plan, 'name with "quotes" and \\ backslash')
    config = ClusterConfig.model_validate(tomllib.loads(text))
    assert config == plan_to_cluster_config(plan, 'name with "quotes" and \\ backslash')
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    assert load_config(path) == config


def test_hosts_override_and_ipv6() -> None:
    plan = make_plan(host=None)
    config = plan_to_cluster_config(plan, "c", hosts={"n0": "fd00::1", "n1": "10.0.0.2"})
    assert config.node("stage-0").address == f"[fd00::1]:{plan.stages[0].transport_port}"
    assert config.node("stage-1").address == f"10.0.0.2:{plan.stages[1].transport_port}"
    assert tomllib.loads(plan_to_cluster_toml(plan, "c", hosts={"n0": "fd00::1", "n1": "10.0.0.2"}))


def test_every_node_needs_an_address() -> None:
    with pytest.raises(ValueError, match="no address for node 'n1'"):
        plan_to_cluster_config(make_plan(host=None), "c", hosts={"n0": "10.0.0.1"})


def test_invalid_cluster_options_are_rejected() -> None:
    with pytest.raises(ValueError):
        plan_to_cluster_config(make_plan(), "c", no_such_key=1)


def test_the_prompt_cache_budget_is_sized_from_each_stage_headroom() -> None:
    """Half of what weights, working KV and overhead leave free (capped), the tightest stage's in the TOML."""
    from orchestrator.planner.memory import PROMPT_CACHE_MAX, prompt_cache_budget

    plan = make_plan(2)
    for s in plan.stages:
        assert s.prompt_cache_bytes == min((s.free_bytes - s.total_bytes) // 2, PROMPT_CACHE_MAX) > 0
    config = plan_to_cluster_config(plan, "cache")
    assert config.cluster.prompt_cache_budget == min(s.prompt_cache_bytes for s in plan.stages)
    assert plan_to_cluster_config(plan, "off", prompt_cache_bytes=0).cluster.prompt_cache_budget == 0
    assert prompt_cache_budget(100, 120) == 0 and prompt_cache_budget(1 << 40, 0) == PROMPT_CACHE_MAX


def test_speculation_goes_into_the_cluster_table() -> None:
    assert "speculative_tokens = 0" in plan_to_cluster_toml(make_plan(), "c")  # off, the default
    config = plan_to_cluster_config(make_plan(speculative_tokens=4), "c")
    assert config.cluster.speculative_tokens == 4
    assert "speculative_tokens = 4" in plan_to_cluster_toml(make_plan(speculative_tokens=4), "c")
    with pytest.raises(ValueError):
        PlanSettings(speculative_tokens=17)  # the engine's own bound


def test_each_stage_gets_its_share_of_memory_as_the_plan_counted_it() -> None:
    """Weights, KV cache, the prompt-cache budget and the stage's own overhead (the coordinator's is its own
    process's): what the stage sets as mlx's limit (engine/stage/memory_share.py)."""
    plan = make_plan(2, context_length=2048, max_concurrent_sequences=2)
    config = plan_to_cluster_config(plan, "shares")
    cache = config.cluster.prompt_cache_bytes
    assert [s.memory_bytes for s in config.stages] == [
        s.weight_bytes + s.kv_cache_bytes + cache + plan.settings.stage_overhead_bytes for s in plan.stages]
    assert config.node("coordinator").memory_bytes is None
