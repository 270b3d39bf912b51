"""Actions (POST, admin + CSRF): each changes state through the orchestrator and answers the
affected component, rendered by the same template the page and the websocket use."""

from __future__ import annotations

from flask import Blueprint, abort, render_template, request

from orchestrator.control.core import CommandRefused
from webapp.auth import admin_required
from webapp.components import render
from webapp.forms import FormError, integer, selection, settings_from
from webapp.services import current_services, view_context
from webapp.views.cluster import selection_from
from webapp.views.selection import hub_conflict

bp = Blueprint("actions", __name__)


def _component(name: str, error: str | None = None, status: int = 200, at: str = ""):
    """The component after an action; when refused, with the message next to the control `at`
    and the submitted values kept (status 4xx: htmx swaps it all the same, see base.html)."""
    state = current_services().orchestrator.state
    html = render(name, state, view_context(), error=error, error_at=at, form=request.form if error else None)
    return html, status


def _with_notice(answer: tuple[str, int], message: str) -> tuple[str, int]:
    """An answer plus a short confirmation in the page's notice area (outside the component,
    which the live push may re-render at once)."""
    html, status = answer
    return html + render_template("components/notice.html", message=message), status


def _refused_in_form(error: str, status: int = 400):
    """A Serve-as-cluster action refused: the message goes under its buttons, whatever component
    the action would have updated. Only the message is swapped: the form, with the user's input,
    stays as it is."""
    html = render_template("components/cluster_alert.html", error=error, error_at="actions", oob=False)
    return html, status, {"HX-Retarget": "#cluster-alert", "HX-Reswap": "outerHTML"}


def _accepted_in_form(answer: tuple[str, int]) -> tuple[str, int]:
    """A Serve-as-cluster action accepted: its component, and the form's last refusal cleared."""
    html, status = answer
    return html + render_template("components/cluster_alert.html", error=None, oob=True), status


@bp.post("/settings/distributed")
@admin_required
def save_settings():
    """Save Settings → Advanced → Distributed serving."""
    try:
        settings = settings_from(request.form)
        current_services().orchestrator.update_settings(settings)
    except (FormError, CommandRefused) as exc:
        return _component("settings-form", str(exc), 400, at="save")
    return _with_notice(_component("settings-form"),
                        f"Saved: distributed serving {'on' if settings.distributed_enabled else 'off'}, "
                        f"{settings.transport_backend}, ports {settings.port_start}–{settings.port_end}. "
                        + (f"Failed stages restart automatically (up to {settings.restart_attempts} attempts). "
                           if settings.auto_restart else "Automatic restarts are off. ")
                        + (f"Speculative decoding drafts up to {settings.speculative_tokens} tokens per pass in "
                           "clusters launched from now on." if settings.speculative_tokens
                           else "Speculative decoding is off."))


@bp.post("/settings/viewer-links")
@admin_required
def new_viewer_link():
    """Mint a viewer link (shown once)."""
    label = (request.form.get("label") or "viewer").strip()[:64]
    _, token = current_services().auth.mint_viewer(label)
    link = request.host_url.rstrip("/") + f"/viewer/{token}"
    return render_template("components/viewer_link.html", link=link, label=label) + \
        render_template("components/viewer_list.html", viewers=current_services().auth.viewers(), oob=True)


@bp.post("/settings/viewer-links/<vid>/revoke")
@admin_required
def revoke_viewer_link(vid: str):
    """Revoke a viewer link: its sessions end and its open pages go to the login page."""
    auth = current_services().auth
    if not auth.revoke_viewer(vid):
        abort(404, description=f"no viewer link {vid!r} (already revoked?)")
    return render_template("components/viewer_list.html", viewers=auth.viewers()) + \
        render_template("components/notice.html", message="Viewer link revoked: its open pages close now.")


