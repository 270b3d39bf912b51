"""The planner: which node runs which layers, and whether it fits (pure functions, no I/O).

`plan_cluster(model, nodes, settings)` takes a ModelDescription (from
`orchestrator.models.describe.describe_model`), the selected nodes' NodeFacts (from
`node_facts_from_report`) and PlanSettings, and answers a Plan (per-stage layers, memory-fit
numbers, ports, warnings) or a Refusal (reasons, each naming the node or the model).
`plan_to_cluster_toml` turns a Plan into the engine's cluster TOML.
"""

from .balance import balanced_split, fullest_split, min_max_split
from .checks import check_split
from .cluster_toml import plan_to_cluster_config, plan_to_cluster_toml, render_cluster_toml
from .facts import NodeFacts, engine_version, node_facts_from_report
from .memory import KV_STEP, StageCosts, kv_cache_bytes, kv_tokens
from .planner import plan_cluster
from .ports import PortAllocation, allocate_ports
from .result import CoordinatorPlan, Issue, Plan, Refusal, RefusalCode, StagePlan, WarningCode
from .settings import DEFAULT_COORDINATOR_OVERHEAD_BYTES, DEFAULT_STAGE_OVERHEAD_BYTES, PlanSettings

__all__ = [
    "DEFAULT_COORDINATOR_OVERHEAD_BYTES", "DEFAULT_STAGE_OVERHEAD_BYTES", "KV_STEP", "CoordinatorPlan", "Issue",
    "NodeFacts", "Plan", "PlanSettings", "PortAllocation", "Refusal", "RefusalCode", "StageCosts", "StagePlan",
    "WarningCode", "allocate_ports", "balanced_split", "check_split", "engine_version", "fullest_split",
    "kv_cache_bytes", "kv_tokens", "min_max_split", "node_facts_from_report", "plan_cluster",
    "plan_to_cluster_config", "plan_to_cluster_toml", "render_cluster_toml",
]
