"""Models → Distributed → Serve as cluster: form, plan preview, preparation, launch and monitor (pure)."""

from __future__ import annotations

from typing import Any

from orchestrator.control.state import Session, State

from .context import ViewContext
from .format import percent, rate, size
from .sessions import stage_rows

PREPARE_LABELS = {"checking": "Checking", "present": "Present", "needs_download": "Needs download",
                  "mismatch": "Mismatch", "downloading": "Downloading", "failed": "Failed"}


def _support(node, ctx_family: str | None) -> str:
    """"Supported" or "Unsupported: <reason>" for one node."""
    if node.status != "reachable" or node.report is None:
        return f"Unsupported: unreachable ({node.error or 'no report yet'})"
    r = node.report
    if not r.versions.get("mlx"):
        return "Unsupported: mlx is not installed on this node"
    if ctx_family and r.accelerator.family != ctx_family:
        return f"Unsupported: {r.accelerator.family} differs from {ctx_family}"
    return "Supported"


def form_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """The model dropdown (MLX models, others explained) and one toggle per node."""
    models: dict[str, dict[str, Any]] = {}
    for n in state.nodes:
        for m in (n.report.models if n.report else []):
            entry = models.setdefault(m.id, {"id": m.id, "supported": m.mlx_format, "reason": m.reason or "",
                                             "size": size(m.total_bytes), "layers": m.num_layers, "holders": []})
            entry["holders"].append(n.name)
    families = [n.report.accelerator.family for n in state.nodes if n.report]
    common = max(set(families), key=families.count) if families else None
    nodes = [{"id": n.id, "name": n.name, "support": _support(n, common),
              "free_memory": size(n.report.memory.free_bytes) if n.report else "–"} for n in state.nodes]
    return {"enabled": state.settings.distributed_enabled, "models": sorted(models.values(), key=lambda m: m["id"]),
            "nodes": nodes}


def plan_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """The last previewed plan: per node layers and a memory-fit bar, warnings or refusals."""
    plan = state.plan
    if plan is None:
        return {"plan": None}
    stages = []
    for s in plan.get("stages", []):
        free = max(1, s.get("free_bytes") or 1)
        parts = [("weights", s.get("weight_bytes", 0)), ("kv", s.get("kv_cache_bytes", 0)),
                 ("overhead", s.get("overhead_bytes", 0))]
        stages.append({
            "stage": s["stage"], "node": s["node_name"], "layers": f"{s['first_layer']}–{s['last_layer']}",
            "bars": [{"kind": k, "bytes": size(v), "percent": min(100.0, 100 * v / free)} for k, v in parts],
            "total": size(s.get("total_bytes")), "free": size(s.get("free_bytes")),
            "fits": (s.get("total_bytes") or 0) <= (s.get("free_bytes") or 0),
            "fit_percent": round(100 * (s.get("fit_fraction") or 0)),
        })
    issues = plan.get("warnings", []) if plan.get("kind") == "plan" else plan.get("reasons", [])
    return {"plan": {"kind": plan.get("kind"), "model": plan.get("model_id"), "stages": stages,
                     "issues": [i.get("message", "") for i in issues],
                     "context": (plan.get("settings") or {}).get("context_length")}}


def prepare_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """Per-node Present / Needs download / Mismatch with progress."""
    prep = state.preparation
    if prep is None:
        return {"prep": None}
    names = {n.id: n.name for n in state.nodes}
    rows = [{"node": names.get(p.node_id, p.node_id), "status": p.status, "label": PREPARE_LABELS[p.status],
             "detail": p.detail, "percent": percent(p.done_bytes, p.total_bytes),
             "bytes": f"{size(p.done_bytes)} / {size(p.total_bytes)}", "rate": rate(p.rate_bps), "source": p.source}
            for p in prep.nodes]
    return {"prep": {"model": prep.model_id, "rows": rows, "finished": prep.finished, "ready": prep.ready,
                     "error": prep.error}}


def current_cluster(state: State) -> Session | None:
    """The live cluster session, else the most recently ended one."""
    live = [s for s in state.sessions if s.cluster]
    if live:
        return live[-1]
    ended = [s for s in state.history if s.cluster]
    return ended[-1] if ended else None


def monitor_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """Launch timeline, aggregate badge and one card per stage."""
    s = current_cluster(state)
    if s is None:
        return {"session": None}
    return {"session": {"id": s.id, "name": s.name, "model": s.model_name, "health": s.health, "phase": s.phase,
                        "reason": s.reason, "url": s.url, "fallback": s.transport_fallback,
                        "timeline": [{"label": t.label, "state": t.state, "detail": t.detail} for t in s.timeline],
                        "stages": stage_rows(s), "live": s.phase in ("launching", "running")}}
