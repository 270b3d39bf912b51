"""Components: one template per component, one stable element id, one view model.

The same `render()` produces the first page render, the htmx response to an action and
the websocket push, so the three can never drift apart. Which events change a live component
is the webapp's own table (`touches.TOUCHES`: event class -> component ids); the live socket
re-renders only those. Only display components are
live: a form is re-rendered by its own actions, and a display component tells it when what
it offers changed (cluster-options), so a push never replaces what a user is typing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from flask import render_template

from orchestrator.control.rules.state import State
from webapp.touches import kinds_touching
from webapp.views import cluster, models, nodes, plan, sessions, settings
from webapp.views.context import ViewContext


@dataclass(frozen=True)
class Component:
    """A piece of a page. A live one is pushed again when an event that touches it
    (`touches.TOUCHES`) changes its HTML; a form is never live (a push would replace what the
    user is typing): it is rendered by its page and by its own actions' answers."""

    name: str  # the root element's id
    template: str
    view: Callable[[State, ViewContext], dict[str, Any]]
    live: bool = False  # whether websockets push it
    kinds: frozenset[str] = field(init=False)  # the event kinds that change it (none for a form)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", kinds_touching(self.name) if self.live else frozenset())


def _nothing(state: State, ctx: ViewContext) -> dict[str, Any]:
    return {}


def _gate(state: State, ctx: ViewContext) -> dict[str, Any]:
    return {"enabled": state.settings.distributed_enabled}


COMPONENTS: tuple[Component, ...] = (
    Component("settings-form", "components/settings_form.html", settings.settings_view),
    Component("settings-status", "components/settings_status.html", settings.settings_view, live=True),
    # the Distributed tab's page swaps itself when distributed serving is turned on or off
    Component("distributed-gate", "components/distributed_gate.html", _gate, live=True),
    Component("nodes", "components/nodes.html", nodes.nodes_view, live=True),
    Component("add-node", "components/add_node.html", _nothing),
    Component("cluster-form", "components/cluster_form.html", cluster.form_view),
    # what the form offers changed: the form asks for itself again, with the user's own input
    Component("cluster-options", "components/cluster_options.html", cluster.options_view, live=True),
    Component("plan-preview", "components/plan_preview.html", plan.plan_view, live=True),
    Component("prepare-status", "components/prepare_status.html", cluster.prepare_view, live=True),
    Component("cluster-monitor", "components/cluster_monitor.html", cluster.monitor_view, live=True),
    Component("sessions", "components/sessions.html", sessions.sessions_view, live=True),
    # Models → Local: the models on every node, the hub download form (not live) and its progress
    Component("local-models", "components/local_models.html", models.models_view, live=True),
    # what Serve on this node starts with (not live: a push never replaces what is typed)
    Component("serve-settings", "components/serve_settings.html", models.serve_settings_view),
    Component("download-form", "components/download_form.html", models.download_form_view),
    # the nodes the download form offers changed: the form's node toggles are fetched again, with the user's input
    Component("download-options", "components/download_options.html", models.download_options_view, live=True),
    Component("model-downloads", "components/model_downloads.html", models.downloads_view, live=True),
    # Chat: what the router serves may have changed; the page asks it again (static/chat.js)
    Component("chat-models", "components/chat_models.html", sessions.chat_models_view, live=True),
)
BY_NAME = {c.name: c for c in COMPONENTS}


def render(name: str, state: State, ctx: ViewContext, oob: bool = False, error: str | None = None,
           error_at: str = "", form: Any = None) -> str:
    """The component's HTML; `oob` marks it for an out-of-band swap (websocket pushes).

    An action that was refused renders its component with `error` (shown next to the control
    named by `error_at`) and the submitted `form`, so the user's input is kept to correct it.
    """
    c = BY_NAME[name]
    return render_template(c.template, component_id=c.name, oob=oob, ctx=ctx, error=error, error_at=error_at,
                           form=form, **c.view(state, ctx))


def affected(kind: str, names: list[str]) -> list[str]:
    """Which of these (live) components an event kind changes."""
    return [n for n in names if n in BY_NAME and kind in BY_NAME[n].kinds]
