"""Models → Distributed → Serve as cluster: form, plan preview, preparation, launch and monitor (pure)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from orchestrator.agent.device_schemas import MEMORY_WORDS
from orchestrator.agent.schemas import Report
from orchestrator.control.rules.commands import CommandRefused
from orchestrator.control.rules.state import NodePreparation, Session, State
from orchestrator.planner.facts import node_facts_from_report
from webapp.views.charts import throughput_chart
from webapp.views.context import ViewContext
from webapp.views.format import percent, rate, size, unsupported_text
from webapp.views.selection import Selection, hub_conflict, launch_blocker, preparation_label
from webapp.views.sessions import shown_health, stage_rows

# The seed's three classes (Present / Needs download / Mismatch); how a Present copy was verified
# is its detail line ("verified: every file's sha256 matches node-a's copy")
PREPARE_LABELS = {"checking": "Checking", "present": "Present", "needs_download": "Needs download",
                  "mismatch": "Mismatch", "downloading": "Downloading", "failed": "Failed"}


def _support(node, common: tuple[str, str, str] | None) -> str:
    """"Supported" or "Unsupported: <reason>" for one node: unreachable, no mlx, or a runtime other than
    most nodes' (the homogeneous-cluster rule the planner refuses by: one accelerator family, one mlx
    backend and wheel, one engine version)."""
    if node.status != "reachable" or node.report is None:
        return f"Unsupported: unreachable ({node.error or 'no report yet'})"
    r = node.report
    if not r.versions.get("mlx"):
        return "Unsupported: mlx is not installed on this node"
    if r.runtime is not None and r.runtime.backend is None:
        return f"Unsupported: mlx does not load on this node ({r.runtime.error or 'no backend'})"
    if common is None:
        return "Supported"
    family, backend, version = _runtime(r)
    if family != common[0]:
        return f"Unsupported: {family} differs from {common[0]}"
    if backend and common[1] and backend != common[1]:
        return f"Unsupported: mlx backend {backend} differs from {common[1]}"
    if version != common[2]:
        return f"Unsupported: {version} differs from {common[2]}"
    return "Supported"


def _runtime(r: Report) -> tuple[str, str, str]:
    """A node's accelerator family, mlx backend and engine version, as the planner compares them."""
    facts = node_facts_from_report(r)
    return facts.accelerator, facts.backend, facts.engine_version


def _common_runtime(reports: list[Report]) -> tuple[str, str, str] | None:
    """The most common family, backend (of the nodes that report one) and engine version: what the badge
    holds each node to (a tie: the first node's, as the planner's rule)."""
    if not reports:
        return None
    keys = [_runtime(r) for r in reports]

    def most(values: list[str]) -> str:
        return max(values, key=values.count) if values else ""

    return most([k[0] for k in keys]), most([k[1] for k in keys if k[1]]), most([k[2] for k in keys])


def form_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """The model dropdown (MLX models, others explained) and one toggle per node."""
    models: dict[str, dict[str, Any]] = {}
    for n in state.nodes:
        for m in (n.report.models if n.report else []):
            entry = models.setdefault(m.id, {"id": m.id, "supported": m.supported, "reason": unsupported_text(m),
                                             "size": size(m.total_bytes), "layers": m.num_layers, "holders": []})
            entry["holders"].append(n.name)
    common = _common_runtime([n.report for n in state.nodes if n.report and n.status == "reachable"])
    nodes = [{"id": n.id, "name": n.name, "support": _support(n, common),
              "free_memory": size(n.report.memory.free_bytes) if n.report else "–",
              # which memory that is: "memory" (the OS's), "GPU memory" (CUDA), "GPU working-set memory" (Metal)
              "memory_words": MEMORY_WORDS.get(n.report.memory.kind, "memory") if n.report else "memory"}
             for n in state.nodes]
    chosen_model, chosen_nodes, context = _current_choice(state)
    offered = sorted(models.values(), key=lambda m: m["id"])
    return {"enabled": state.settings.distributed_enabled, "models": offered,
            "nodes": nodes, "unsupported": [m for m in models.values() if not m["supported"]],
            "selected_model": chosen_model, "selected_nodes": chosen_nodes, "context": context,
            # speculative decoding with a draft model needs the team's drafts per pass (Settings) first
            "drafts": state.settings.speculative_tokens,
            "draft_models": [m for m in offered if m["supported"]],
            # the template asks about the choice it shows (the plan's, or the user's own input)
            "choose": lambda form: choice_view(state, form, offered)}


