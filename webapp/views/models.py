"""Models → Local: every model on every node, the hub download form and its progress (pure)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from orchestrator.agent.hub import HubListing
from orchestrator.control.download_events import verified_holders
from orchestrator.control.download_state import ModelDownload
from orchestrator.control.state import State

from .context import ViewContext
from .format import percent, rate, size, unsupported_text

STATUS_LABELS = {"waiting": "Waiting", "downloading": "Downloading", "copying": "Copying", "verified": "Verified",
                 "failed": "Failed", "cancelled": "Cancelled"}
PHASE_LABELS = {"running": "Running", "done": "Done", "failed": "Failed", "cancelled": "Cancelled"}


def duration(seconds: float | None) -> str:
    """Time left as "45 s", "3 min 20 s", "1 h 5 min" ("–" when unknown)."""
    if seconds is None:
        return "–"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _format(m: Any) -> str:
    """dtype and quantization in a few words: "bfloat16", "4-bit, group 64"."""
    return m.quantization or m.dtype or "–"


def models_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """One row per model id, with every node that holds it (verified or not) and what can be done there."""
    serving = {(s.model_id, nid): s.name for s in state.sessions if s.phase not in ("stopped", "failed")
               for nid in s.node_ids}
    downloading = {(d.model_id, n.node_id) for d in state.downloads if not d.finished for n in d.nodes}
    rows: dict[str, dict[str, Any]] = {}
    for node in state.nodes:
        for m in (node.report.models if node.report else []):
            row = rows.setdefault(m.id, {
                "id": m.id, "family": m.model_type or m.family or "–", "architecture": m.family or "",
                "format": _format(m), "size": size(m.total_bytes), "layers": m.num_layers,
                "supported": m.supported, "reason": unsupported_text(m), "holders": []})
            verified = node.id in verified_holders(state, m.id)
            session = serving.get((m.id, node.id))
            row["holders"].append({
                "node_id": node.id, "node": node.name, "verified": verified, "reachable": node.status == "reachable",
                "session": session,
                # what the buttons say when they cannot act
                "serve_blocked": unsupported_text(m) or (f"serving as {session}" if session else "")
                or ("" if node.status == "reachable" else "node unreachable"),
                "delete_blocked": (f"used by session {session}: stop it first" if session else "")
                or ("being downloaded" if (m.id, node.id) in downloading else ""),
            })
    return {"models": sorted(rows.values(), key=lambda r: r["id"].lower()), "any_nodes": bool(state.nodes)}


def _download_row(d: ModelDownload, names: dict[str, str]) -> dict[str, Any]:
    nodes = []
    for n in d.nodes:
        nodes.append({"node_id": n.node_id, "node": names.get(n.node_id, n.node_id[:8]), "status": n.status,
                      "label": STATUS_LABELS[n.status], "source": n.source, "detail": n.detail,
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
    rows = [_download_row(d, names) for d in reversed(state.downloads)]
    return {"downloads": sorted(rows, key=lambda r: not r["running"])}


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
        problems.append(f"Not an MLX model: {listing.reason}")
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
