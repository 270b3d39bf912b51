"""The shard plan preview (pure): per stage its layers and a memory-fit bar, and the plan's
warnings or refusal reasons in words."""

from __future__ import annotations

from typing import Any

from orchestrator.control.state import State
from orchestrator.planner import Plan
from orchestrator.planner.transport import TransportPlan

from .context import ViewContext
from .format import size
from .perf import link_matrix, performance_view

PARTS = (("weights", "weight_bytes", "weights"), ("kv", "kv_cache_bytes", "KV cache"),
         ("overhead", "overhead_bytes", "overhead"))


def fit_bar(weights: int, kv: int, overhead: int, free: int) -> dict[str, Any]:
    """A memory-fit bar: weights, KV cache and overhead against the node's free memory.

    The bar spans the larger of what the stage needs and what the node has free, so a stage
    that does not fit shows how far it overshoots the free-memory mark. Percentages are of
    that span; `used_percent` is the need as a share of the free memory.
    """
    total = weights + kv + overhead
    span = max(total, free, 1)
    values = {"weights": weights, "kv": kv, "overhead": overhead}
    segments = [{"kind": kind, "label": label, "bytes": size(values[kind]),
                 "percent": round(100 * values[kind] / span, 2)} for kind, _, label in PARTS]
    fits = total <= free
    return {"segments": segments, "free_percent": round(100 * free / span, 2), "fits": fits,
            "total": size(total), "free": size(free), "used_percent": round(100 * total / free) if free else None,
            "headroom": size(free - total) if fits else None, "short": None if fits else size(total - free)}


def plan_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """The last previewed plan (shown to every viewer): a layer map, one fit bar per stage,
    warnings (a plan) or reasons (a refusal, with its closest attempt's stages when it has one)."""
    shown = state.plan
    if shown is None:
        return {"plan": None}
    result = shown.result
    layers_total = max((s.last_layer for s in result.stages), default=-1) + 1
    stages = []
    for s in result.stages:
        count = s.last_layer - s.first_layer + 1
        stages.append({
            "stage": s.stage, "node": s.node_name, "layers": f"{s.first_layer}–{s.last_layer}",
            "layer_count": count, "map_percent": round(100 * count / layers_total, 2) if layers_total else 0,
            "coordinator": s.runs_coordinator, "port": s.transport_port,
            "bar": fit_bar(s.weight_bytes, s.kv_cache_bytes, s.overhead_bytes, s.free_bytes),
        })
    plan = result if isinstance(result, Plan) else None
    issues = plan.warnings if plan is not None else result.reasons
    return {"plan": {"kind": result.kind, "refused": plan is None, "model": shown.model_id,
                     "context": shown.context_length, "stages": stages, "layers_total": layers_total,
                     "issues": [i.message for i in issues],
                     # measured links between the selected nodes and the prediction (views/perf.py)
                     "links": link_matrix(state, list(shown.node_ids)),
                     "performance": performance_view(plan.performance if plan is not None else None),
                     "transport": transport_view(plan.transport if plan is not None else None)}}


def transport_view(t: TransportPlan | None) -> dict[str, Any] | None:
    """The plan's transport (planner/transport.py): what runs, where each node binds, and why
    a requested backend does not run."""
    if t is None:
        return None
    return {"used": t.used, "requested": t.requested, "reason": t.reason,
            "nodes": [f"{n.node_name} {n.host}" + (f" on {n.interface}" if n.interface else "")
                      for n in t.nodes if n.host]}