def hub_model_of(repo: str) -> tuple[str, str]:
    """The model id a Hub repo field gives on the nodes, and what is wrong with the field ("" if
    nothing; no model id then)."""
    from orchestrator.control.models import default_model_id, parse_hub_ref

    if not repo.strip():
        return "", ""
    try:
        return default_model_id(parse_hub_ref(repo).repo_id), ""
    except CommandRefused as exc:
        return "", f"Hub repo: {exc}"


def selection_from(state: State, form: Any) -> Selection:
    """The selection the form shows: the user's input (`form`, the request's values), else the
    plan's (or preparation's) choice. A Hub repo just typed (the form's `changed` field names
    the control the user changed last) chooses the model it downloads."""
    if form is None:
        model, node_ids, context = _current_choice(state)
        return Selection(model, tuple(node_ids), context)
    repo = (form.get("hub_repo") or "").strip()
    hub_model, _ = hub_model_of(repo)
    model = (form.get("model") or "").strip() or None
    if hub_model and (form.get("changed") == "hub_repo" or model is None):
        model = hub_model
    raw = (form.get("context_length") or "").strip()
    context = int(raw) if raw.isdigit() else 4096
    return Selection(model, tuple(n for n in form.getlist("nodes") if n), context, repo, hub_model)


def choice_view(state: State, form: Any, offered: list[dict[str, Any]]) -> dict[str, Any]:
    """What the form shows for one selection: the choice, the hub model offered when no node has
    it yet, the hub repo's disagreement, and why Launch waits (webapp/views/selection.py)."""
    chosen = selection_from(state, form)
    _, hub_error = hub_model_of(chosen.hub_repo)
    known = {m["id"] for m in offered}
    return {"model": chosen.model_id, "nodes": list(chosen.node_ids), "context": chosen.context_length,
            "hub_repo": chosen.hub_repo,
            # the hub's model, offered (and chosen) before any node has it: Prepare downloads it
            "hub_option": chosen.hub_model_id if chosen.hub_model_id and chosen.hub_model_id not in known else "",
            "hub_note": hub_error or hub_conflict(chosen) or "",
            "blocked": launch_blocker(state, chosen)}


def options_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """A digest of what the Serve-as-cluster form offers and shows (models, node toggles, the
    plan's choice, launch readiness, who serves what): when it changes, the form is fetched
    again with the user's own input (components.py, cluster_options.html)."""
    facts = {k: v for k, v in form_view(state, ctx).items() if not callable(v)}
    facts["serving"] = [(s.model_id, s.node_ids) for s in state.sessions]
    # why Launch waits depends on the preparation and on a refused plan too
    prep, plan = state.preparation, state.plan
    facts["prep"] = prep and (prep.model_id, [n.node_id for n in prep.nodes], prep.finished, prep.ready)
    facts["plan"] = plan and (plan.model_id, plan.node_ids, plan.context_length, plan.result.kind)
    blob = json.dumps(facts, sort_keys=True, default=str).encode()
    return {"digest": hashlib.sha256(blob).hexdigest()[:16]}


