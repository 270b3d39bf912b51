"""The planner: which node runs which layers, and whether it fits (pure functions, no I/O).

`plan_cluster(model, nodes, settings)` takes a ModelDescription (from
`orchestrator.models.describe.describe_model`), the selected nodes' NodeFacts (from
`node_facts_from_report`) and PlanSettings, and answers a Plan (per-stage layers, memory-fit
numbers, ports, warnings) or a Refusal (reasons, each naming the node or the model).
`plan_to_cluster_toml` turns a Plan into the engine's cluster TOML.
"""

from orchestrator.planner.balance import balanced_split, fullest_split, min_max_split
from orchestrator.planner.checks import check_split
from orchestrator.planner.cluster_toml import plan_to_cluster_config, plan_to_cluster_toml, render_cluster_toml
from orchestrator.planner.facts import NodeFacts, engine_version, node_facts_from_report
from orchestrator.planner.memory import KV_STEP, StageCosts, kv_cache_bytes, kv_tokens
from orchestrator.planner.plan_settings import (
    DEFAULT_COORDINATOR_OVERHEAD_BYTES,
    DEFAULT_STAGE_OVERHEAD_BYTES,
    PlanSettings,
)
from orchestrator.planner.planner import plan_cluster
from orchestrator.planner.ports import PortAllocation, allocate_ports
from orchestrator.planner.result import CoordinatorPlan, Issue, Plan, Refusal, RefusalCode, StagePlan, WarningCode
from orchestrator.planner.single import SingleFit, single_node_fit

__all__ = [
    "DEFAULT_COORDINATOR_OVERHEAD_BYTES", "DEFAULT_STAGE_OVERHEAD_BYTES", "KV_STEP", "CoordinatorPlan", "Issue",
    "NodeFacts", "Plan", "PlanSettings", "PortAllocation", "Refusal", "RefusalCode", "SingleFit", "StageCosts",
    "StagePlan", "WarningCode", "allocate_ports", "balanced_split", "check_split", "engine_version", "fullest_split",
    "kv_cache_bytes", "kv_tokens", "min_max_split", "node_facts_from_report", "plan_cluster",
    "plan_to_cluster_config", "plan_to_cluster_toml", "render_cluster_toml", "single_node_fit",
]
