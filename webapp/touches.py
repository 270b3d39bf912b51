"""What each control-plane event changes on the dashboard: the ids of its live components, and
which of them each event touches (`TOUCHES`). The dashboard's knowledge, not the control plane's:
events are values about serving (orchestrator/control/rules/events.py), and the pages they refresh
are the webapp's. `components.py` derives what a websocket push listens for from this table; a test
checks that every event class is in it and that every live component is touched by some event.
"""

from __future__ import annotations

from orchestrator.control.rules import download_events, timing_events
from orchestrator.control.rules import events as ev

# Ids of the dashboard's live components (their root elements' ids, components.py).
SETTINGS_STATUS = "settings-status"
DISTRIBUTED_GATE = "distributed-gate"
NODES = "nodes"
CLUSTER_OPTIONS = "cluster-options"  # what the Serve-as-cluster form offers changed
PLAN_PREVIEW = "plan-preview"
PREPARE_STATUS = "prepare-status"
CLUSTER_MONITOR = "cluster-monitor"
SESSIONS = "sessions"
LOCAL_MODELS = "local-models"
MODEL_DOWNLOADS = "model-downloads"
DOWNLOAD_OPTIONS = "download-options"  # the nodes the Download model form offers changed
CHAT_MODELS = "chat-models"  # the models the router serves may have changed: Chat asks it again
SESSION_VIEWS = (CLUSTER_MONITOR, SESSIONS)  # both show a session's phase, health, timeline and faults
LIVE_COMPONENTS = frozenset({SETTINGS_STATUS, DISTRIBUTED_GATE, NODES, CLUSTER_OPTIONS, PLAN_PREVIEW, PREPARE_STATUS,
                             CLUSTER_MONITOR, SESSIONS, LOCAL_MODELS, MODEL_DOWNLOADS, DOWNLOAD_OPTIONS,
                             CHAT_MODELS})

# Event class -> the live components whose HTML it can change (a new event class must be added here).
TOUCHES: dict[type[ev.Event], frozenset[str]] = {
    ev.SettingsChanged: frozenset({SETTINGS_STATUS, DISTRIBUTED_GATE, CLUSTER_OPTIONS}),
    ev.NodeRegistered: frozenset({NODES, CLUSTER_OPTIONS, LOCAL_MODELS, MODEL_DOWNLOADS, DOWNLOAD_OPTIONS}),
    ev.NodeRemoved: frozenset({NODES, CLUSTER_OPTIONS, LOCAL_MODELS, MODEL_DOWNLOADS, DOWNLOAD_OPTIONS}),
    ev.NodeReported: frozenset({NODES, CLUSTER_OPTIONS, PLAN_PREVIEW, LOCAL_MODELS, DOWNLOAD_OPTIONS}),
    ev.NodeUnreachable: frozenset({NODES, CLUSTER_OPTIONS, PLAN_PREVIEW, LOCAL_MODELS, DOWNLOAD_OPTIONS}),
    ev.NodeDiscovered: frozenset({NODES}),
    ev.NodeVanished: frozenset({NODES}),
    ev.PlanPreviewed: frozenset({CLUSTER_OPTIONS, PLAN_PREVIEW}),
    ev.PreparationStarted: frozenset({CLUSTER_OPTIONS, PREPARE_STATUS}),
    ev.PreparationProgressed: frozenset({PREPARE_STATUS, LOCAL_MODELS}),
    ev.PreparationFinished: frozenset({CLUSTER_OPTIONS, PREPARE_STATUS, LOCAL_MODELS}),
    ev.SessionCreated: frozenset({*SESSION_VIEWS, NODES, CLUSTER_OPTIONS, LOCAL_MODELS, CHAT_MODELS}),
    ev.LaunchStepped: frozenset({*SESSION_VIEWS}),
    ev.SessionRegistered: frozenset({*SESSION_VIEWS, CHAT_MODELS}),
    ev.SessionObserved: frozenset({*SESSION_VIEWS, NODES, LOCAL_MODELS}),
    ev.SessionFaulted: frozenset({*SESSION_VIEWS, CHAT_MODELS}),  # the picker: recovering, back
    ev.PostMortemRecorded: frozenset({*SESSION_VIEWS}),
    ev.StageMoved: frozenset({*SESSION_VIEWS, NODES}),
    ev.StageCopyStarted: frozenset({*SESSION_VIEWS}),
    ev.RecoveryFailed: frozenset({*SESSION_VIEWS, CHAT_MODELS}),  # the picker: recovering, back
    ev.SessionRecovered: frozenset({*SESSION_VIEWS, CHAT_MODELS}),  # the picker: recovering, back
    ev.RequestsResumed: frozenset({*SESSION_VIEWS}),
    ev.HealthChanged: frozenset({*SESSION_VIEWS, NODES, LOCAL_MODELS, CHAT_MODELS}),
    ev.SessionRemoved: frozenset({*SESSION_VIEWS, NODES, CLUSTER_OPTIONS, LOCAL_MODELS, CHAT_MODELS}),
    ev.LaunchEnded: frozenset({*SESSION_VIEWS, NODES, CLUSTER_OPTIONS, LOCAL_MODELS, CHAT_MODELS}),
    ev.CopyCheckStarted: frozenset({LOCAL_MODELS}),
    ev.CopyCheckFinished: frozenset({PREPARE_STATUS, LOCAL_MODELS}),
    download_events.ModelDownloadStarted: frozenset({LOCAL_MODELS, MODEL_DOWNLOADS}),
    download_events.ModelDownloadProgressed: frozenset({LOCAL_MODELS, MODEL_DOWNLOADS}),
    download_events.ModelDownloadListed: frozenset({LOCAL_MODELS, MODEL_DOWNLOADS}),
    download_events.ModelDownloadFinished: frozenset({LOCAL_MODELS, MODEL_DOWNLOADS}),
    download_events.DownloadsCleared: frozenset({MODEL_DOWNLOADS}),
    download_events.ModelDeletionStarted: frozenset({LOCAL_MODELS}),
    download_events.ModelDeletionFinished: frozenset({LOCAL_MODELS}),
    timing_events.LayerTimingChanged: frozenset({PLAN_PREVIEW}),
}


def kinds_touching(component: str) -> frozenset[str]:
    """The event kinds that change a live component (what its websocket push listens for)."""
    return frozenset(ev.kind_of(cls) for cls, touched in TOUCHES.items() if component in touched)


__all__ = ["CHAT_MODELS", "LIVE_COMPONENTS", "SESSION_VIEWS", "TOUCHES", "kinds_touching"]
