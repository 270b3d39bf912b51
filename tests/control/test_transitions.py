"""`apply` as a table: events about sessions nobody knows change nothing, not even the version
(so they are neither persisted nor published); the same events about a known session do."""

from __future__ import annotations

import pytest

from orchestrator.control import events as ev
from orchestrator.control.state import Session, State
from orchestrator.control.transitions import apply

SESSION_EVENTS = [
    ev.LaunchStepped(session_id="{sid}", key="coordinator.healthy", state="done"),
    ev.SessionRegistered(session_id="{sid}", registered=True),
    ev.SessionObserved(session_id="{sid}", stage_status=()),
    ev.SessionFaulted(session_id="{sid}", reason="stage-1 gone", processes=("stage-1",)),
    ev.PostMortemRecorded(session_id="{sid}", post_mortems=()),
    ev.RecoveryFailed(session_id="{sid}", reason="no"),
    ev.SessionRecovered(session_id="{sid}", seconds=1.0),
    ev.HealthChanged(session_id="{sid}", health="Unhealthy", phase="stopping", reason="x"),
    ev.SessionRemoved(session_id="{sid}"),
]


def _about(event: ev.Event, sid: str) -> ev.Event:
    return event.model_copy(update={"session_id": sid})


@pytest.mark.parametrize("event", SESSION_EVENTS, ids=lambda e: e.kind)
def test_an_event_about_an_unknown_session_changes_nothing(event):
    state = State(version=7)
    assert apply(state, _about(event, "nobody")) is state


def _known() -> State:
    session = Session(id="s1", name="tiny", model_id="m", model_name="m", cluster=True, stages=(),
                      coordinator_node="n", coordinator_host="127.0.0.1", coordinator_port=1)
    return State(version=7, sessions=(session,))


@pytest.mark.parametrize("event", [SESSION_EVENTS[1], SESSION_EVENTS[7], SESSION_EVENTS[8]], ids=lambda e: e.kind)
def test_the_same_event_about_a_known_session_changes_it(event):
    state = _known()
    after = apply(state, _about(event, "s1"))
    assert after is not state and after.version == 8
