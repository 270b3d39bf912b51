"""Events: what happened, in the past tense. The only way state changes, and what the UI pushes.

Workers post events to the orchestrator's inbox and `decide` returns them for commands; the
orchestrator applies them (`transitions.apply`) and publishes them to every subscriber
through one `EventBus`.

Every event class declares, next to its fields, what follows from it besides the state
change: `persisted` (the orchestrator saves the state after it, `store.py`) and `touches`
(the ids of the dashboard's live components whose HTML it can change; `webapp/components.py`
derives each component's event kinds from these). A renamed or new event therefore carries
its own answer to "is it saved, what does it refresh", and a test checks every class says.
"""

from __future__ import annotations

import queue
import threading
from typing import ClassVar, Literal

from orchestrator.agent.schemas import Report
from orchestrator.control.event_base import (  # re-exported (`X as X`): every module names them as events.X
    CHAT_MODELS as CHAT_MODELS,
)
from orchestrator.control.event_base import (
    CLUSTER_MONITOR as CLUSTER_MONITOR,
)
from orchestrator.control.event_base import (
    CLUSTER_OPTIONS as CLUSTER_OPTIONS,
)
from orchestrator.control.event_base import (
    DISTRIBUTED_GATE as DISTRIBUTED_GATE,
)
from orchestrator.control.event_base import (
    DOWNLOAD_OPTIONS as DOWNLOAD_OPTIONS,
)
from orchestrator.control.event_base import (
    LIVE_COMPONENTS as LIVE_COMPONENTS,
)
from orchestrator.control.event_base import (
    LOCAL_MODELS as LOCAL_MODELS,
)
from orchestrator.control.event_base import (
    MODEL_DOWNLOADS as MODEL_DOWNLOADS,
)
from orchestrator.control.event_base import (
    NODES as NODES,
)
from orchestrator.control.event_base import (
    PLAN_PREVIEW as PLAN_PREVIEW,
)
from orchestrator.control.event_base import (
    PREPARE_STATUS as PREPARE_STATUS,
)
from orchestrator.control.event_base import (
    SESSION_VIEWS as SESSION_VIEWS,
)
from orchestrator.control.event_base import (
    SESSIONS as SESSIONS,
)
from orchestrator.control.event_base import (
    SETTINGS_STATUS as SETTINGS_STATUS,
)
from orchestrator.control.event_base import (
    Event as Event,
)
from orchestrator.control.state import (
    DiscoveredNode,
    Health,
    Node,
    NodePreparation,
    Phase,
    PostMortem,
    Preparation,
    PreviewedPlan,
    ResumedRequests,
    Sample,
    Session,
    Settings,
    StagePlacement,
    StageStatus,
    StepState,
)


def event_classes() -> tuple[type[Event], ...]:
    """Every concrete event class, the download events included (their module is imported here)."""
    from orchestrator.control import download_events  # noqa: F401 (defines Event subclasses)

    found: list[type[Event]] = []
    todo = list(Event.__subclasses__())
    while todo:
        cls = todo.pop(0)
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return tuple(found)


def kind_of(cls: type[Event]) -> str:
    """The `kind` string an event class carries (its field's default)."""
    return str(cls.model_fields["kind"].default)


def kinds_touching(component: str) -> frozenset[str]:
    """The event kinds that change a live component (what its websocket push listens for)."""
    return frozenset(kind_of(cls) for cls in event_classes() if component in cls.touches)


class SettingsChanged(Event):
    kind: Literal["settings_changed"] = "settings_changed"
    persisted: ClassVar[bool] = True
    touches: ClassVar[frozenset[str]] = frozenset({SETTINGS_STATUS, DISTRIBUTED_GATE, CLUSTER_OPTIONS})
    settings: Settings


class NodeRegistered(Event):
    kind: Literal["node_registered"] = "node_registered"
    persisted: ClassVar[bool] = True
    touches: ClassVar[frozenset[str]] = frozenset({NODES, CLUSTER_OPTIONS, LOCAL_MODELS, MODEL_DOWNLOADS,
                                                   DOWNLOAD_OPTIONS})
    node: Node


