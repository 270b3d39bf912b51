"""Serving a whole model on one node: the same memory check as a cluster's stage (no I/O).

One stage holds every layer and runs the coordinator; it needs the weights, the KV cache at the
chosen context length and concurrency, and both processes' overhead (memory.StageCosts), against
the node's free memory. A model that does not fit is refused with the numbers, as a cluster's
stage is (planner.memory_reasons), so "Serve on this node" never runs a node out of memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.models.describe import ModelDescription
from orchestrator.planner.facts import NodeFacts, free_words
from orchestrator.planner.memory import StageCosts
from orchestrator.planner.plan_settings import PlanSettings
from orchestrator.units import format_bytes


@dataclass(frozen=True)
class SingleFit:
    """What a whole model needs on one node, and whether it fits (`reason` says why not)."""

    weight_bytes: int
    kv_cache_bytes: int
    overhead_bytes: int
    free_bytes: int
    reason: str = ""

    @property
    def total_bytes(self) -> int:
        """Everything the node must hold."""
        return self.weight_bytes + self.kv_cache_bytes + self.overhead_bytes

    @property
    def fits(self) -> bool:
        """Whether the node has that much free."""
        return not self.reason


def single_node_fit(model: ModelDescription, node: NodeFacts, settings: PlanSettings,
                    model_name: str | None = None) -> SingleFit:
    """Whether `model` fits on `node` alone at the settings' context length and concurrency."""
    costs = StageCosts(model, settings)
    n = model.num_layers
    weights, kv, overhead = costs.weight_bytes(0, n), costs.kv_bytes(0, n), costs.overhead_bytes(runs_coordinator=True)
    total = weights + kv + overhead
    reason = ""
    if total > node.free_bytes:
        short = total - node.free_bytes
        reason = (f"model {model_name or model.name} needs {format_bytes(total)} on node {node.name} (weights "
                  f"{format_bytes(weights)}, KV cache {format_bytes(kv)} for {settings.max_concurrent_sequences} x "
                  f"{settings.context_length} tokens, process overhead {format_bytes(overhead)}), which has "
                  f"{format_bytes(node.free_bytes)}{free_words(node.memory_kind)}; {format_bytes(short)} missing: "
                  "lower the context length or the concurrent requests, or serve it as a cluster across nodes")
    return SingleFit(weight_bytes=weights, kv_cache_bytes=kv, overhead_bytes=overhead, free_bytes=node.free_bytes,
                     reason=reason)
