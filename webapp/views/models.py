"""Models → Local: every model on every node, the hub download form and its progress (pure)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from orchestrator.agent.hub import HubListing
from orchestrator.control.rules.download_state import ModelDownload
from orchestrator.control.rules.state import State
from orchestrator.control.rules.verification import verified_copy
from webapp.views.context import ViewContext
from webapp.views.format import duration, percent, rate, size, unsupported_text
from webapp.views.sessions import session_state

STATUS_LABELS = {"waiting": "Waiting", "downloading": "Downloading", "copying": "Copying", "verified": "Verified",
                 "failed": "Failed", "cancelled": "Cancelled"}
PHASE_LABELS = {"running": "Running", "done": "Done", "failed": "Failed", "cancelled": "Cancelled"}


def _format(m: Any) -> str:
    """dtype and quantization in a few words: "bfloat16", "4-bit, group 64"."""
    return m.quantization or m.dtype or "–"


def models_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """One row per model id, with every node that holds it (verified or not) and what can be done there."""
    serving = {(s.model_id, nid): s.name for s in state.sessions if s.phase not in ("stopped", "failed")
               for nid in s.node_ids}
    # "Serving" only once healthy with its facts (sessions.shown_health); before that what it does
    state_of = {(s.model_id, nid): session_state(s) for s in state.sessions if s.phase not in ("stopped", "failed")
                for nid in s.node_ids}
    downloading = {(d.model_id, n.node_id) for d in state.downloads if not d.finished for n in d.nodes}
    checks = {(c.model_id, c.node_id): c for c in state.checks}
    rows: dict[str, dict[str, Any]] = {}
    for node in state.nodes:
        for m in (node.report.models if node.report else []):
            row = rows.setdefault(m.id, {
                "id": m.id, "family": m.model_type or m.family or "–", "architecture": m.family or "",
                "format": _format(m), "size": size(m.total_bytes), "layers": m.num_layers,
                "supported": m.supported, "reason": unsupported_text(m), "holders": []})
            copy = verified_copy(state, m.id, node.id)
            session = serving.get((m.id, node.id))
            row["holders"].append({
                "node_id": node.id, "node": node.name, "verified": copy is not None, "how": copy.how if copy else "",
                "check": checks.get((m.id, node.id)), "reachable": node.status == "reachable",
                "session": session, "session_state": state_of.get((m.id, node.id), ""),
                # what the buttons say when they cannot act
                "serve_blocked": unsupported_text(m) or (f"serving as {session}" if session else "")
                or ("" if node.status == "reachable" else "node unreachable"),
                "delete_blocked": (f"used by session {session}: stop it first" if session else "")
                or ("being downloaded" if (m.id, node.id) in downloading else ""),
            })
    return {"models": sorted(rows.values(), key=lambda r: r["id"].lower()), "any_nodes": bool(state.nodes)}


def serve_settings_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """The defaults Serve on this node starts with: the plan form's context length and concurrency."""
    return {"context": 4096, "concurrency": 4}


def _download_row(d: ModelDownload, names: dict[str, str], state: State) -> dict[str, Any]:
    nodes = []
    for n in d.nodes:
        # history: a copy verified then, deleted (or changed) since, is not called Verified now
        label, detail = STATUS_LABELS[n.status], n.detail
        if n.status == "verified" and d.finished and verified_copy(state, d.model_id, n.node_id) is None:
            label = "Verified, since deleted or changed"
        # a LAN follower copies each file once the first node verified it: before the first, it waits
        first = d.nodes[0]
        if n.status == "copying" and n.done_bytes == 0 and n is not first and first.status != "verified":
            label = "Waiting"
            detail = detail or (f"waiting for {names.get(first.node_id, first.node_id[:8])} to download and verify "
                                "a first file: each file is copied once it is verified there")
        nodes.append({"node_id": n.node_id, "node": names.get(n.node_id, n.node_id[:8]), "status": n.status,
                      "label": label, "source": n.source, "detail": detail,
                      "percent": percent(n.done_bytes, n.total_bytes or d.total_bytes),
                      "bytes": f"{size(n.done_bytes)} / {size(n.total_bytes or d.total_bytes)}",
                      # rate and time left once measured (a job's first second has neither)
                      "rate": rate(n.rate_bps) if n.status in ("downloading", "copying") and n.rate_bps else "",
                      "eta": duration(n.eta_s) if n.status in ("downloading", "copying") and n.eta_s is not None
                      else "",
                      "active": n.status in ("downloading", "copying")})
    return {"model": d.model_id, "repo": d.hub.label, "commit": d.commit[:12], "size": size(d.total_bytes),
            "files": d.files, "phase": d.phase, "phase_label": PHASE_LABELS[d.phase], "error": d.error,
            "running": not d.finished, "nodes": nodes}


def downloads_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """Every download still running, then the recent finished ones (newest first)."""
    names = {n.id: n.name for n in state.nodes}
    rows = [_download_row(d, names, state) for d in reversed(state.downloads)]
    return {"downloads": sorted(rows, key=lambda r: not r["running"]), "finished": any(not r["running"] for r in rows)}


def download_form_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """The nodes a download can go to."""
    return {"nodes": [{"id": n.id, "name": n.name, "reachable": n.status == "reachable",
                       "disk_free": size(n.report.disk_free_bytes) if n.report else "–"} for n in state.nodes]}


def download_options_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """A digest of the nodes the Download model form offers: when it changes, the form's node toggles
    are fetched again with the user's own input (components.py, download_options.html)."""
    blob = json.dumps(download_form_view(state, ctx)["nodes"], sort_keys=True).encode()
    return {"digest": hashlib.sha256(blob).hexdigest()[:16]}


def listing_view(listing: HubListing, node_name: str) -> dict[str, Any]:
    """The hub's file list before anything is fetched, and whether it can be downloaded."""
    problems = []
    if not listing.mlx:
        reason = listing.reason or "not an MLX repository"  # it says so itself: not "Not an MLX model: … not MLX"
        problems.append(reason[0].upper() + reason[1:])
    elif listing.unsupported_reason:
        problems.append(f"Unsupported: {listing.unsupported_reason}")
    if listing.gated and not listing.token:
        problems.append("Gated repository: the node has no hub token (start its agent with HF_TOKEN set)")
    if not listing.fits:
        problems.append(f"Too big for {node_name}'s disk: {size(listing.disk_free_bytes)} free")
    files = sorted(listing.files, key=lambda f: (-f.size, f.path))
    return {"repo": listing.repo_id, "revision": listing.revision, "commit": listing.commit[:12],
            "files": [{"path": f.path, "size": size(f.size), "lfs": f.sha256 is not None} for f in files],
            "total": size(listing.total_bytes), "count": len(files), "model_type": listing.model_type or "–",
            "gated": listing.gated, "problems": problems, "node": node_name,
            "blocking": not listing.mlx or (listing.gated and not listing.token) or not listing.fits}
