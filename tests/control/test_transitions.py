"""`apply` as a table: events about sessions nobody knows change nothing, not even the version
(so they are neither persisted nor published); the same events about a known session do."""

from __future__ import annotations

import pytest

from orchestrator.control.rules import events as ev
from orchestrator.control.rules.state import Session, State
from orchestrator.control.rules.transitions import apply

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
    ev.LaunchEnded(session_id="{sid}"),
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


def _launching(failed_step: bool) -> State:
    from orchestrator.control.rules.state import Step

    steps = (Step(key="stage-0.listening", label="Stage 0 transport listening on port 39602", state="done"),
             Step(key="stage-1.listening", label="Stage 1 transport listening on port 39603",
                  state="failed" if failed_step else "running", detail="port 39603 in use"))
    return _known().model_copy(update={"sessions": (_known().sessions[0].model_copy(
        update={"phase": "launching", "timeline": steps}),)})


@pytest.mark.parametrize("failed_step, cancelled, reason", [
    (True, False, "launch failed at “Stage 1 transport listening on port 39603”: port 39603 in use"),
    (False, False, "launch failed"),
    (True, True, "launch cancelled"),
])
def test_a_launch_that_ended_says_why_from_its_own_timeline(failed_step, cancelled, reason):
    new = apply(_launching(failed_step), ev.LaunchEnded(session_id="s1", cancelled=cancelled))
    assert new.sessions == ()
    ended = new.history[-1]
    assert (ended.phase, ended.health, ended.reason) == ("failed", "Stopped", reason)
