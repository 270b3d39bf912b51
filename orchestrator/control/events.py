"""Events: what happened, in the past tense. The only way state changes, and what the UI pushes.

Workers post events to the orchestrator's inbox; the orchestrator applies them
(`transitions.apply`) and publishes them to every subscriber through one `EventBus`.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ..agent.schemas import Report
from .state import (DiscoveredNode, Health, Node, NodePreparation, Phase, PostMortem, Preparation, Sample, Session,
                    Settings, StageStatus, StepState)
from .state import StagePlacement


class Event(BaseModel):
    """Base of all events."""

    model_config = ConfigDict(frozen=True)
    kind: str


class SettingsChanged(Event):
    kind: Literal["settings_changed"] = "settings_changed"
    settings: Settings


class NodeRegistered(Event):
    kind: Literal["node_registered"] = "node_registered"
    node: Node


class NodeRemoved(Event):
    kind: Literal["node_removed"] = "node_removed"
    node_id: str


class NodeReported(Event):
    kind: Literal["node_reported"] = "node_reported"
    node_id: str
    report: Report
    at: float


class NodeUnreachable(Event):
    kind: Literal["node_unreachable"] = "node_unreachable"
    node_id: str
    error: str
    at: float


class NodeDiscovered(Event):
    kind: Literal["node_discovered"] = "node_discovered"
    node: DiscoveredNode


class NodeVanished(Event):
    kind: Literal["node_vanished"] = "node_vanished"
    fingerprint: str


class PlanPreviewed(Event):
    kind: Literal["plan_previewed"] = "plan_previewed"
    model_id: str
    node_ids: tuple[str, ...]
    plan: dict[str, Any]  # the planner's Plan or Refusal, as JSON


class PreparationStarted(Event):
    kind: Literal["preparation_started"] = "preparation_started"
    preparation: Preparation


class PreparationProgressed(Event):
    kind: Literal["preparation_progressed"] = "preparation_progressed"
    node: NodePreparation


class PreparationFinished(Event):
    kind: Literal["preparation_finished"] = "preparation_finished"
    model_id: str
    error: str = ""


class SessionCreated(Event):
    kind: Literal["session_created"] = "session_created"
    session: Session


class LaunchStepped(Event):
    kind: Literal["launch_stepped"] = "launch_stepped"
    session_id: str
    key: str
    state: StepState
    detail: str = ""


class SessionRegistered(Event):
    kind: Literal["session_registered"] = "session_registered"
    session_id: str
    registered: bool


class SessionObserved(Event):
    """The watcher's latest look at a session's processes and coordinator; posted only when
    something changed. `sample` is set when the throughput or a step latency did."""

    kind: Literal["session_observed"] = "session_observed"
    session_id: str
    stage_status: tuple[StageStatus, ...]
    sample: Sample | None = None


class SessionFaulted(Event):
    """The watcher saw a running session broken (a stage gone or wedged, the coordinator
    unhealthy). `processes` are the ones to replace ("stage-1", "coordinator"); empty when
    the watcher could not tell, and then only a teardown is left."""

    kind: Literal["session_faulted"] = "session_faulted"
    session_id: str
    reason: str
    processes: tuple[str, ...] = ()
    at: float = 0.0


class PostMortemRecorded(Event):
    """A recovery kept what was left of the processes it replaced."""

    kind: Literal["post_mortem_recorded"] = "post_mortem_recorded"
    session_id: str
    post_mortems: tuple[PostMortem, ...]


class StageMoved(Event):
    """A recovery restarts a stage on another node (its own node's agent is unreachable): the
    session's record follows — where the stage runs, its cluster TOML — and the timeline says so."""

    kind: Literal["stage_moved"] = "stage_moved"
    session_id: str
    stage: StagePlacement  # the stage's new placement (same index and layers)
    config_toml: str  # the cluster TOML with its new address
    reason: str = ""  # why it left its node


class RecoveryFailed(Event):
    """A recovery attempt did not bring the session back (another may follow)."""

    kind: Literal["recovery_failed"] = "recovery_failed"
    session_id: str
    reason: str
    final: bool = False  # no further attempt can help (e.g. the cluster secret is gone)


class SessionRecovered(Event):
    """The replaced processes serve again: Healthy, the router entry back."""

    kind: Literal["session_recovered"] = "session_recovered"
    session_id: str
    seconds: float  # from the fault being seen to Healthy again
    detail: str = ""


class HealthChanged(Event):
    kind: Literal["health_changed"] = "health_changed"
    session_id: str
    health: Health
    phase: Phase
    reason: str = ""


class SessionRemoved(Event):
    kind: Literal["session_removed"] = "session_removed"
    session_id: str
    reason: str = ""


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
