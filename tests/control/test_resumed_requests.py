"""Answers in flight seen and counted after a recovery (issue 37): the coordinator's pause becomes the
recovery's last timeline step ("Recovery 1: 3 requests resumed, 0 lost") and the fault's record.

The rules are pure (`transitions.apply`, `recovery.fault_pause`); `follow_resume` is checked against a
stand-in coordinator whose `/health` pause settles on cue.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler

from orchestrator.control.recovery import PAUSE_SLACK_S, fault_pause, follow_resume
from orchestrator.control.rules import events as ev
from orchestrator.control.rules.audit import event_lines
from orchestrator.control.rules.state import ResumedRequests, Settings, State
from orchestrator.control.rules.transitions import apply
from orchestrator.engine.coordinator.health_report import PauseReport
from orchestrator.proc import SYSTEM_CLOCK
from tests.support.builders import session
from tests.support.stub_http import StubServer

THREE = ResumedRequests(pause="p1", held=3, resumed=3, lost=0, seconds=12.34, ready_s=8.0)


def recovered(at: float = 100.0) -> State:
    """A session whose stage-1 faulted (seen at `at`) and was replaced."""
    s = State(settings=Settings(), sessions=(session(),))
    s = apply(s, ev.SessionFaulted(session_id="s1", reason="stage-1 lost", processes=("stage-1",), at=at))
    return apply(s, ev.SessionRecovered(session_id="s1", seconds=9.0))


def test_the_recovery_ends_with_the_resumed_answers_and_the_fault_keeps_them():
    s = apply(recovered(), ev.RequestsResumed(session_id="s1", fault=1, fault_at=100.0, resumed=THREE)).sessions[0]
    step = s.timeline[-1]
    assert step.label == "Recovery 1: 3 requests resumed, 0 lost" and step.state == "done"
    assert "12.3 s from the stage's loss" in step.detail and "ready again after 8.0 s" in step.detail
    assert s.faults[-1].resumed == THREE


def test_a_lost_answer_fails_the_step_and_one_resumed_answer_is_singular():
    one = THREE.model_copy(update={"held": 2, "resumed": 1, "lost": 1})
    step = apply(recovered(), ev.RequestsResumed(session_id="s1", fault=1, fault_at=100.0,
                                                 resumed=one)).sessions[0].timeline[-1]
    assert (step.label, step.state) == ("Recovery 1: 1 request resumed, 1 lost", "failed")


def test_a_pause_is_reported_once_and_only_on_a_known_fault():
    s = apply(recovered(), ev.RequestsResumed(session_id="s1", fault=1, fault_at=100.0, resumed=THREE))
    assert apply(s, ev.RequestsResumed(session_id="s1", fault=1, fault_at=100.0, resumed=THREE)).sessions == s.sessions
    assert apply(recovered(), ev.RequestsResumed(session_id="s1", fault=1, fault_at=99.0, resumed=THREE)).sessions[0] \
        .faults[-1].resumed is None
    # a second fault whose recovery found the first one's pause (nothing held the second time)
    again = apply(s, ev.SessionFaulted(session_id="s1", reason="stage-0 lost", processes=("stage-0",), at=200.0))
    again = apply(again, ev.SessionRecovered(session_id="s1", seconds=5.0))
    assert apply(again, ev.RequestsResumed(session_id="s1", fault=2, fault_at=200.0,
                                           resumed=THREE)).sessions == again.sessions


def test_the_audit_line_counts_them():
    old = recovered()
    event = ev.RequestsResumed(session_id="s1", fault=1, fault_at=100.0, resumed=THREE)
    [(_, name, fields)] = event_lines(old, apply(old, event), event)
    assert name == "session.requests_resumed" and (fields["held"], fields["resumed"], fields["lost"]) == (3, 3, 0)


def pause(**fields: object) -> PauseReport:
    return PauseReport.model_validate({"id": "p1", "age_s": 20.0, "held": 2, "resumed": 2, "settled": True,
                                       **fields})


def test_a_pause_belongs_to_the_fault_it_began_just_before():
    assert fault_pause(pause(), seen_s_ago=19.0, reported=set()) == pause()
    assert fault_pause(pause(age_s=19.0 + PAUSE_SLACK_S + 1), 19.0, set()) is None  # an earlier fault's
    assert fault_pause(pause(), 19.0, {"p1"}) is None  # another fault reported it
    assert fault_pause(pause(held=0), 19.0, set()) is None
    assert fault_pause(None, 19.0, set()) is None


def test_follow_resume_waits_for_the_pause_to_settle_then_posts_it():
    settled = threading.Event()

    class Coordinator(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            doc = {"status": "ready", "ready": True, "pause": {
                "id": "p9", "age_s": 4.0, "held": 3, "resumed": 3 if settled.is_set() else 1, "lost": 0,
                "settled": settled.is_set(), "ready_s": 2.5, "seconds": 3.5 if settled.is_set() else None}}
            body = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            settled.set()  # the second look finds it settled

        def log_message(self, *args: object) -> None:
            pass

    server = StubServer(Coordinator).start()
    try:
        host, port = server.server_address[:2]
        s = session(coordinator_port=port).model_copy(update={"coordinator_host": host})
        fault = recovered(at=SYSTEM_CLOCK.time() - 3.0).sessions[0].faults[-1]
        s = s.model_copy(update={"faults": (fault,)})
        posted: list[ev.Event] = []
        follow_resume(s, fault, "secret", posted.append, SYSTEM_CLOCK, threading.Event())
    finally:
        server.close()
    [e] = posted
    assert isinstance(e, ev.RequestsResumed) and (e.fault, e.fault_at) == (1, fault.at)
    assert e.resumed == ResumedRequests(pause="p9", held=3, resumed=3, lost=0, seconds=3.5, ready_s=2.5)
