"""The base of every event and the ids of the live components events refresh (pure).

Apart from `events.py` so that the event classes of one topic can live in their own module
(`download_events.py`) without an import cycle: both import this, `events` collects them all.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

# Ids of the dashboard's live components (their root elements' ids, webapp/components.py).
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


class Event(BaseModel):
    """Base of all events. Each concrete class sets `kind` and both ClassVars below."""

    model_config = ConfigDict(frozen=True)
    kind: str
    persisted: ClassVar[bool]  # save the state after applying it (what must survive a restart)
    touches: ClassVar[frozenset[str]]  # live components (ids above) whose HTML it can change
