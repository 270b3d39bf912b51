"""Models → Local actions (POST, admin + CSRF): list a hub repo's files, download it, cancel,
serve a model on one node, delete it from a node. Each answers with the component it changed,
rendered by the same template the page and the websocket use; a refusal is shown in place."""

from __future__ import annotations

from flask import Blueprint, render_template, request

from orchestrator.control.commands import CommandRefused

from .auth import admin_required
from .components import render
from .services import current_services, view_context
from .views.models import listing_view

bp = Blueprint("models_tab", __name__)


def _component(name: str, error: str | None = None, status: int = 200, at: str = ""):
    state = current_services().orchestrator.state
    return render(name, state, view_context(), error=error, error_at=at), status


def _nodes() -> list[str]:
    return [n for n in request.form.getlist("nodes") if n]


@bp.post("/models/hub-files")
@admin_required
def hub_files():
    """The hub's files and sizes for a repo, as the first chosen node sees the hub (nothing is fetched)."""
    orch = current_services().orchestrator
    chosen = _nodes() or [n.id for n in orch.state.nodes if n.status == "reachable"][:1]
    if not chosen:
        return render_template("components/error.html", message="Download model: add a node first", status=400), 400
    try:
        listing = orch.models.hub_files(request.form.get("repo_id", ""), request.form.get("revision", ""), chosen[0])
    except CommandRefused as exc:
        return render_template("components/error.html", message=f"List files: {exc}", status=400), 400
    node = orch.state.node(chosen[0])
    return render_template("components/hub_listing.html", **listing_view(listing, node.name if node else chosen[0]))


@bp.post("/models/download")
@admin_required
def download():
    """Download model: once from the hub, then LAN copies to the other chosen nodes."""
    try:
        current_services().orchestrator.models.download(request.form.get("repo_id", ""),
                                                        request.form.get("revision", ""), _nodes(),
                                                        request.form.get("model_id", ""))
    except CommandRefused as exc:
        return _component("model-downloads", f"Download model: {exc}", 400)
    return _component("model-downloads")


@bp.post("/models/downloads/<model_id>/cancel")
@admin_required
def cancel(model_id: str):
    """Cancel a running download on every node (its partial files are dropped)."""
    try:
        current_services().orchestrator.models.cancel(model_id)
    except CommandRefused as exc:
        return _component("model-downloads", str(exc), 409)
    return _component("model-downloads")


@bp.post("/models/<model_id>/serve")
@admin_required
def serve(model_id: str):
    """Serve on this node: a single-node session, registered with the router (see Sessions)."""
    node_id = request.form.get("node_id", "")
    try:
        session = current_services().orchestrator.models.serve(model_id, node_id)
    except CommandRefused as exc:
        return _component("local-models", f"Serve: {exc}", 400, at=f"{model_id}:{node_id}")
    html, status = _component("local-models")
    notice = render_template("components/notice.html",
                             message=f"Starting {session.name}: follow it under Sessions, then chat with it.")
    return html + notice, status


@bp.post("/models/<model_id>/delete")
@admin_required
def delete(model_id: str):
    """Delete a model from one node (refused while a session uses it there)."""
    node_id = request.form.get("node_id", "")
    try:
        current_services().orchestrator.models.delete(model_id, node_id)
    except CommandRefused as exc:
        return _component("local-models", f"Delete: {exc}", 409, at=f"{model_id}:{node_id}")
    return _component("local-models")