def _current_choice(state: State) -> tuple[str | None, list[str], int]:
    """What the form shows as chosen: the model, nodes and context of the latest plan, else of
    the preparation (so every viewer sees what the plan, bars and timeline are about)."""
    plan, prep = state.plan, state.preparation
    if plan is not None:
        return plan.model_id, list(plan.node_ids), plan.context_length
    if prep is not None:
        return prep.model_id, [n.node_id for n in prep.nodes], 4096
    return None, [], 4096


def prepare_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """Per-node Present / Needs download / Mismatch with progress, and which selection it is of
    (the page marks it stale beside another choice: static/app.js)."""
    prep = state.preparation
    if prep is None:
        return {"prep": None}
    names = {n.id: n.name for n in state.nodes}
    rows = [{"node": names.get(p.node_id, p.node_id), "status": p.status, "label": PREPARE_LABELS[p.status],
             # while copying, why it copies (Needs download / Mismatch) stays in view
             "verdict": p.verdict if p.status == "downloading" and p.verdict not in (None, "downloading") else None,
             "verdict_label": PREPARE_LABELS.get(p.verdict or "", ""),
             "detail": p.detail, **_progress(p), "rate": rate(p.rate_bps), "source": p.source,
             "copied": p.status == "present" and p.verdict in ("needs_download", "mismatch"),
             # which source each node used: the hub (once) or the LAN copy from which peers
             "source_text": (f"downloaded from the {p.source}, then verified" if p.source.startswith("hub ")
                             else f"copied over the LAN from {p.source}, then verified" if p.source
                             else "copied over the LAN, then verified")}
            for p in prep.nodes]
    return {"prep": {"model": prep.model_id, "rows": rows, "finished": prep.finished, "ready": prep.ready,
                     "error": prep.error, "present": sum(p.status == "present" for p in prep.nodes),
                     "total": len(prep.nodes), "node_ids": ",".join(n.node_id for n in prep.nodes),
                     "label": preparation_label(state, prep)}}


def _progress(p: NodePreparation) -> dict[str, Any]:
    """The bar's share and its words: no size known yet (still checking) is 0 % and says so,
    not "100 % · 0 B / 0 B"."""
    if p.status == "checking":  # hashing: no byte count to show, the detail says what is checked
        return {"percent": 0, "bytes": ""}
    if p.total_bytes <= 0:
        done = p.status == "present"
        return {"percent": 100 if done else 0, "bytes": "" if done else "size not known yet"}
    return {"percent": percent(p.done_bytes, p.total_bytes), "bytes": f"{size(p.done_bytes)} / {size(p.total_bytes)}"}


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
    return {"session": {"id": s.id, "name": s.name, "model": s.model_name, "health": shown_health(s), "phase": s.phase,
                        "reason": s.reason, "url": s.url, "fallback": s.transport_fallback,
                        "timeline": [{"label": t.label, "state": t.state, "detail": t.detail} for t in s.timeline],
                        "launch": launch_summary(s),
                        "stages": stage_rows(s), "live": s.phase in ("launching", "running", "recovering"),
                        "throughput": throughput_chart(s),
                        # charts and stage cards once something ran; a launch that failed shows its timeline
                        "observed": bool(s.samples) or any(st.alive is not None for st in s.stage_status)
                        or s.phase in ("running", "recovering", "stopping")}}


def launch_summary(s: Session) -> dict[str, Any]:
    """How far the launch got: steps done of all, the running step, and after a failure the
    failed step and what was rolled back (pure)."""
    steps = tuple(t for t in s.timeline if not t.key.startswith("recovery-"))  # the launch's own
    failed = next((t for t in steps if t.state == "failed"), None)
    running = next((t for t in steps if t.state == "running"), None)
    return {"done": sum(t.state == "done" for t in steps), "total": len(steps),
            "running": running.label if running else None,
            "failed": failed.label if failed else None, "failed_detail": failed.detail if failed else "",
            "rolled_back": [t.label for t in steps if t.state == "rolled_back"],
            "skipped": sum(t.state == "skipped" for t in steps)}
