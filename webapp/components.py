"""Components: one template per component, one stable element id, one view model.

The same `render()` produces the first page render, the htmx response to an action and
the websocket push, so the three can never drift apart. Each live component names the event
kinds that change it; the live socket re-renders only those. Only display components are
live: a form is re-rendered by its own actions, and a display component tells it when what
it offers changed (cluster-options), so a push never replaces what a user is typing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from flask import render_template

from orchestrator.control.state import State

from orchestrator.control.download_events import DOWNLOAD_KINDS

from .views import cluster, models, nodes, plan, sessions, settings
from .views.context import ViewContext

ALL = "*"
RECOVERY_KINDS = ("post_mortem_recorded", "recovery_failed", "session_recovered")


@dataclass(frozen=True)
class Component:
    """A piece of a page. A live one (`kinds` not empty) is pushed again when those events
    change its HTML; a form is never live (a push would replace what the user is typing): it is
    rendered by its page and by its own actions' answers."""

    name: str  # the root element's id
    template: str
    view: Callable[[State, ViewContext], dict[str, Any]]
    kinds: frozenset[str]

    @property
    def live(self) -> bool:
        """Whether websockets push it."""
        return bool(self.kinds)


def _nothing(state: State, ctx: ViewContext) -> dict[str, Any]:
    return {}


def _gate(state: State, ctx: ViewContext) -> dict[str, Any]:
    return {"enabled": state.settings.distributed_enabled}


CLUSTER_CHOICE_KINDS = frozenset({"settings_changed", "node_registered", "node_removed", "node_reported",
                                  "node_unreachable", "plan_previewed", "preparation_started", "preparation_finished",
                                  "session_created", "session_removed"})

MODEL_LIST_KINDS = frozenset({"node_registered", "node_removed", "node_reported", "node_unreachable",
                              "session_created", "health_changed", "session_removed", "preparation_finished",
                              "preparation_progressed"}) | DOWNLOAD_KINDS

COMPONENTS: tuple[Component, ...] = (
    Component("settings-form", "components/settings_form.html", settings.settings_view, frozenset()),
    Component("settings-status", "components/settings_status.html", settings.settings_view,
              frozenset({"settings_changed"})),
    # the Distributed tab's page swaps itself when distributed serving is turned on or off
    Component("distributed-gate", "components/distributed_gate.html", _gate, frozenset({"settings_changed"})),
    Component("nodes", "components/nodes.html", nodes.nodes_view,
              frozenset({"node_registered", "node_removed", "node_reported", "node_unreachable", "node_discovered",
                         "node_vanished", "session_created", "session_removed"})),
    Component("add-node", "components/add_node.html", _nothing, frozenset()),
    Component("cluster-form", "components/cluster_form.html", cluster.form_view, frozenset()),
    # what the form offers changed: the form asks for itself again, with the user's own input
    Component("cluster-options", "components/cluster_options.html", cluster.options_view, CLUSTER_CHOICE_KINDS),
    Component("plan-preview", "components/plan_preview.html", plan.plan_view, frozenset({"plan_previewed"})),
    Component("prepare-status", "components/prepare_status.html", cluster.prepare_view,
              frozenset({"preparation_started", "preparation_progressed", "preparation_finished"})),
    Component("cluster-monitor", "components/cluster_monitor.html", cluster.monitor_view,
              frozenset({"session_created", "launch_stepped", "session_registered", "session_observed",
                         "session_faulted", "health_changed", "session_removed", *RECOVERY_KINDS})),
    Component("sessions", "components/sessions.html", sessions.sessions_view,
              frozenset({"session_created", "session_registered", "session_observed", "session_faulted",
                         "health_changed", "session_removed", "launch_stepped", *RECOVERY_KINDS})),
    # Models → Local: the models on every node, the hub download form (not live) and its progress
    Component("local-models", "components/local_models.html", models.models_view, MODEL_LIST_KINDS),
    Component("download-form", "components/download_form.html", models.download_form_view, frozenset()),
    Component("model-downloads", "components/model_downloads.html", models.downloads_view,
              DOWNLOAD_KINDS | {"node_registered", "node_removed"}),
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
    return [n for n in names if n in BY_NAME and (kind in BY_NAME[n].kinds or ALL in BY_NAME[n].kinds)]
