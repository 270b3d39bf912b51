"""The shard plan preview (pure): per stage its layers and a memory-fit bar, and the plan's
warnings or refusal reasons in words."""

from __future__ import annotations

import time
from typing import Any

from orchestrator.agent.device_schemas import MEMORY_WORDS
from orchestrator.agent.timing_doubt import profile_doubt
from orchestrator.control.rules.measured import missing, timing_node
from orchestrator.control.rules.state import State
from orchestrator.planner import Plan
from orchestrator.planner.facts import free_words
from orchestrator.planner.transport import TransportPlan
from webapp.views.context import ViewContext
from webapp.views.format import size
from webapp.views.perf import link_matrix, performance_view
from webapp.views.selection import plan_label

PARTS = (("weights", "weight_bytes", "weights"), ("kv", "kv_cache_bytes", "KV cache"),
         ("overhead", "overhead_bytes", "overhead"), ("cache", "prompt_cache_bytes", "prompt cache"))


def fit_bar(weights: int, kv: int, overhead: int, free: int, cache: int = 0, kind: str = "host") -> dict[str, Any]:
    """A memory-fit bar: weights, KV cache and overhead against the node's free memory, and the
    prompt-cache budget (sized from the headroom, so it never decides the fit) when there is one.

    The bar spans the larger of what the stage needs and what the node has free, so a stage
    that does not fit shows how far it overshoots the free-memory mark. Percentages are of
    that span; `used_percent` is the need as a share of the free memory. `kind` is which memory
    the node reported (agent/device_schemas.py): the bar says "GPU memory free" on a GPU node.
    """
    total = weights + kv + overhead
    span = max(total + cache, free, 1)
    values = {"weights": weights, "kv": kv, "overhead": overhead, "cache": cache}
    segments = [{"kind": kind, "label": label, "bytes": size(values[kind]),
                 "percent": round(100 * values[kind] / span, 2)} for kind, _, label in PARTS
                if kind != "cache" or cache]
    fits = total <= free
    return {"segments": segments, "free_percent": round(100 * free / span, 2), "fits": fits,
            "total": size(total), "free": size(free), "used_percent": round(100 * total / free) if free else None,
            "headroom": size(free - total) if fits else None, "short": None if fits else size(total - free),
            "memory_words": MEMORY_WORDS.get(kind, kind), "free_what": free_words(kind).replace(" of ", " ").strip()}


def plan_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """The last previewed plan (shown to every viewer): a layer map, one fit bar per stage,
    warnings (a plan) or reasons (a refusal, with its closest attempt's stages when it has one)."""
    shown = state.plan
    if shown is None:
        return {"plan": None}
    result = shown.result
    layers_total = max((s.last_layer for s in result.stages), default=-1) + 1
    # the draft model a plan counts on its coordinator's node (a refusal has no settings of its own)
    draft = result.settings.draft_model if isinstance(result, Plan) else None
    draft_text = f"{draft} ({size(result.settings.draft_model_bytes)} with its KV cache, in the overhead)" \
        if draft else ""
    stages = []
    for s in result.stages:
        count = s.last_layer - s.first_layer + 1
        stages.append({
            "stage": s.stage, "node": s.node_name, "layers": f"{s.first_layer}–{s.last_layer}",
            "layer_count": count, "map_percent": round(100 * count / layers_total, 2) if layers_total else 0,
            "coordinator": s.runs_coordinator, "port": s.transport_port,
            "draft": draft_text if s.runs_coordinator else "",
            "bar": fit_bar(s.weight_bytes, s.kv_cache_bytes, s.overhead_bytes, s.free_bytes, s.prompt_cache_bytes,
                           s.memory_kind),
        })
    plan = result if isinstance(result, Plan) else None
    issues = plan.warnings if plan is not None else result.reasons
    return {"plan": {"kind": result.kind, "refused": plan is None, "model": shown.model_id,
                     # which selection it is of: the page marks it stale beside another choice (static/app.js)
                     "node_ids": ",".join(shown.node_ids), "label": plan_label(state, shown),
                     "context": shown.context_length, "stages": stages, "layers_total": layers_total,
                     "issues": [i.message for i in issues],
                     # measured links between the selected nodes and the prediction (views/perf.py)
                     "links": link_matrix(state, list(shown.node_ids)),
                     "performance": performance_view(plan.performance if plan is not None else None),
                     "transport": transport_view(plan.transport if plan is not None else None),
                     "measuring": measuring_text(state, shown.model_id, list(shown.node_ids)),
                     # the layer timing under way for this model: the page counts its elapsed time
                     "timing_since": state.timing.started_at if state.timing is not None
                     and state.timing.model_id == shown.model_id else None,
                     "busy": busy_timing(state, shown.model_id, list(shown.node_ids))}}


def busy_timing(state: State, model_id: str, node_ids: list[str]) -> str:
    """Which selected node's timing of the model's layers the busy-machine rule doubts ("" when
    none): agent/timing_doubt.py, the rule the agent already timed again by (agent/compute.py).
    The plan card then says the prediction was measured on a busy machine instead of stating it."""
    said = []
    for nid in node_ids:
        node = state.node(nid)
        p = next((c for c in node.report.compute if c.model_id == model_id), None) if node and node.report else None
        doubt = (p.doubt or profile_doubt(p)) if p is not None else ""
        if doubt:
            tries = f", still after {p.tries} timings" if p is not None and p.tries > 1 else ""
            said.append(f"{node.name}'s timing of the layers ({doubt}{tries})")  # type: ignore[union-attr]
    if not said:
        return ""
    return (f"measured on a busy machine: {' and '.join(said)}. The figures below are not to be trusted; "
            "time them again on a quieter machine (Prepare or Preview after the load has gone)")


def measuring_text(state: State, model_id: str, node_ids: list[str]) -> str:
    """What the prediction still waits for, by name: which links are measured, and which node times
    the model's layers (control/perf.py measures after a preview, then previews again)."""
    nodes = [n for nid in node_ids if (n := state.node(nid)) is not None and n.report is not None]
    if len(nodes) != len(node_ids):
        return "Predicted performance: waiting for every selected node to report."
    links, timing = missing(nodes, model_id)
    parts = []
    if links:
        parts.append(f"measuring the links between {', '.join(n.name for n in nodes)}")
    if timing:
        holder, why = timing_node(state, nodes, model_id)
        run = state.timing if state.timing is not None and state.timing.model_id == model_id else None
        where = state.node(run.node_id) if run is not None else holder
        if run is not None and where is not None:
            since = time.strftime("%H:%M:%S", time.localtime(run.started_at))
            parts.append(f"timing {model_id}'s layers on {where.name} since {since} (a minute or more on a busy "
                         "machine)")
        else:
            parts.append(f"timing {model_id}'s layers on {holder.name} (a minute or more on a busy machine)"
                         if holder else why)
    return "Predicted performance: " + ("; ".join(parts) if parts else "computing from the measurements") + "…"


def transport_view(t: TransportPlan | None) -> dict[str, Any] | None:
    """The plan's transport (planner/transport.py): what runs, where each node binds, and why
    a requested backend does not run."""
    if t is None:
        return None
    return {"used": t.used, "requested": t.requested, "reason": t.reason,
            "nodes": [f"{n.node_name} {n.host}" + (f" on {n.interface}" if n.interface else "")
                      for n in t.nodes if n.host]}
