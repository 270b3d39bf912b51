"""The layer timing a plan's prediction waits for, as an event and its state change (pure).

Timing a model's layers takes seconds on a quiet node and minutes on a busy one (12.5 minutes
once, behind one static line): the plan card says what is timed, on which node, since when
(the page counts the elapsed time: static/live.js), until it ends.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from orchestrator.control.rules.event_base import Event
from orchestrator.control.rules.state import State, TimingRun


class LayerTimingChanged(Event):
    """A node started timing a model's layers (`started_at`), or that timing ended (None)."""

    kind: Literal["layer_timing_changed"] = "layer_timing_changed"
    persisted: ClassVar[bool] = False  # a restarted dashboard times again when a preview asks
    node_id: str
    model_id: str
    started_at: float | None = None


def apply_timing(state: State, e: LayerTimingChanged) -> State:
    """The state with the timing under way, or without it once it ended (pure)."""
    run = TimingRun(node_id=e.node_id, model_id=e.model_id, started_at=e.started_at) \
        if e.started_at is not None else None
    return state.model_copy(update={"timing": run})