class NodeRemoved(Event):
    kind: Literal["node_removed"] = "node_removed"
    persisted: ClassVar[bool] = True
    touches: ClassVar[frozenset[str]] = frozenset({NODES, CLUSTER_OPTIONS, LOCAL_MODELS, MODEL_DOWNLOADS,
                                                   DOWNLOAD_OPTIONS})
    node_id: str


class NodeReported(Event):
    kind: Literal["node_reported"] = "node_reported"
    persisted: ClassVar[bool] = False
    # The plan card shows the nodes' latest link measurements and loads (views/perf.py): without
    # PLAN_PREVIEW each page kept the figures of whenever it last rendered the card.
    touches: ClassVar[frozenset[str]] = frozenset({NODES, CLUSTER_OPTIONS, LOCAL_MODELS, DOWNLOAD_OPTIONS,
                                                   PLAN_PREVIEW})
    node_id: str
    report: Report
    at: float


class NodeUnreachable(Event):
    kind: Literal["node_unreachable"] = "node_unreachable"
    persisted: ClassVar[bool] = False
    touches: ClassVar[frozenset[str]] = frozenset({NODES, CLUSTER_OPTIONS, LOCAL_MODELS, DOWNLOAD_OPTIONS,
                                                   PLAN_PREVIEW})
    node_id: str
    error: str
    at: float


class NodeDiscovered(Event):
    kind: Literal["node_discovered"] = "node_discovered"
    persisted: ClassVar[bool] = False
    touches: ClassVar[frozenset[str]] = frozenset({NODES})
    node: DiscoveredNode


class NodeVanished(Event):
    kind: Literal["node_vanished"] = "node_vanished"
    persisted: ClassVar[bool] = False
    touches: ClassVar[frozenset[str]] = frozenset({NODES})
    fingerprint: str


class PlanPreviewed(Event):
    kind: Literal["plan_previewed"] = "plan_previewed"
    persisted: ClassVar[bool] = False
    touches: ClassVar[frozenset[str]] = frozenset({CLUSTER_OPTIONS, PLAN_PREVIEW})
    plan: PreviewedPlan  # the planner's Plan or Refusal, with what it was asked for


class PreparationStarted(Event):
    kind: Literal["preparation_started"] = "preparation_started"
    persisted: ClassVar[bool] = False
    touches: ClassVar[frozenset[str]] = frozenset({CLUSTER_OPTIONS, PREPARE_STATUS})
    preparation: Preparation


class PreparationProgressed(Event):
    kind: Literal["preparation_progressed"] = "preparation_progressed"
    persisted: ClassVar[bool] = False
    touches: ClassVar[frozenset[str]] = frozenset({PREPARE_STATUS, LOCAL_MODELS})
    node: NodePreparation


class PreparationFinished(Event):
    kind: Literal["preparation_finished"] = "preparation_finished"
    persisted: ClassVar[bool] = False
    touches: ClassVar[frozenset[str]] = frozenset({CLUSTER_OPTIONS, PREPARE_STATUS, LOCAL_MODELS})
    model_id: str
    error: str = ""


class SessionCreated(Event):
    kind: Literal["session_created"] = "session_created"
    persisted: ClassVar[bool] = True
    touches: ClassVar[frozenset[str]] = frozenset({NODES, CLUSTER_OPTIONS, *SESSION_VIEWS, LOCAL_MODELS, CHAT_MODELS})
    session: Session


class LaunchStepped(Event):
    kind: Literal["launch_stepped"] = "launch_stepped"
    persisted: ClassVar[bool] = True
    touches: ClassVar[frozenset[str]] = frozenset({*SESSION_VIEWS})
    session_id: str
    key: str
    state: StepState
    detail: str = ""


class SessionRegistered(Event):
    kind: Literal["session_registered"] = "session_registered"
    persisted: ClassVar[bool] = True
    touches: ClassVar[frozenset[str]] = frozenset({*SESSION_VIEWS, CHAT_MODELS})
    session_id: str
    registered: bool


