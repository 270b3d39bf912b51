"""Pages (GET): login, Models (Local / Distributed), Sessions, Chat, Settings."""

from __future__ import annotations

from flask import Blueprint, abort, redirect, render_template, request, url_for

from webapp import auth
from webapp.components import BY_NAME, render
from webapp.guard import safe_next
from webapp.services import current_services, view_context

bp = Blueprint("pages", __name__)

DISTRIBUTED_COMPONENTS = ["distributed-gate", "nodes", "add-node", "cluster-form", "cluster-options", "plan-preview",
                          "prepare-status", "cluster-monitor"]


def _page(template: str, components: list[str], **extra: object) -> str:
    """A page with its components; the live ones are named in its websocket's URL."""
    state = current_services().orchestrator.state
    ctx = view_context()
    html = {name: render(name, state, ctx) for name in components}
    live = ",".join(name for name in components if BY_NAME[name].live)
    return render_template(template, ctx=ctx, components=html, live=live, state=state, **extra)


@bp.get("/login")
def login_form():
    """The login page (admin token or viewer link)."""
    return render_template("pages/login.html", error=None, ctx=view_context())


@bp.post("/login")
def login_submit():
    """Exchange a token for a session."""
    who = current_services().auth.identify(request.form.get("token", ""))
    if who is None:
        return render_template("pages/login.html", error="That token is not valid.", ctx=view_context()), 401
    auth.login(*who)
    return redirect(safe_next(request.args.get("next"), url_for("pages.models")))


@bp.get("/viewer/<token>")
def viewer_link(token: str):
    """A viewer link: log in as a viewer."""
    who = current_services().auth.identify(token)
    if who is None or who[0] != "viewer":
        abort(401, description="This viewer link is not valid (it may have been revoked).")
    auth.login(*who)
    return redirect(url_for("pages.models"))


@bp.post("/logout")
def logout():
    """End the session, on the server too: the old cookie stops working."""
    auth.logout()
    return redirect(url_for("pages.login_form"))


@bp.before_request
def need_login():
    """Every page but the login ones needs a session."""
    if request.endpoint in ("pages.login_form", "pages.login_submit", "pages.viewer_link") or auth.role():
        return None
    return redirect(url_for("pages.login_form", next=request.full_path.rstrip("?")))


@bp.get("/")
def index():
    """Start on Models: the Distributed tab when distributed serving is on, else Local."""
    return redirect(url_for("pages.models"))


@bp.get("/models")
def models():
    """Models: the Local list and the Distributed tab."""
    state = current_services().orchestrator.state
    # with distributed serving off, the Distributed tab is only a way to turn it on: start on Local
    tab = request.args.get("tab") or ("distributed" if state.settings.distributed_enabled else "local")
    if tab not in ("local", "distributed"):
        abort(404, description=f"no tab {tab!r}")
    if tab == "local":
        return _page("pages/models_local.html", ["local-models", "serve-settings", "download-form", "download-options",
                                                  "model-downloads", "nodes", "add-node"], tab=tab)
    # off: only the gate is live, so the tab appears as soon as another admin turns it on
    names = DISTRIBUTED_COMPONENTS if state.settings.distributed_enabled else ["distributed-gate"]
    return _page("pages/models_distributed.html", names, tab=tab)


@bp.get("/nodes/add-form")
def add_node_form():
    """The Add node form with a discovered node's address filled in (its Register button)."""
    address = (request.args.get("address") or "").strip()[:255]
    return render("add-node", current_services().orchestrator.state, view_context(), form={"address": address})


@bp.get("/cluster/form")
def cluster_form():
    """The Serve-as-cluster form, fresh, keeping the input it was sent (cluster-options asks for
    it when what the form offers changed); without input (a viewer's disabled form), the plan's
    choice."""
    form = request.args if "model" in request.args or "context_length" in request.args else None
    return render("cluster-form", current_services().orchestrator.state, view_context(), form=form)


@bp.get("/models/download-form")
def download_form():
    """The Download model form, fresh, keeping the input it was sent (download-options asks for it
    when the nodes it offers changed, and swaps in only the node toggles)."""
    form = request.args if request.args else None
    return render("download-form", current_services().orchestrator.state, view_context(), form=form)


@bp.get("/sessions")
def sessions():
    """Every serving session."""
    return _page("pages/sessions.html", ["sessions"])


@bp.get("/chat")
def chat():
    """Chat with any model the router serves."""
    return _page("pages/chat.html", ["chat-models"])


@bp.get("/settings")
def settings():
    """Settings → Advanced → Distributed serving."""
    viewers = current_services().auth.viewers() if auth.role() == "admin" else []
    return _page("pages/settings.html", ["settings-status", "settings-form"], viewers=viewers, new_link=None)
