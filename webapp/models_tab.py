"""Models → Local actions (POST, admin + CSRF): list a hub repo's files, download it, cancel,
serve a model on one node, delete it from a node. Each answers with the component it changed,
rendered by the same template the page and the websocket use; a refusal is shown in place."""

from __future__ import annotations

from collections.abc import Callable

from flask import Blueprint, render_template, request

from orchestrator.control.rules.commands import CommandRefused
from webapp.auth import admin_required
from webapp.components import render
from webapp.forms import FormError, integer
from webapp.services import current_services, view_context
from webapp.views.models import listing_view

bp = Blueprint("models_tab", __name__)


def _component(name: str, error: str | None = None, status: int = 200, at: str = ""):
    state = current_services().orchestrator.state
    return render(name, state, view_context(), error=error, error_at=at), status


def _nodes() -> list[str]:
    return [n for n in request.form.getlist("nodes") if n]


def _name_check() -> tuple[str, str | None]:
    """The name the download would get on the chosen nodes (typed, else the repo's), and what is
    wrong with it (None: nothing), by the download's own rule (model_rules.name_problem)."""
    from orchestrator.control.models import default_model_id
    from orchestrator.control.rules.model_rules import name_problem

    values = request.values
    typed = (values.get("model_id") or "").strip()
    repo = (values.get("repo_id") or "").strip()
    name = typed or (default_model_id(repo) if "/" in repo else "")
    if not name:
        return "", None
    nodes = [n for n in values.getlist("nodes") if n]
    return name, name_problem(current_services().orchestrator.state, name, nodes)


@bp.get("/models/name-check")
@admin_required
def name_check():
    """Name on the nodes, checked at the field as it is typed (and when the repo or nodes change)."""
    name, problem = _name_check()
    return render_template("components/name_note.html", name_id=name, name_problem=problem and f"Name on the nodes: "
                                                                                                f"{problem}")


@bp.post("/models/hub-files")
@admin_required
def hub_files():
    """The hub's files and sizes for a repo, as the first chosen node sees the hub (nothing is fetched)."""
    orch = current_services().orchestrator
    chosen = _nodes() or [n.id for n in orch.state.nodes if n.status == "reachable"][:1]
    if not chosen:
        return render_template("components/error.html", message="Download model: add a node first", status=400), 400
    _, problem = _name_check()
    if problem:  # refused before the hub is even asked: nothing starts with a name that cannot be used
        return render_template("components/error.html", message=f"Name on the nodes: {problem}", status=400), 400
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


@bp.post("/models/downloads/clear")
@admin_required
def clear_downloads():
    """Clear the finished downloads from the list (running ones stay)."""
    from orchestrator.control.rules.commands import ClearDownloads

    current_services().orchestrator.command(ClearDownloads())
    return _component("model-downloads")


@bp.post("/models/<model_id>/serve")
@admin_required
def serve(model_id: str):
    """Serve on this node: a single-node session, registered with the router (see Sessions)."""
    node_id = request.form.get("node_id", "")
    try:
        context = integer(request.form, "context_length", "Context length", 256, 131072) \
            if request.form.get("context_length") else 4096
        concurrency = integer(request.form, "concurrency", "Concurrent requests", 1, 64) \
            if request.form.get("concurrency") else 4
        session = current_services().orchestrator.models.serve(model_id, node_id, context, concurrency)
    except (FormError, CommandRefused) as exc:
        return _component("local-models", f"Serve: {exc}", 400, at=f"{model_id}:{node_id}")
    html, status = _component("local-models")
    notice = render_template("components/notice.html",
                             message=f"Starting {session.name} (context {context} tokens, {concurrency} concurrent "
                                     "requests): follow it under Sessions, then chat with it.")
    return html + notice, status


@bp.post("/models/<model_id>/verify")
@admin_required
def verify(model_id: str):
    """Verify one node's copy: every file hashed again against its manifest (the badge follows live)."""
    return _on_one_node(model_id, "Verify", current_services().orchestrator.models.verify)


@bp.post("/models/<model_id>/delete")
@admin_required
def delete(model_id: str):
    """Delete a model from one node (refused while a session uses it there)."""
    return _on_one_node(model_id, "Delete", current_services().orchestrator.models.delete)


def _on_one_node(model_id: str, action: str, command: Callable[[str, str], object]):
    """Run a command on the form's node's copy of a model; a refusal is said beside that row."""
    node_id = request.form.get("node_id", "")
    try:
        command(model_id, node_id)
    except CommandRefused as exc:
        return _component("local-models", f"{action}: {exc}", 409, at=f"{model_id}:{node_id}")
    return _component("local-models")