class SessionObserved(Event):
    """The watcher's latest look at a session's processes and coordinator; posted only when
    something changed. `sample` is set when the throughput or a step latency did."""

    kind: Literal["session_observed"] = "session_observed"
    persisted: ClassVar[bool] = False
    touches: ClassVar[frozenset[str]] = frozenset({*SESSION_VIEWS, NODES, LOCAL_MODELS})
    session_id: str
    stage_status: tuple[StageStatus, ...]
    sample: Sample | None = None


class SessionFaulted(Event):
    """The watcher saw a running session broken (a stage gone or wedged, the coordinator
    unhealthy). `processes` are the ones to replace ("stage-1", "coordinator"); empty when
    the watcher could not tell, and then only a teardown is left."""

    kind: Literal["session_faulted"] = "session_faulted"
    persisted: ClassVar[bool] = True
    touches: ClassVar[frozenset[str]] = frozenset({*SESSION_VIEWS, CHAT_MODELS})  # the picker: recovering, back
    session_id: str
    reason: str
    processes: tuple[str, ...] = ()
    at: float = 0.0
    relaunch: bool = False  # after a restart every stage was gone: the whole session starts again


class PostMortemRecorded(Event):
    """A recovery kept what was left of the processes it replaced."""

    kind: Literal["post_mortem_recorded"] = "post_mortem_recorded"
    persisted: ClassVar[bool] = True
    touches: ClassVar[frozenset[str]] = frozenset({*SESSION_VIEWS})
    session_id: str
    post_mortems: tuple[PostMortem, ...]


class StageMoved(Event):
    """A recovery restarts a stage on another node (its own node's agent is unreachable): the
    session's record follows — where the stage runs, its cluster TOML — and the timeline says so."""

    kind: Literal["stage_moved"] = "stage_moved"
    persisted: ClassVar[bool] = True
    touches: ClassVar[frozenset[str]] = frozenset({*SESSION_VIEWS, NODES})
    session_id: str
    stage: StagePlacement  # the stage's new placement (same index and layers)
    config_toml: str  # the cluster TOML with its new address
    reason: str = ""  # why it left its node


class StageCopyStarted(Event):
    """A recovery copies the model to the node that takes a moved stage (no node holding it had
    room) before starting it there; the timeline gains the copy's step (its progress follows
    as `LaunchStepped` details)."""

    kind: Literal["stage_copy_started"] = "stage_copy_started"
    persisted: ClassVar[bool] = True
    touches: ClassVar[frozenset[str]] = frozenset({*SESSION_VIEWS})
    session_id: str
    index: int  # the stage
    model_id: str
    node_name: str  # where the copy goes
    sources: tuple[str, ...]  # the names of the nodes it is copied from
    total_bytes: int


class RecoveryFailed(Event):
    """A recovery attempt did not bring the session back (another may follow)."""

    kind: Literal["recovery_failed"] = "recovery_failed"
    persisted: ClassVar[bool] = True
    touches: ClassVar[frozenset[str]] = frozenset({*SESSION_VIEWS, CHAT_MODELS})  # the picker: recovering, back
    session_id: str
    reason: str
    final: bool = False  # no further attempt can help (e.g. the cluster secret is gone)


class SessionRecovered(Event):
    """The replaced processes serve again: Healthy, the router entry back."""

    kind: Literal["session_recovered"] = "session_recovered"
    persisted: ClassVar[bool] = True
    touches: ClassVar[frozenset[str]] = frozenset({*SESSION_VIEWS, CHAT_MODELS})  # the picker: recovering, back
    session_id: str
    seconds: float  # from the fault being seen to Healthy again
    detail: str = ""


