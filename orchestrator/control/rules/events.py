"""Events: what happened, in the past tense. The only way state changes, and what the UI pushes (pure values).

Workers post events to the orchestrator's inbox and `decide` returns them for commands; the
orchestrator applies them (`transitions.apply`) and publishes them to every subscriber
through one `EventBus` (control/bus.py).

Every event class declares, next to its fields, whether the orchestrator saves the state after
it (`persisted`, control/store.py); a test checks every class says. Which dashboard components
an event refreshes is the webapp's table (webapp/touches.py), checked to name every class.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from orchestrator.agent.schemas import Report
from orchestrator.control.rules import download_events, timing_events
from orchestrator.control.rules.event_base import Event as Event  # re-exported: every module names it events.Event
from orchestrator.control.rules.state import (
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

TOPICS = (download_events, timing_events)  # the modules of the other event classes (`event_classes` finds them)


def event_classes() -> tuple[type[Event], ...]:
    """Every concrete event class, the download and timing events included (their modules are imported here)."""
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


class SettingsChanged(Event):
    kind: Literal["settings_changed"] = "settings_changed"
    persisted: ClassVar[bool] = True
    settings: Settings


class NodeRegistered(Event):
    kind: Literal["node_registered"] = "node_registered"
    persisted: ClassVar[bool] = True
    node: Node


class NodeRemoved(Event):
    kind: Literal["node_removed"] = "node_removed"
    persisted: ClassVar[bool] = True
    node_id: str


class NodeReported(Event):
    kind: Literal["node_reported"] = "node_reported"
    persisted: ClassVar[bool] = False
    # The plan card shows the nodes' latest link measurements and loads (views/perf.py): without
    # PLAN_PREVIEW each page kept the figures of whenever it last rendered the card.
    node_id: str
    report: Report
    at: float


class NodeUnreachable(Event):
    kind: Literal["node_unreachable"] = "node_unreachable"
    persisted: ClassVar[bool] = False
    node_id: str
    error: str
    at: float


class NodeDiscovered(Event):
    kind: Literal["node_discovered"] = "node_discovered"
    persisted: ClassVar[bool] = False
    node: DiscoveredNode


class NodeVanished(Event):
    kind: Literal["node_vanished"] = "node_vanished"
    persisted: ClassVar[bool] = False
    fingerprint: str


class PlanPreviewed(Event):
    kind: Literal["plan_previewed"] = "plan_previewed"
    persisted: ClassVar[bool] = False
    plan: PreviewedPlan  # the planner's Plan or Refusal, with what it was asked for


class PreparationStarted(Event):
    kind: Literal["preparation_started"] = "preparation_started"
    persisted: ClassVar[bool] = False
    preparation: Preparation


class PreparationProgressed(Event):
    kind: Literal["preparation_progressed"] = "preparation_progressed"
    persisted: ClassVar[bool] = False
    node: NodePreparation


class PreparationFinished(Event):
    kind: Literal["preparation_finished"] = "preparation_finished"
    persisted: ClassVar[bool] = False
    model_id: str
    error: str = ""


class SessionCreated(Event):
    kind: Literal["session_created"] = "session_created"
    persisted: ClassVar[bool] = True
    session: Session


class LaunchStepped(Event):
    kind: Literal["launch_stepped"] = "launch_stepped"
    persisted: ClassVar[bool] = True
    session_id: str
    key: str
    state: StepState
    detail: str = ""


class SessionRegistered(Event):
    kind: Literal["session_registered"] = "session_registered"
    persisted: ClassVar[bool] = True
    session_id: str
    registered: bool


class SessionObserved(Event):
    """The watcher's latest look at a session's processes and coordinator; posted only when
    something changed. `sample` is set when the throughput or a step latency did."""

    kind: Literal["session_observed"] = "session_observed"
    persisted: ClassVar[bool] = False
    session_id: str
    stage_status: tuple[StageStatus, ...]
    sample: Sample | None = None


class SessionFaulted(Event):
    """The watcher saw a running session broken (a stage gone or wedged, the coordinator
    unhealthy). `processes` are the ones to replace ("stage-1", "coordinator"); empty when
    the watcher could not tell, and then only a teardown is left."""

    kind: Literal["session_faulted"] = "session_faulted"
    persisted: ClassVar[bool] = True
    session_id: str
    reason: str
    processes: tuple[str, ...] = ()
    at: float = 0.0
    relaunch: bool = False  # after a restart every stage was gone: the whole session starts again


class PostMortemRecorded(Event):
    """A recovery kept what was left of the processes it replaced."""

    kind: Literal["post_mortem_recorded"] = "post_mortem_recorded"
    persisted: ClassVar[bool] = True
    session_id: str
    post_mortems: tuple[PostMortem, ...]


class StageMoved(Event):
    """A recovery restarts a stage on another node (its own node's agent is unreachable): the
    session's record follows — where the stage runs, its cluster TOML — and the timeline says so."""

    kind: Literal["stage_moved"] = "stage_moved"
    persisted: ClassVar[bool] = True
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
    session_id: str
    reason: str
    final: bool = False  # no further attempt can help (e.g. the cluster secret is gone)


class SessionRecovered(Event):
    """The replaced processes serve again: Healthy, the router entry back."""

    kind: Literal["session_recovered"] = "session_recovered"
    persisted: ClassVar[bool] = True
    session_id: str
    seconds: float  # from the fault being seen to Healthy again
    detail: str = ""


class RequestsResumed(Event):
    """After a recovery, the coordinator's record of the answers it held meanwhile (its `/health`
    pause): the fault seen at `fault_at` gains them, and its recovery (numbered `fault` in the timeline,
    as its steps were) a step."""

    kind: Literal["requests_resumed"] = "requests_resumed"
    persisted: ClassVar[bool] = True
    session_id: str
    fault: int
    fault_at: float  # which fault (its `at`: the numbers shift once the oldest faults are dropped)
    resumed: ResumedRequests


class HealthChanged(Event):
    kind: Literal["health_changed"] = "health_changed"
    persisted: ClassVar[bool] = True
    session_id: str
    health: Health
    phase: Phase
    reason: str = ""


class SessionRemoved(Event):
    kind: Literal["session_removed"] = "session_removed"
    persisted: ClassVar[bool] = True
    session_id: str
    reason: str = ""


class LaunchEnded(Event):
    """A launch did not end serving: it failed at a step (the timeline says which) or was
    cancelled. The session ends (Stopped, failed) and moves to the history; `apply` words the
    reason from its own timeline."""

    kind: Literal["launch_ended"] = "launch_ended"
    persisted: ClassVar[bool] = True
    session_id: str
    cancelled: bool = False


class CopyCheckStarted(Event):
    """Verify of one node's copy of a model started (the agent hashes every file again)."""

    kind: Literal["copy_check_started"] = "copy_check_started"
    persisted: ClassVar[bool] = False
    model_id: str
    node_id: str


class CopyCheckFinished(Event):
    """Verify ended: every file hashed again matches the reference manifest (`message` says which), or why not."""

    kind: Literal["copy_check_finished"] = "copy_check_finished"
    persisted: ClassVar[bool] = True  # a Verified copy stays Verified across a restart
    model_id: str
    node_id: str
    ok: bool
    message: str = ""