@bp.post("/nodes")
@admin_required
def add_node():
    """Add node: address + pairing token."""
    address = (request.form.get("address") or "").strip()
    token = (request.form.get("token") or "").strip()
    if not address or not token:
        return _component("add-node", "Add node: both the address and the pairing token are needed", 400)
    orch = current_services().orchestrator
    try:
        orch.register_node(address, token)
    except CommandRefused as exc:
        return _component("add-node", f"Add node: {exc}", 400)
    # an empty form for the next node, and the list with this one (at once, before the push)
    html, status = _component("add-node")
    return html + render("nodes", orch.state, view_context(), oob=True), status


@bp.post("/nodes/<node_id>/remove")
@admin_required
def remove_node(node_id: str):
    """Forget a node (refused while it serves)."""
    try:
        current_services().orchestrator.remove_node(node_id)
    except CommandRefused as exc:
        return _component("nodes", str(exc), 409, at=node_id)
    return _component("nodes")


def _context_length() -> int:
    return integer(request.form, "context_length", "Context length", 256, 131072) \
        if request.form.get("context_length") else 4096


def _draft_model(model: str) -> str | None:
    """The launch form's draft model: a model id, or None (prompt lookup)."""
    draft = (request.form.get("draft_model") or "").strip()
    if draft and draft == model:
        raise FormError("Draft model: choose a smaller model than the one served, or none")
    return draft or None


@bp.post("/cluster/plan")
@admin_required
def preview_plan():
    """Preview shard plan: read-only, nothing starts."""
    orch = current_services().orchestrator
    before = orch.state.plan
    try:
        model, nodes = selection(request.form)
        orch.preview_plan(model, nodes, _context_length(), draft_model=_draft_model(model))
    except (FormError, CommandRefused) as exc:
        return _refused_in_form(f"Preview shard plan: {exc}")
    try:
        orch.wait(lambda st: st.plan is not before, 5)  # answer with this preview, not the previous one
    except TimeoutError:
        pass  # the websocket brings it
    return _accepted_in_form(_component("plan-preview"))


@bp.post("/cluster/prepare")
@admin_required
def prepare():
    """Prepare on all nodes."""
    try:
        form, hub = request.form, None
        if (form.get("hub_repo") or "").strip():  # no node has it yet: one hub download, then LAN copies
            from orchestrator.control.models import parse_hub_ref

            hub = parse_hub_ref(form["hub_repo"])
            # the hub repo prepares the selected model or none: never a third one behind the cards' back
            chosen = selection_from(current_services().orchestrator.state, form)
            conflict = hub_conflict(chosen)
            if conflict:
                raise FormError(conflict)
            form = form.copy()
            form["model"] = chosen.model_id or ""
        model, nodes = selection(form)
        current_services().orchestrator.prepare(model, nodes, hub=hub)
    except (FormError, CommandRefused) as exc:
        return _refused_in_form(f"Prepare on all nodes: {exc}")
    return _accepted_in_form(_component("prepare-status"))


@bp.post("/cluster/launch")
@admin_required
def launch():
    """Launch cluster (ordered, all or nothing; the timeline arrives over the websocket)."""
    orch = current_services().orchestrator
    try:
        model, nodes = selection(request.form)
        # refused while the nodes serve it (decide.py)
        orch.launch_cluster(model, nodes, _context_length(), draft_model=_draft_model(model))
    except (FormError, CommandRefused) as exc:
        return _refused_in_form(f"Launch cluster: {exc}")
    return _accepted_in_form(_component("cluster-monitor"))


@bp.post("/sessions/<session_id>/stop")
@admin_required
def stop_session(session_id: str):
    """Stop cluster / Stop: the same lifecycle command."""
    target = request.form.get("target", "sessions")
    target = target if target in ("sessions", "cluster-monitor") else "sessions"
    try:
        current_services().orchestrator.stop_session(session_id)
    except CommandRefused as exc:
        return _component(target, str(exc), 409, at=session_id)
    return _component(target)