class RequestsResumed(Event):
    """After a recovery, the coordinator's record of the answers it held meanwhile (its `/health`
    pause): the fault seen at `fault_at` gains them, and its recovery (numbered `fault` in the timeline,
    as its steps were) a step."""

    kind: Literal["requests_resumed"] = "requests_resumed"
    persisted: ClassVar[bool] = True
    touches: ClassVar[frozenset[str]] = frozenset({*SESSION_VIEWS})
    session_id: str
    fault: int
    fault_at: float  # which fault (its `at`: the numbers shift once the oldest faults are dropped)
    resumed: ResumedRequests


class HealthChanged(Event):
    kind: Literal["health_changed"] = "health_changed"
    persisted: ClassVar[bool] = True
    touches: ClassVar[frozenset[str]] = frozenset({*SESSION_VIEWS, NODES, LOCAL_MODELS, CHAT_MODELS})
    session_id: str
    health: Health
    phase: Phase
    reason: str = ""


class SessionRemoved(Event):
    kind: Literal["session_removed"] = "session_removed"
    persisted: ClassVar[bool] = True
    touches: ClassVar[frozenset[str]] = frozenset({NODES, CLUSTER_OPTIONS, *SESSION_VIEWS, LOCAL_MODELS, CHAT_MODELS})
    session_id: str
    reason: str = ""


class LaunchEnded(Event):
    """A launch did not end serving: it failed at a step (the timeline says which) or was
    cancelled. The session ends (Stopped, failed) and moves to the history; `apply` words the
    reason from its own timeline."""

    kind: Literal["launch_ended"] = "launch_ended"
    persisted: ClassVar[bool] = True
    touches: ClassVar[frozenset[str]] = frozenset({NODES, CLUSTER_OPTIONS, *SESSION_VIEWS, LOCAL_MODELS, CHAT_MODELS})
    session_id: str
    cancelled: bool = False


class CopyCheckStarted(Event):
    """Verify of one node's copy of a model started (the agent hashes every file again)."""

    kind: Literal["copy_check_started"] = "copy_check_started"
    persisted: ClassVar[bool] = False
    touches: ClassVar[frozenset[str]] = frozenset({LOCAL_MODELS})
    model_id: str
    node_id: str


class CopyCheckFinished(Event):
    """Verify ended: every file hashed again matches the reference manifest (`message` says which), or why not."""

    kind: Literal["copy_check_finished"] = "copy_check_finished"
    persisted: ClassVar[bool] = True  # a Verified copy stays Verified across a restart
    touches: ClassVar[frozenset[str]] = frozenset({LOCAL_MODELS, PREPARE_STATUS})
    model_id: str
    node_id: str
    ok: bool
    message: str = ""


class Subscription(queue.Queue):
    """One subscriber's bounded queue, and whether the bus gave up on it.

    A subscriber that fell `maxsize` events behind is dropped; `dropped` tells it so (its queue
    no longer receives anything), and it must start again from a fresh snapshot of the state.
    """

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.dropped = threading.Event()


class EventBus:
    """Fan-out of applied events to subscribers; each gets its own bounded queue.

    A subscriber that stops reading is dropped rather than allowed to block the orchestrator,
    and its `Subscription.dropped` is set so it can resynchronise instead of going quiet.
    """

    def __init__(self, maxsize: int = 1000) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[Subscription] = []
        self._maxsize = maxsize

    def subscribe(self) -> Subscription:
        """A new queue that receives every event published from now on."""
        q = Subscription(self._maxsize)
        with self._lock:
            self._subscribers.append(q)
        return q

    def unsubscribe(self, q: queue.Queue) -> None:
        """Stop delivering to q."""
        with self._lock:
            if q in self._subscribers:
                self._subscribers.remove(q)

    def subscribers(self) -> list[Subscription]:
        """The current subscriptions (a copy)."""
        with self._lock:
            return list(self._subscribers)

    def drop(self, q: Subscription) -> None:
        """Give up on a subscriber: stop delivering to it and tell it so."""
        self.unsubscribe(q)
        q.dropped.set()

    def publish(self, event: Event) -> None:
        """Deliver to every subscriber (non-blocking); one that is full is dropped."""
        for q in self.subscribers():
            try:
                q.put_nowait(event)
            except queue.Full:
                self.drop(q)
